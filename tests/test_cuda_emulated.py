"""The CUDA kernels (csrc/cuda) run on the CPU by the SIMT emulator
(tests/emulator/simt_emulator.h) and compared bit for bit with the CPU kernels.

`make cuda-emulate` builds the emulation library (tools/emulate.py: the host
functions of csrc/ops with the CUDA launch code and kernels compiled by the host
compiler, registered as torch.ops.fakequant_emulated.* for CPU tensors) plain,
with AddressSanitizer + UBSan and with ThreadSanitizer, and runs this file
against each; FAKEQUANT_EMULATED_LIB names the library. Without it the file is
skipped.

The emulation library also has a device of its own, "simt" (torch's PrivateUse1 device
type, tests/emulator/simt_device.cpp), whose memory the host can read only during a
kernel launch or a copy: on its tensors the host functions take their device branches,
as on a GPU (the last section of this file). The op table's invalid arguments run on CPU
tensors and on that device.

What the CPU tests cannot reach is checked here: launch geometry, grid-stride
loops (FAKEQUANT_SIMT_SMS=1 caps the grid at 16 blocks of 256 threads, so a few
ten thousand elements take several grid steps), 128-bit vector accesses and
their scalar fallback (inputs at odd offsets), the warp shuffles and ballots
that pack the mask, the block-wise reductions and mask-word atomics, and the
two-stage LSQ reduction. The element rules are shared with the CPU
(contract.h), so any difference is a kernel defect.

LSQ's scale and zero-point gradients are float64 sums in an order of each
backend's own, rounded to float32: they equal the CPU's unless a sum lands
within a few float64 ulps of a float32 rounding boundary, which these fixed
inputs do not; grad_input is exact everywhere.
"""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import fakequant
import op_table
from conftest import DTYPES, assert_same

LIB = os.environ.get("FAKEQUANT_EMULATED_LIB")
pytestmark = pytest.mark.skipif(not LIB, reason="the emulated CUDA kernels run in `make cuda-emulate`")

# The emulated device (tests/emulator/simt_device.cpp): torch's PrivateUse1, named here.
DEVICE = "simt"


def register_device():
    """torch's PrivateUse1 named DEVICE, with the module torch looks up for it (torch.simt)."""
    import types

    module = types.ModuleType(f"torch.{DEVICE}")
    module.is_available = lambda: True
    module.is_initialized = lambda: True
    module._lazy_init = lambda: None
    module.device_count = lambda: 1
    module.current_device = lambda: 0
    module._is_in_bad_fork = lambda: False
    module.manual_seed_all = lambda seed: None  # (no generator of its own: the CPU fallback's)
    torch.utils.rename_privateuse1_backend(DEVICE)
    torch._register_device_module(DEVICE, module)

if LIB:
    import fakequant  # noqa: F401  (the CPU operators)

    torch.ops.load_library(LIB)
    os.environ.setdefault("FAKEQUANT_SIMT_SMS", "1")
    register_device()

# Sizes around every boundary of the element-wise kernels: a warp tile of 32
# (scalar) or 32 * 16 / itemsize (vector) elements, a byte of the packed mask,
# a block of 256 threads, and past one grid of 16 blocks (several grid steps).
SIZES = [0, 1, 7, 8, 9, 31, 32, 33, 255, 256, 257, 1023, 1024, 1025, 4097, 20000, 50001]


def cpu_and_cuda(name, *args):
    """The op on the CPU kernels and on the emulated CUDA kernels: every output
    bit for bit, with the same strides (and a mask of the same storage size)."""
    expected = getattr(torch.ops.fakequant, name)(*args)
    actual = getattr(torch.ops.fakequant_emulated, name)(*args)
    if isinstance(expected, torch.Tensor):
        expected, actual = (expected,), (actual,)
    for a, e in zip(actual, expected, strict=True):
        assert_same(a, e)
        assert a.stride() == e.stride(), (a.stride(), e.stride())
        assert a.untyped_storage().nbytes() == e.untyped_storage().nbytes()
    return actual


def data(n, dtype, spread=4.0, offset=0):
    """n values of `dtype`, about a quarter of them outside the ranges used here,
    with NaN, +-inf and -0.0 among them; a view at element `offset` of its buffer
    when offset > 0 (so not 16-byte aligned)."""
    g = torch.Generator().manual_seed(n * 7 + offset)
    x = torch.randn(n + offset, generator=g, dtype=torch.float64) * spread
    for i, v in enumerate((float("nan"), float("inf"), -float("inf"), -0.0)):
        if n + offset > 97 * (i + 1):
            x[97 * (i + 1)] = v
    return x.to(dtype)[offset:]


def shaped(shape, dtype, spread=4.0):
    n = 1
    for s in shape:
        n *= s
    return data(n, dtype, spread).reshape(shape)


def t(v):
    return torch.tensor(v)


# --- the forward kernels of the affine, min/max and amax families (quantize.cu) -----------


@pytest.mark.parametrize("offset", [0, 1], ids=["aligned", "offset"])
@pytest.mark.parametrize("pack", [True, False], ids=["packed", "bool"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", SIZES)
def test_quantize_sizes(n, dtype, pack, offset):
    x = data(n, dtype, offset=offset)
    cpu_and_cuda("fake_quantize_affine", x, t(0.05), t(3), None, -128, 127, pack)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_quantize_fast_division(dtype):
    # x / s by the scale's reciprocal (contract.h's quotient_of) at the ends of its fast range:
    # scales just inside and outside [2^-60, 2^60], dividends at 2^60 and beyond, subnormal,
    # tiny and zero, each in vectors of otherwise ordinary values (a vector with one dividend
    # out of range divides all of its elements by div_rn).
    x = data(4096, torch.float64)
    specials = [2.0**60, -(2.0**60), 2.0**61, 3e38, 1e-45, -1e-40, 2.0**-100, -(2.0**-101), 1e-30, 0.0, -0.0]
    for i, v in enumerate(specials):
        x[8 * i + 3] = v
    x[1000:1200] *= 1e-20
    x = x.to(dtype)
    for scale in (2.0**-61, 2.0**-60, 1e-30, 3.1e-3, 0.05, 7.0, 2.0**60, 2.0**61, 1e30):
        cpu_and_cuda("fake_quantize_affine", x, t(scale), t(3), None, -128, 127, True)
        amax = t(scale * 127)
        cpu_and_cuda("fake_quantize_amax", x, amax, 8, False, True, False)
        cpu_and_cuda("fake_quantize_fp8", x, t(scale * 448), 4, 3, False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_quantize_zero_amax(dtype):
    # The amax family's zero case (amax at most 2^-24: everything to 0, range [0, 0]) beside
    # specials, signed zeros among them: the zero case must not take the fast division, whose
    # float branch leaves the clamp to the format's own saturation (contract.h's
    # kZeroAmaxScale), per tensor and per channel (rows and table kernels).
    x = data(4096, dtype)
    x[5], x[6], x[7] = -0.0, 0.0, -3e-8
    for amax in (0.0, 1e-30, 2.0**-24, -0.0):
        cpu_and_cuda("fake_quantize_fp8", x, t(amax), 4, 3, False)
        cpu_and_cuda("fake_quantize_fp8", x, t(amax), 5, 2, False)
        cpu_and_cuda("fake_quantize_amax", x, t(amax), 8, False, True, False)
        cpu_and_cuda("quantize_amax", x, t(amax), 8, False, True, False)
    rows = x.reshape(128, 32)
    amax = torch.tensor([0.0, 2.5, 1e-30, 0.7]).repeat(32).reshape(128, 1)
    cpu_and_cuda("fake_quantize_fp8", rows, amax, 4, 3, False)
    cpu_and_cuda("fake_quantize_fp8", rows.t(), amax.reshape(1, 128), 4, 3, False)


# Every per-tensor sample call of the op table (tests/op_table.py) but the stateful
# ones (the fused observer, which updates its buffers: test_fused_observer below).
FAMILIES = {variant.name: (entry, variant) for entry, variant in op_table.variants(
    lambda e, v: v.per_tensor and not e.stateful)}


@pytest.mark.parametrize("offset", [0, 1], ids=["aligned", "offset"])
@pytest.mark.parametrize("n", [33, 5000])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_quantize_families(family, dtype, n, offset):
    entry, variant = FAMILIES[family]
    cpu_and_cuda(entry.name, *variant.args(data(n, dtype, offset=offset)))


def channel_params(x, axis, dtype=torch.float32):
    c = x.shape[axis]
    scale = torch.linspace(0.01, 0.2, c, dtype=dtype)
    zp = torch.arange(c, dtype=torch.int32) % 7 - 3
    return scale, zp


# Per channel along every axis, negative ones too, and other layouts: the
# parameter lookup (a table, rows of the innermost dimension) is CUDA-only.
LAYOUTS = {
    "contiguous": lambda d: shaped((3, 5, 67), d),
    "transposed": lambda d: shaped((67, 5, 3), d).transpose(0, 2),
    "permuted": lambda d: shaped((5, 3, 67), d).permute(1, 0, 2),
    "strided": lambda d: shaped((3, 5, 134), d)[:, :, ::2],
    "offset": lambda d: data(3 * 5 * 67, d, offset=1).reshape(3, 5, 67),
    "channels_last": lambda d: shaped((3, 5, 7, 9), d).contiguous(memory_format=torch.channels_last),
    "expanded": lambda d: shaped((3, 1, 67), d).expand(3, 5, 67),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_quantize_per_channel_every_axis(layout, dtype):
    x = LAYOUTS[layout](dtype)
    for axis in range(-x.dim(), x.dim()):
        scale, zp = channel_params(x, axis)
        for pack in (True, False):
            cpu_and_cuda("fake_quantize_affine", x, scale, zp, axis, -8, 7, pack)
        cpu_and_cuda("fake_quantize_lsq", x, scale, zp.float(), axis, -8, 7, 1.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_quantize_per_channel_fast_division(dtype):
    # The per-channel vector paths: a vector inside one run of a channel (one entry and its
    # Divisor, in line), consecutive entries (channels innermost), vectors across the end of
    # a run, three dimensions, and four (the general lookup); channels whose scale is outside
    # the fast range, and specials among the elements (a vector holding one divides by div_rn).
    scales = torch.tensor([2.0**-61, 2.0**-60, 1e-30, 3.1e-3, 0.05, 7.0, 2.0**60, 2.0**61, 1e30, 0.4])
    for shape in [(40, 96), (37, 41), (4, 30, 64), (3, 5, 7, 16)]:
        x = shaped(shape, torch.float64)
        flat = x.view(-1)
        for i, v in enumerate([2.0**60, -(2.0**61), 3e38, 1e-45, 2.0**-100, 0.0, -0.0]):
            flat[131 * i + 5] = v
        flat[700:900] *= 1e-20
        x = x.to(dtype)
        for axis in range(x.dim()):
            c = x.shape[axis]
            scale = scales.repeat(c // len(scales) + 1)[:c]
            zp = torch.arange(c, dtype=torch.int32) % 5 - 2
            cpu_and_cuda("fake_quantize_affine", x, scale, zp, axis, -128, 127, True)
            view = [1] * x.dim()
            view[axis] = c
            cpu_and_cuda("fake_quantize_amax", x, (scale * 127).reshape(view), 8, False, True)
        if x.dim() == 4:  # parameters over two separate dimensions: four runs, the general lookup
            amax = (scales[:3].reshape(3, 1, 1, 1) * 127 * torch.linspace(0.5, 2, 7).reshape(1, 1, 7, 1))
            cpu_and_cuda("fake_quantize_amax", x, amax, 8, False, True)
            cpu_and_cuda("fake_quantize_min_max", x, -amax, amax * 0.75, 8)


@pytest.mark.parametrize("sms", [1, 132])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_quantize_channels_innermost(dtype, sms, monkeypatch):
    # The last axis per channel (quantize_innermost_kernel: each thread's vectors hold the same
    # channels): channel counts whose vectors per row are odd (12 float32 channels: 3 vectors,
    # the grid a multiple of 96 threads), a power of two, large (more vectors per row than a
    # warp), not a multiple of a vector (the general path); rows that leave the last trip part
    # empty; a grid of 16 blocks (many trips a thread) and a full one; channels whose scale is
    # outside the fast range and specials among the elements; packed and bool masks; a view
    # that is not aligned for vectors; 3-d input and channels_last.
    monkeypatch.setenv("FAKEQUANT_SIMT_SMS", str(sms))
    scales = torch.tensor([3.1e-3, 0.05, 2.0**-61, 7.0, 0.4, 2.0**61, 1e-30, 0.3])
    fast_scales = torch.tensor([3.1e-3, 0.05, 0.7, 7.0, 0.4, 1.5, 0.02, 0.3])
    for rows, c in [(100, 12), (37, 16), (9, 520), (211, 24), (5, 20), (3, 7)]:
        x = shaped((rows, c), torch.float64)
        flat = x.view(-1)
        for i, v in enumerate([2.0**60, -(2.0**61), 3e38, 1e-45, 0.0, -0.0]):
            flat[(97 * i + 5) % flat.numel()] = v
        x = x.to(dtype)
        scale = scales.repeat(c // len(scales) + 1)[:c]
        zp = torch.arange(c, dtype=torch.int32) % 5 - 2
        for pack in (True, False):
            cpu_and_cuda("fake_quantize_affine", x, scale, zp, 1, -128, 127, pack)
        cpu_and_cuda("fake_quantize_amax", x, (scale * 127).reshape(1, c), 8, False, True)
        cpu_and_cuda("fake_quantize_min_max", x, -scale.reshape(1, c), scale.reshape(1, c) * 0.75, 8)
        # every channel's scale in the fast division's range (above, each thread's channels hold
        # one outside it, which sends its vectors to the table's path)
        fast = fast_scales.repeat(c // len(fast_scales) + 1)[:c]
        cpu_and_cuda("fake_quantize_affine", x, fast, zp, 1, -128, 127, True)
        cpu_and_cuda("fake_quantize_amax", x, (fast * 127).reshape(1, c), 8, False, True)
        cpu_and_cuda("fake_quantize_affine", x.reshape(-1)[1:].reshape(-1)[: (rows - 1) * c].reshape(rows - 1, c),
                     scale, zp, 1, -128, 127, True)  # not aligned
        three = x.reshape(1, rows, c).expand(2, rows, c).contiguous()
        cpu_and_cuda("fake_quantize_affine", three, scale, zp, 2, -128, 127, True)
    nchw = shaped((2, 16, 5, 3), torch.float64).to(dtype).contiguous(memory_format=torch.channels_last)
    scale = scales.repeat(2)
    cpu_and_cuda("fake_quantize_affine", nchw, scale, torch.zeros(16, dtype=torch.int32), 1, -128, 127, True)


@pytest.mark.parametrize("sms", [1, 132])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_quantize_rows_in_shared_memory(dtype, sms, monkeypatch):
    # Parameters that are one a run of the innermost dimension (quantize_rows_kernel: each
    # tile's rows made into shared memory): static blocks of 32 (a calibrated amax a block), runs
    # of 12 and 36 (rows across the tiles' ends; 12 float32 elements: more rows in a tile than
    # threads, each making two), 1000 and 4096; runs of 8 float32 elements (more rows in a tile
    # than kTileRows: the table) and of 30 (not whole vectors: the table); three
    # dimensions (channels of NCHW); amax zero, under 2^-24, NaN and infinite (NaN outputs,
    # mask 0, check_values=False) and scales outside the fast division's range among the rows;
    # specials among the elements; the tail after the last whole tile; a grid of 16 blocks
    # (many tiles a block, both shared buffers) and a full one; packed, bool and no mask.
    monkeypatch.setenv("FAKEQUANT_SIMT_SMS", str(sms))
    amaxes = torch.tensor([2.5, 0.0, 1e-30, 0.7, float("nan"), 3e-3, 2.0**70, float("inf"), 2.0**-70, 40.0, 1.5])
    for shape in [(3000, 32), (701, 12), (300, 36), (23, 1000), (5, 4096), (3000, 8), (401, 30), (3, 16, 8, 12)]:
        x = shaped(shape, torch.float64)
        flat = x.view(-1)
        for i, v in enumerate([2.0**60, -(2.0**61), 3e38, 1e-45, 0.0, -0.0]):
            flat[(1237 * i + 5) % flat.numel()] = v
        x = x.to(dtype)
        axis = 1 if x.dim() == 4 else 0
        c = x.shape[axis]
        view = [1] * x.dim()
        view[axis] = c
        amax = amaxes.repeat(c // len(amaxes) + 1)[:c].reshape(view)
        cpu_and_cuda("fake_quantize_amax", x, amax, 8, False, True, False)
        cpu_and_cuda("quantize_amax", x, amax, 4, False, True, False)
        cpu_and_cuda("fake_quantize_fp8", x, amax, 4, 3, False)
        finite = torch.where(amax.isfinite() & (amax > 0), amax, 1.0)
        scale = (finite / 127).flatten()
        zp = torch.arange(c, dtype=torch.int32) % 5 - 2
        for pack in (True, False):
            cpu_and_cuda("fake_quantize_affine", x, scale, zp, axis, -128, 127, pack)
        cpu_and_cuda("fake_quantize_lsq", x, scale, zp.float(), axis, -128, 127, 1.0)
        cpu_and_cuda("fake_quantize_min_max", x, -finite, finite * 0.75, 8)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_quantize_broadcast_amax(layout, dtype):
    x = LAYOUTS[layout](dtype)
    shapes = [[1] * x.dim() for _ in range(x.dim())]
    for d in range(x.dim()):
        shapes[d][d] = x.shape[d]
    shapes.append(list(x.shape[:1]) + [1] * (x.dim() - 2) + list(x.shape[-1:]))  # two dimensions
    shapes.append(list(x.shape))  # one amax per element
    for shape in shapes:
        amax = torch.rand(shape, generator=torch.Generator().manual_seed(len(shape))) * 4 + 0.5
        cpu_and_cuda("fake_quantize_amax", x, amax, 8, False, True)
        cpu_and_cuda("fake_quantize_fp8", x, amax, 4, 3)
        cpu_and_cuda("fake_quantize_min_max", x, -amax, amax * 0.75, 8)


@pytest.mark.parametrize("sms", [1, 3, 132])
def test_quantize_grid_sizes(sms, monkeypatch):
    # The grid capped at 16, 48 or 2112 blocks: the same outputs.
    monkeypatch.setenv("FAKEQUANT_SIMT_SMS", str(sms))
    for dtype in (torch.float32, torch.float16):
        x = data(70001, dtype)
        cpu_and_cuda("fake_quantize_affine", x, t(0.05), t(3), None, -128, 127, True)
        x = shaped((7, 10001), dtype)
        scale, zp = channel_params(x, 0)
        cpu_and_cuda("fake_quantize_affine", x, scale, zp, 0, -128, 127, True)


# --- mask_backward (mask_backward.cu) -------------------------------------------------------------


@pytest.mark.parametrize("offset", [0, 1], ids=["aligned", "offset"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", SIZES)
def test_mask_backward(n, dtype, offset):
    x = data(n, torch.float32)
    _, packed = torch.ops.fakequant.fake_quantize_affine(x, t(0.05), t(0), None, -128, 127, True)
    _, boolean = torch.ops.fakequant.fake_quantize_affine(x, t(0.05), t(0), None, -128, 127, False)
    grad = data(n, dtype, offset=offset)
    cpu_and_cuda("mask_backward", grad, packed)
    cpu_and_cuda("mask_backward", grad, boolean)
    if n > 1:  # a bool mask at an odd offset (no vector access for it)
        cpu_and_cuda("mask_backward", grad[1:], boolean[1:])


def test_mask_backward_layouts():
    for layout in sorted(LAYOUTS):
        grad = LAYOUTS[layout](torch.float32)
        _, packed = torch.ops.fakequant.fake_quantize_affine(grad, t(0.05), t(0), None, -8, 7, True)
        _, boolean = torch.ops.fakequant.fake_quantize_affine(grad, t(0.05), t(0), None, -8, 7, False)
        cpu_and_cuda("mask_backward", grad, packed)
        cpu_and_cuda("mask_backward", grad, boolean)


# --- block-wise (blockwise.cuh) -------------------------------------------------------------------

ELEMENTS = {  # (num_bits, unsigned, narrow_range, exponent_bits, two-level, e8m0_scale, centered)
    "int8": (8, False, True, 0, False, False, False),
    "uint4": (4, True, False, 0, False, False, False),
    "fp8_e4m3": (8, False, True, 4, False, False, False),
    "fp8_e5m2": (8, False, True, 5, False, False, False),
    "fp6_e3m2": (6, False, True, 3, False, False, False),
    "fp6_e2m3": (6, False, True, 2, False, False, False),
    "fp4_e2m1": (4, False, True, 2, False, False, False),
    "nvfp4": (4, False, True, 2, True, False, False),
    # the OCP microscaling formats: E8M0 block scales
    "mxfp8": (8, False, True, 4, False, True, False),
    "mxfp6": (6, False, True, 3, False, True, False),
    "mxfp4": (4, False, True, 2, False, True, False),
    "mxint8": (8, False, False, 0, False, True, False),
    # blocks quantized about their centre (per-token asymmetric)
    "centered_int8": (8, False, False, 0, False, False, True),
    "centered_fp8": (8, False, True, 4, False, False, True),
    "centered_mxfp4": (4, False, True, 2, False, True, True),
}
# Block sizes that divide 32, that 32 divides, neither, and long blocks (a
# thread block each from 1024 on).
BLOCK_SIZES = [1, 2, 4, 8, 16, 32, 3, 7, 24, 33, 48, 64, 96, 128, 129, 200, 1024, 1500, 2048]


def blockwise(x, block_size, element):
    num_bits, unsigned, narrow, ebits, two_level, e8m0, centered = ELEMENTS[element]
    scale_amax = x.detach().abs().float().nan_to_num(0, 0, 0).amax().reshape(1) if two_level else None
    return cpu_and_cuda("fake_quantize_blockwise", x, block_size, num_bits, unsigned, narrow, ebits, scale_amax,
                        True, e8m0, centered)


@pytest.mark.parametrize("ragged", [False, True], ids=["whole", "ragged"])
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_blockwise_block_sizes(block_size, ragged):
    # rows of two blocks, or of two and a shorter one (a ragged last block)
    last = 2 * block_size + (max(1, block_size // 3) if ragged else 0)
    for element in ("int8", "fp4_e2m1", "mxfp4", "centered_int8"):
        x = shaped((3, last), torch.float32)
        y, mask = blockwise(x, block_size, element)
        assert mask.untyped_storage().nbytes() == (x.numel() + 7) // 8


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("element", sorted(ELEMENTS))
@pytest.mark.parametrize("block_size", [16, 32, 48, 1024])
def test_blockwise_elements(block_size, element, dtype):
    blockwise(shaped((3, 2 * block_size), dtype), block_size, element)
    blockwise(shaped((3, 2 * block_size + 5), dtype), block_size, element)


@pytest.mark.parametrize("block_size", [1, 16, 24, 32, 1024, 1500])
def test_blockwise_several_grid_steps(block_size):
    # About 2.5 times the blocks that the capped grid (16 thread blocks, 128
    # warps of 32 / G groups) takes in one step.
    # (each thread block takes one long block: 20 or 27 of them is two steps)
    group = 1 << max(0, block_size - 1).bit_length() if block_size < 32 else 32
    rows = 9 if block_size >= 1024 else 288 * (32 // group)
    for last, n in ((block_size, rows if block_size < 1024 else 20), (block_size * 2 + 3, rows)):
        x = data(n * last, torch.float32).reshape(n, last)
        blockwise(x, block_size, "int8")


def vector_trip(block_size, dtype):
    """Elements one warp's trip of blockwise_vector_kernel covers: 32 lanes of K 16-byte vectors,
    K = 4 for blocks of 2 or 4 vectors, 8 above (1 where a block is less than two vectors: the
    scalar kernel's)."""
    vec = 16 // torch.empty((), dtype=dtype).element_size()
    lanes = block_size // vec
    return 32 * (1 if lanes < 2 else max(4, min(lanes, 8))) * vec


def vector_blocks(rows, block_size, dtype, offset):
    """rows blocks of data: blocks of zeros (degenerate), of subnormals and of values below the
    tiny-amax epsilon, of one sign, and data's +-inf and NaN."""
    x = data(rows * block_size, dtype, offset=offset).reshape(rows, block_size)
    x[1] = 0.0
    x[2] = torch.linspace(-1e-40, 1e-40, block_size, dtype=torch.float64).to(dtype)
    x[3] = torch.linspace(-3e-8, 2e-8, block_size, dtype=torch.float64).to(dtype)
    x[4] = x[4].abs()
    return x


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("block_size", [4, 8, 16, 32, 128, 256, 1024, 4096])
def test_blockwise_vectors(block_size, dtype):
    # Whole blocks in 16-byte aligned memory: a power-of-two number of vectors a block, up to a
    # warp's (blockwise_vector_kernel): three whole trips and three quarters of a fourth and one
    # block (blocks of two vectors, 64 a trip: the fourth's lanes 0-15 hold a second block, lanes
    # 16-31 none), every element format; long blocks of whole mask words
    # (blockwise_long_vector_kernel), five of them; then the same at an odd offset (the scalar
    # kernels).
    long = block_size >= 1024
    if long and dtype == torch.float64:
        pytest.skip("float64 has no vector kernels")
    rows = 5 if long else max(5, 15 * vector_trip(block_size, dtype) // block_size // 4 + 1)
    for offset in (0, 1):
        x = vector_blocks(rows, block_size, dtype, offset)
        if long:  # (a long block's rule is the short one's: a few formats, the scalar kernel once)
            elements = ("int8", "nvfp4", "mxfp8", "centered_int8", "centered_fp8") if offset == 0 else ("centered_int8",)
        else:
            elements = ("int8", "uint4", "fp8_e4m3", "fp8_e5m2", "fp6_e3m2", "fp4_e2m1", "nvfp4", "mxfp8", "mxfp6",
                        "mxfp4", "mxint8", "centered_int8")
        for element in elements:
            blockwise(x, block_size, element)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_blockwise_long_rows_held_and_read_twice(dtype):
    # Long blocks of whole mask words in aligned memory: a warp a block for whole steps of the
    # warp's vectors up to 16 (2048 float32 or 4096 16-bit elements), else held in registers up
    # to 8 steps of the thread block's vectors (8192 float32 or 16384 16-bit elements), read
    # twice beyond: the lengths on either side of each, a partial step of either.
    vec = 16 // torch.tensor([], dtype=dtype).element_size()
    step, warp_step = 256 * vec, 32 * vec
    for block_size in (1024 + 32, 16 * warp_step - 32, 16 * warp_step, 16 * warp_step + warp_step,
                       8 * step - 32, 8 * step, 8 * step + 32, 12 * step):
        x = vector_blocks(5, block_size, dtype, 0)
        for element in ("int8", "centered_int8", "nvfp4"):
            blockwise(x, block_size, element)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_blockwise_long_rows_warps_grid_steps(dtype):
    # A warp a row over about 2.5 steps of the capped grid (128 warps): rows of 1024 elements,
    # each warp's rows blockIdx * 8 + warp, plus 8 * gridDim each step.
    x = data(323 * 1024, dtype).reshape(323, 1024)
    for element in ("centered_int8", "int8"):
        blockwise(x, 1024, element)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_blockwise_long_rows_warp_groups(dtype):
    # Rows of whole steps of two or four warps' vectors, more than a smaller group holds (9 and 16
    # of their steps), integer and E4M3 blocks: two or four warps a row, the max through shared
    # memory; then the same rows over about 2.5 steps of the capped grid (16 thread blocks of 4
    # or 2 groups), whose last round leaves groups without a row, and the degenerate rows'
    # second pass (vector_blocks' zeros and tiny rows); NVFP4's blocks take the thread block.
    warp_step = 32 * (16 // torch.tensor([], dtype=dtype).element_size())
    for warps in (2, 4):
        for steps in (9, 16):
            block_size = warps * warp_step * steps
            x = vector_blocks(5, block_size, dtype, 0)
            for element in ("int8", "centered_int8", "centered_fp8", "nvfp4"):
                blockwise(x, block_size, element)
        rows = 5 * 16 * (8 // warps) // 2 + 3
        x = vector_blocks(rows, warps * warp_step * 9, dtype, 0)
        for element in ("centered_int8", "fp8_e4m3"):
            blockwise(x, warps * warp_step * 9, element)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_blockwise_long_rows_keys(dtype):
    # The rows' keys of blockwise_long_vector_kernel (RowKeys: bfloat16's on 16-bit pairs) for
    # centered and plain rows: both signs (the fast pass), all negative, a negative NaN alone,
    # -inf and +inf, -0.0 and +0.0 only (degenerate), one number among zeros, the largest
    # magnitude in the last vector. (Threads with nothing to add: the held rows' test above.)
    n = 256 * (16 // torch.tensor([], dtype=dtype).element_size())  # a step
    x = data(8 * n, dtype, spread=1.0).reshape(8, n).nan_to_num(0.0, 0.0, 0.0)
    x[1] = -x[1].abs() - 0.5
    # a quiet NaN with its sign bit set, by its bits (conversions make NaNs positive)
    bits = {torch.float32: (torch.int32, -0x400000), torch.bfloat16: (torch.int16, -0x40),
            torch.float16: (torch.int16, -0x200)}[dtype]
    x.view(bits[0])[2, 7] = bits[1]
    x[3, 0], x[3, n - 1] = -float("inf"), float("inf")
    x[4] = 0.0
    x[4, ::2] = -0.0
    x[5] = 0.0
    x[5, n // 2 + 3] = -3.0
    x[6, n - 1] = -40.0
    x[7, n - 1] = 40.0
    assert torch.signbit(x[2, 7]) and bool(x[2, 7].isnan())
    for element in ("centered_int8", "int8", "centered_fp8"):
        blockwise(x, n, element)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_blockwise_vectors_grid_steps(dtype):
    # About 2.5 steps of the capped grid (128 warps) of trips, in NVFP4's blocks of 16 elements.
    rows = 5 * 128 * vector_trip(16, dtype) // (2 * 16) + 3
    x = vector_blocks(rows, 16, dtype, 0)
    blockwise(x, 16, "nvfp4")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_blockwise_vectors_inside_the_limit(dtype):
    # NVFP4 with scale_amax = 6 * 448 (the per-tensor scale g = 1, block scales plain E4M3 values):
    # trips whose blocks all have RN(amax / s) below E2M1's saturation limit 7 take the kernel's
    # rule without saturation or mask tests (Trip::kFast's inside trips); a trip with one block
    # at or past it takes the full rule (Trip::kSaturating). Each trip below but the first holds
    # one such block: amax 7 * 2^-8, whose subnormal E4M3 scale 2^-8 puts its largest quotient
    # on the limit itself (7: saturates to 6, where the grid alone would give 8); amax 5000,
    # above scale_amax (scale clamped to 448, quotients past 7: mask bits 0); amax 0.028, a
    # subnormal scale again (2 * 2^-9: quotient 7.2). They sit at blocks 5, per_trip / 2 + 5
    # and per_trip - 3 of their trips: in bfloat16 (blocks of two vectors, 64 a trip) the last
    # two are a lane's second block (lane 5's and lane 29's), which must vote as its first does.
    per_trip = vector_trip(16, dtype) // 16
    x = data(4 * per_trip * 16, dtype, spread=1.0).reshape(4 * per_trip, 16).nan_to_num(0.0, 0.0, 0.0)
    x[:, 0] = 2.0  # (every block's amax at least 2: scales well inside E4M3's normal range)
    at = {1: per_trip + 5, 2: 2 * per_trip + per_trip // 2 + 5, 3: 4 * per_trip - 3}
    for trip, top in ((1, 7 * 2**-8), (2, 5000.0), (3, 0.028)):
        x[at[trip]].copy_(torch.linspace(-top, top, 16, dtype=torch.float64).to(dtype))
    scale_amax = torch.tensor([6.0 * 448.0])
    y, mask = cpu_and_cuda("fake_quantize_blockwise", x, 16, 4, False, True, 2, scale_amax, True, False, False)
    bits = fakequant.unpack_mask(mask, y)
    assert bool(bits[:per_trip].all()) and not bool(bits[at[2]].all())
    # the blocks past the limit saturate: 7 * 2^-8 to 6 * 2^-8 (not 8 * 2^-8), 5000 to 6 * 448
    assert y[at[1]].abs().max().item() == 6 * 2**-8
    assert y[at[2]].abs().max().item() == 6 * 448


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_blockwise_vectors_inside_the_limit_zero_signs(dtype):
    # NVFP4's inside trips divide without copying x's sign onto the quotient and round with x's
    # sign (contract.h's blockwise_inside_value): -0.0 (whose quotient is +0 where the scale's
    # y_lo is negative: every E4M3 value but the powers of two, whose y_lo is 0), tiny elements
    # of either sign and small ones that round to zeros, in blocks of a dozen scales; then the
    # same under a per-tensor scale g = 0.7 (block scales E4M3 values times g).
    per_trip = vector_trip(16, dtype) // 16
    g = torch.Generator().manual_seed(11)
    x = torch.rand(4 * per_trip, 16, generator=g, dtype=torch.float64) * 4 - 2
    x[:, 0] = 2.0 + 3.0 * torch.rand(4 * per_trip, generator=g, dtype=torch.float64)  # scales E4M3(amax / 6)
    for column, v in enumerate((-0.0, 0.0, -1e-30, 1e-30, -1e-39, 1e-39, -0.05, 0.05), start=1):
        x[:, column] = v
    x = x.to(dtype)
    scales = {float(fakequant.ops.fake_quantize_fp8(torch.tensor(a / 6.0), torch.tensor(448.0))) for a in
              x[:, 0].float().tolist()}
    y_lo_signs = set()
    for s in scales:  # (the sign of y_lo is that of 1 - s * y: exact in float64, s and y being float32)
        y = float(torch.tensor(1.0 / s, dtype=torch.float32))
        y_lo_signs.add((1.0 - s * y > 0) - (1.0 - s * y < 0))
    assert len(scales) >= 8 and -1 in y_lo_signs
    for scale_amax in (6.0 * 448.0, 0.7 * 6.0 * 448.0):
        y, mask = cpu_and_cuda("fake_quantize_blockwise", x, 16, 4, False, True, 2, torch.tensor([scale_amax]), True,
                               False, False)
        assert bool(fakequant.unpack_mask(mask, y).all())  # every trip inside the limit
        assert bool((y[:, 1:9:2] == 0).all() and y[:, 1:9:2].signbit().all() and not y[:, 2:10:2].signbit().any())


def test_blockwise_long_row():
    # One block of a row of 70,000 elements: a thread block, not one warp.
    x = data(70000, torch.float32).reshape(1, 70000)
    blockwise(x, 70000, "int8")
    blockwise(x, 30000, "nvfp4")  # two blocks of 30,000 and a ragged one of 10,000
    blockwise(x, 70000, "centered_int8")
    blockwise(x, 30000, "mxfp8")


@pytest.mark.parametrize("block_size", [16, 33, 1024])
def test_blockwise_layouts(block_size):
    x = shaped((2, 3, 2 * block_size + 1), torch.float32)
    for view in (x, x[1:], x.transpose(0, 1), x[:, :, 1:], data(x.numel(), torch.float32, offset=1).reshape(x.shape),
                 x.reshape(-1)[: 2 * block_size + 9]):
        blockwise(view, block_size, "int8")
    blockwise(torch.tensor(1.5), 4, "int8")  # 0-d


# --- llama.cpp's Q8_0/Q4_0 blocks (ggml.cu) ------------------------------------------------------------

GGML_TYPES = {"q8_0": 8, "q4_0": 4}


def ggml_trip(block_size, dtype):
    """Elements one warp's trip of ggml_vector_kernel covers: 32 lanes of K 16-byte vectors,
    K = min(vectors a block, 4)."""
    vec = 16 // torch.empty((), dtype=dtype).element_size()
    return 32 * max(1, min(block_size // vec, 4)) * vec


@pytest.mark.parametrize("kind", GGML_TYPES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("block_size", [2, 4, 8, 16, 32, 64, 128, 256, 512])
def test_ggml_vectors(block_size, dtype, kind):
    # Whole blocks in aligned memory (ggml_vector_kernel where a block is 1 to 32 vectors): the
    # corner-case blocks of tests/test_ggml.py, then random blocks to three whole trips and one
    # block of a fourth; then the same at an odd offset (ggml_kernel).
    from test_ggml import hard_blocks

    hard = hard_blocks(block_size).to(dtype)
    rows = max(3, 3 * ggml_trip(block_size, dtype) // block_size + 1)
    for offset in (0, 1):
        x = torch.cat([hard, data(rows * block_size, dtype).reshape(rows, block_size)])
        if offset:
            x = data(x.numel() + 1, dtype)[1:].copy_(x.reshape(-1)).reshape(x.shape)
        cpu_and_cuda("fake_quantize_ggml", x, block_size, GGML_TYPES[kind])


@pytest.mark.parametrize("kind", GGML_TYPES)
@pytest.mark.parametrize("block_size", [1, 3, 7, 24, 32, 33, 100, 1500])
def test_ggml_ragged_rows(block_size, kind):
    # rows of two blocks and a short one, rows shorter than a block, one row of many
    from test_ggml import hard_blocks

    for shape in ((3, 2 * block_size + max(1, block_size // 3)), (5, max(1, block_size // 2 + 1)), (1, 4099)):
        cpu_and_cuda("fake_quantize_ggml", shaped(shape, torch.float32), block_size, GGML_TYPES[kind])
    hard = hard_blocks(32)[:, : max(1, min(block_size, 32))]
    cpu_and_cuda("fake_quantize_ggml", hard.float(), block_size, GGML_TYPES[kind])


@pytest.mark.parametrize("kind", GGML_TYPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_ggml_grid_steps(dtype, kind):
    # About 2.5 steps of the capped grid (128 warps) of GGUF's blocks of 32, and of ragged rows
    rows = 5 * 128 * ggml_trip(32, dtype) // (2 * 32) + 3
    cpu_and_cuda("fake_quantize_ggml", data(rows * 32, dtype).reshape(rows, 32), 32, GGML_TYPES[kind])
    cpu_and_cuda("fake_quantize_ggml", data(300 * 33, dtype).reshape(300, 33), 32, GGML_TYPES[kind])


def test_ggml_layouts():
    x = shaped((2, 3, 65), torch.float32)
    for view in (x, x[1:], x.transpose(0, 1), x[:, :, 1:], x.reshape(-1)[:41], torch.tensor(-1.5)):
        for bits in GGML_TYPES.values():
            cpu_and_cuda("fake_quantize_ggml", view, 32, bits)


# --- the LSQ backward (lsq_backward.cu) ------------------------------------------------------------


def lsq_backward(x, axis, dtype, qmin=-8, qmax=7, zero_point_float=True):
    if axis is None:
        scale, zp = t(0.3), t(1.0 if zero_point_float else 1)
    else:
        scale, zp = channel_params(x, axis)
        scale = scale * 3
        if zero_point_float:  # LSQ+: a float zero point (holding integers)
            zp = zp.float()
    grad = data(x.numel(), x.dtype, spread=1.0).reshape(x.shape)
    return cpu_and_cuda("fake_quantize_lsq_backward", grad, x, scale, zp, axis, qmin, qmax, 0.75)


@pytest.mark.parametrize("offset", [0, 1], ids=["aligned", "offset"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [1, 7, 33, 1025, 5000, 70001])
def test_lsq_backward_per_tensor(n, dtype, offset):
    lsq_backward(data(n, dtype, offset=offset), None, dtype)


# Per channel: rows (inner >= 32, outer 1 or more, chunks split across warps)
# and columns (inner < 32, as channels_last).
LSQ_CASES = {
    "rows_outer": ((4, 8, 40), 1),
    "rows_no_outer": ((5, 64), 0),
    "rows_split": ((3, 5000), 0),
    "rows_vector_tail": ((4, 3, 36), 1),
    "columns_last_axis": ((300, 6), -1),
    "columns_inner3": ((70, 5, 3), 1),
    "columns_wide": ((20, 300), 1),
    "columns_many_rows": ((9000, 4), 1),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", sorted(LSQ_CASES))
def test_lsq_backward_per_channel(case, dtype):
    shape, axis = LSQ_CASES[case]
    lsq_backward(shaped(shape, dtype), axis, dtype)
    lsq_backward(shaped(shape, dtype), axis, dtype, zero_point_float=False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_lsq_backward_layouts(dtype):
    x = shaped((4, 6, 5, 7), dtype)
    lsq_backward(x.contiguous(memory_format=torch.channels_last), 1, dtype)
    lsq_backward(x.transpose(1, 3), 3, dtype)
    lsq_backward(data(x.numel(), dtype, offset=1).reshape(x.shape), 1, dtype)
    lsq_backward(x[:, :, ::2], 1, dtype)


# fused_moving_avg_obs_fake_quant: the observer kernel (a thread per channel, past one
# block of 256 channels too) updating the buffers in place, then the quantize kernel.
FUSED_CASES = {
    "per_tensor": ((50001,), False, 0, False),
    "per_tensor_symmetric": ((64, 33), False, 0, True),
    "channels_rows": ((300, 40), True, 0, False),
    "channels_axis1": ((7, 260, 3), True, 1, True),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", sorted(FUSED_CASES))
def test_fused_observer(case, dtype):
    shape, per_row, axis, symmetric = FUSED_CASES[case]
    n = shape[axis] if per_row else 1
    buffers = {name: [torch.full((n,), float("inf")), torch.full((n,), float("-inf")), torch.ones(n),
                      torch.zeros(n, dtype=torch.int32)] for name in ("fakequant", "fakequant_emulated")}
    for step, (observe, quantize) in enumerate([(1, 1), (1, 0), (0, 1), (1, 1)]):
        x = shaped(shape, dtype).nan_to_num(0.0, 5.0, -5.0) * (1 + step) + 0.25 * step
        flags = torch.tensor([observe]), torch.tensor([quantize])
        out = {name: getattr(torch.ops, name).fused_moving_avg_obs_fake_quant(
            x, *flags, *bufs, 0.01, -128 if symmetric else 0, 127 if symmetric else 255, axis, per_row, symmetric)
            for name, bufs in buffers.items()}
        for a, e in zip(out["fakequant_emulated"], out["fakequant"], strict=True):
            assert_same(a, e)
        for a, e in zip(buffers["fakequant_emulated"], buffers["fakequant"], strict=True):
            assert_same(a, e)


# --- invalid arguments, and the emulated device ("simt") -------------------------------------------
# The host functions of the emulation library are those of the real build: the op table's
# invalid arguments (tests/op_table.py) raise there as in fakequant._C, on CPU tensors
# (the host functions' CPU branches) and on the emulated device, where the host functions
# take their device branches, as on CUDA: a parameter on another device than the input is an
# error, and parameter values are checked only with FAKEQUANT_CHECK_VALUES=1 (read once per
# process: a child process here); without it an invalid value gives NaN and a zero mask.
# (Cases with a meta tensor are left out: they reach the Python fake kernels, not C++.)

def _reaches_host_code(case, entry):
    """Not a case with a meta tensor: the dispatcher sends those to the fake kernels
    (fakequant/ops, Python, tested by tests/test_errors.py), never to a host function."""
    return not any(isinstance(a, torch.Tensor) and a.device.type == "meta"
                   for a in case.arguments(entry.invalid_base()))


INVALID = [(e, c) for e, c in op_table.invalid_cases() if _reaches_host_code(c, e)]
INVALID_METADATA = [p for p in INVALID if not p[1].value]
INVALID_VALUES = [p for p in INVALID if p[1].value]


def emulated(entry):
    return getattr(torch.ops.fakequant_emulated, entry.name)


def on_device(args):
    return [op_table.to_device(a, DEVICE) for a in args]


@pytest.mark.parametrize("entry,case", INVALID, ids=op_table.invalid_ids(INVALID))
def test_invalid_arguments(entry, case):
    with pytest.raises(case.exc, match=case.match):
        emulated(entry)(*case.arguments(entry.invalid_base()))


@pytest.mark.parametrize("entry,case", INVALID_METADATA, ids=op_table.invalid_ids(INVALID_METADATA))
def test_invalid_arguments_on_device(entry, case):
    with pytest.raises(case.exc, match=case.match):
        emulated(entry)(*on_device(case.arguments(entry.invalid_base())))


@pytest.mark.parametrize("entry,case", INVALID_VALUES, ids=op_table.invalid_ids(INVALID_VALUES))
def test_invalid_values_on_device_give_nan(entry, case):
    """Without FAKEQUANT_CHECK_VALUES the device path does not read parameter values: NaN
    outputs and a zero mask (docs/cuda.md, value checks)."""
    y, mask = emulated(entry)(*on_device(case.arguments(entry.invalid_base())))
    assert y.device.type == DEVICE and mask.device.type == DEVICE
    assert bool(y.cpu().isnan().all()), y.cpu()
    assert not bool(mask.cpu().any())


def run_child(code, **env):
    """`code` in a child process with this one's emulation library (a crash fails here)."""
    child = dict(os.environ, **env)
    # (importing this file loads the library named by FAKEQUANT_EMULATED_LIB and names the device)
    prologue = (f"import sys; sys.path.insert(0, {os.path.dirname(__file__)!r})\n"
                "import torch, pytest, op_table, test_cuda_emulated\n")
    return subprocess.run([sys.executable, "-c", prologue + textwrap.dedent(code)], env=child,
                          capture_output=True, text=True, timeout=300)


def test_invalid_values_on_device_raise_with_checks_on():
    run = run_child("""
        cases = [(e, c) for e, c in op_table.invalid_cases() if c.value]
        for entry, case in cases:
            args = [op_table.to_device(a, "simt") for a in case.arguments(entry.invalid_base())]
            with pytest.raises(case.exc, match=case.match):
                getattr(torch.ops.fakequant_emulated, entry.name)(*args)
        print("raised", len(cases))
        """, FAKEQUANT_CHECK_VALUES="1")
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"raised {len(INVALID_VALUES)}" in run.stdout


def test_mixed_devices_raise():
    """What test_metadata_errors_on_cuda asks of CUDA (where the first GPU run crashed)."""
    ops = torch.ops.fakequant_emulated
    x = torch.randn(4, 3, 5).to(DEVICE)
    d = {"device": DEVICE}
    with pytest.raises(ValueError, match="scale"):
        ops.fake_quantize_affine(x, torch.ones(4, **d), torch.zeros(4, **d), 1, -128, 127)
    with pytest.raises(ValueError, match="scale"):
        ops.fake_quantize_affine(x, torch.ones(1), torch.zeros(1, **d), None, -128, 127)  # CPU scale
    with pytest.raises(ValueError, match="zero_point"):
        ops.fake_quantize_affine(x, torch.ones(1, **d), torch.zeros(1), None, -128, 127)  # CPU zero point
    with pytest.raises(ValueError, match="input"):
        ops.fake_quantize_amax(torch.randn(3), torch.tensor(1.0, **d), 8, False, True)  # CPU input
    with pytest.raises(ValueError, match="amax"):
        ops.fake_quantize_amax(x, torch.ones(2, 1, **d), 8, False, True)
    with pytest.raises(TypeError, match="input"):
        ops.fake_quantize_amax(x.int(), torch.tensor(1.0, **d), 8, False, True)
    with pytest.raises(ValueError, match="mask"):
        ops.mask_backward(x, torch.zeros(2, dtype=torch.uint8, **d))
    with pytest.raises(ValueError, match="mask"):
        ops.mask_backward(x, torch.zeros(8, dtype=torch.uint8))  # CPU mask
    with pytest.raises(ValueError, match="grad"):
        ops.fake_quantize_lsq_backward(torch.ones(4, 3, 5), x, torch.ones(1, **d), torch.zeros(1, **d), None,
                                       -8, 7, 1.0)  # CPU grad


# Every sample call of the op table on the emulated device, against the CPU kernels: the
# host functions' device branches (the device scope, no value checks, the fused observer's
# flags read on the device) with memory the host cannot read outside a launch.
DEVICE_CALLS = op_table.variants()


@pytest.mark.parametrize("layout", ["contiguous", "sliced"])
@pytest.mark.parametrize("entry,variant", DEVICE_CALLS, ids=op_table.variant_ids(DEVICE_CALLS))
def test_table_calls_on_device(entry, variant, layout):
    x = op_table.sample_input(layout, torch.float32)
    cpu_args = variant.args(x)
    dev_args = on_device(cpu_args)
    expected, actual = entry.op(*cpu_args), emulated(entry)(*dev_args)
    if isinstance(expected, torch.Tensor):
        expected, actual = (expected,), (actual,)
    for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
        assert a.device.type == DEVICE, (i, a.device)
        if i in entry.reduced_outputs:
            torch.testing.assert_close(a.cpu(), e, rtol=1e-6, atol=0, equal_nan=True)
        else:
            assert_same(a, e)
            assert a.stride() == e.stride(), (i, a.stride(), e.stride())
    if entry.stateful:  # the buffers it updated in place
        for a, e in zip(dev_args[1:], cpu_args[1:]):
            if isinstance(e, torch.Tensor):
                assert_same(a, e)


def test_device_memory_is_not_host_memory():
    """The emulated device's memory faults when the host reads it outside device work, and
    the fault names the allocation: a host function reading a device parameter in place
    (not through a copy) ends the run, as it would read garbage or crash on a GPU."""
    run = run_child("""
        import ctypes
        x = torch.arange(8.0).to("simt")
        assert x.cpu().tolist() == list(range(8))  # a copy: device work
        print("read", ctypes.c_float.from_address(x.data_ptr() + 4).value, flush=True)
        """)
    assert run.returncode != 0, run.stdout
    assert "read" not in run.stdout
    assert "simt device: a host access outside device work" in run.stderr, run.stderr
