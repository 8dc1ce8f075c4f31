"""The CUDA kernels: bit for bit the CPU kernels for every op, dtype and layout
(the rest of the operator suite runs on cuda through conftest.DEVICES), CUDA
graph capture of forward and backward without a device synchronisation,
tensors over 2^31 and 2^32 elements, inputs that are not 16-byte aligned, and
the value-check switch (FAKEQUANT_CHECK_VALUES); and every sample call and invalid
argument of the op table (tests/op_table.py). Skipped without a GPU."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import fakequant
import op_table
import reference as ref
from conftest import DTYPES, bits_equal

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

ops = torch.ops.fakequant
INT_VIEW = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32, torch.float64: torch.int64}


def assert_bits_equal(actual, expected, what=""):
    """Same dtype, shape, strides and bits; NaN where NaN (its payload may differ:
    the GPU produces the canonical NaN)."""
    actual, expected = actual.cpu(), expected.cpu()
    assert actual.dtype == expected.dtype and actual.shape == expected.shape, what
    assert actual.stride() == expected.stride(), f"{what}: strides {actual.stride()} != {expected.stride()}"
    if not actual.is_floating_point():
        assert bits_equal(actual, expected), what
        return
    nan = actual.isnan()
    assert bits_equal(nan, expected.isnan()), f"{what}: NaN elsewhere"
    a = actual.masked_fill(nan, 0).view(INT_VIEW[actual.dtype])
    e = expected.masked_fill(nan, 0).view(INT_VIEW[expected.dtype])
    bad = a != e
    if bool(bad.any()):
        idx = bad.nonzero()[:5].tolist()
        raise AssertionError(f"{what}: {int(bad.sum())} elements differ, e.g. at {idx}")


def on_both(fn, *args):
    """fn on CPU tensors and on their CUDA copies (strides kept); both results."""
    cuda_args = [a.cuda() if isinstance(a, torch.Tensor) else a for a in args]
    for a, c in zip(args, cuda_args):
        if isinstance(a, torch.Tensor):
            assert c.stride() == a.stride() or not a.is_non_overlapping_and_dense()
    return fn(*args), fn(*cuda_args)


def check_same(fn, *args, what=""):
    cpu, gpu = on_both(fn, *args)
    if isinstance(cpu, torch.Tensor):
        cpu, gpu = (cpu,), (gpu,)
    for i, (c, g) in enumerate(zip(cpu, gpu)):
        assert g.device.type == "cuda"
        assert_bits_equal(g, c, f"{what} output {i}")


def random_values(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float64) * 3
    flat = x.view(-1)
    specials = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e-40, -1e-40, 6e4, -3e38, 0.5])
    k = min(flat.numel(), specials.numel())
    flat[:k] = specials[:k]
    return x.to(dtype)


def to_device_strided(x, device):
    """x on device with the same strides (x.cuda() of a non-dense view is dense)."""
    return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=device).copy_(x)


def layouts(dtype):
    """Inputs of every layout the kernels see: (name, CPU tensor, the same view on the GPU)."""

    def build(device):
        base = random_values((4, 6, 5, 7), dtype, seed=1).to(device)
        small = random_values((1, 6, 1, 7), dtype, seed=2).to(device)
        yield "contiguous", base
        yield "channels_last", base.contiguous(memory_format=torch.channels_last)
        yield "transposed", base.transpose(1, 3)
        yield "sliced", base[:, ::2, 1:, ::3]
        yield "expanded", small.expand(4, 6, 5, 7)
        yield "zero-dim", random_values((), dtype, seed=3).to(device)
        for n in (1, 7, 8, 9, 31, 32, 33, 63, 64, 65, 255, 256, 257, 1000, 4099, 65537):
            yield f"numel {n}", random_values((n,), dtype, seed=n).to(device)

    for (name, cpu), (_, gpu) in zip(build("cpu"), build("cuda")):
        assert cpu.stride() == gpu.stride()
        yield name, cpu, gpu


# --- CPU and CUDA agree bit for bit ----------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("pack_mask", [True, False])
def test_affine_equals_cpu(dtype, pack_mask):
    for name, x, xg in layouts(dtype):
        for axis in [None] + list(range(x.dim())):
            c = 1 if axis is None else x.size(axis)
            scale = torch.rand(c) * 0.05 + 0.001
            for qmin, qmax in [(-128, 127), (0, 255), (-8, 7), (-(2**31), 2**31 - 1)]:
                zp = torch.randint(max(qmin, -20), min(qmax, 20) + 1, (c,), dtype=torch.int32)
                yc, mc = ops.fake_quantize_affine(x, scale, zp, axis, qmin, qmax, pack_mask)
                yg, mg = ops.fake_quantize_affine(xg, scale.cuda(), zp.cuda(), axis, qmin, qmax, pack_mask)
                what = f"affine {name} axis={axis} [{qmin}, {qmax}]"
                assert_bits_equal(yg, yc, what)
                assert_bits_equal(mg, mc, what + " mask")


@pytest.mark.parametrize("dtype", DTYPES)
def test_per_channel_last_axis_equals_cpu(dtype):
    """The channels innermost in whole 16-byte vectors (quantize_innermost_kernel: each thread
    keeps its channels' constants): channel counts with an odd number of vectors, a power of two,
    more vectors than a warp; rows enough for many trips a thread; channels_last activations."""
    for rows, c in [(3000, 12), (2048, 16), (777, 24), (300, 520), (5000, 64)]:
        x = random_values((rows, c), dtype, seed=c)
        scale = torch.rand(c) * 0.05 + 0.001
        scale[1] = 2.0**-70  # outside the fast division's range: the general path, for that thread
        zp = torch.randint(-20, 21, (c,), dtype=torch.int32)
        for pack_mask in (True, False):
            yc, mc = ops.fake_quantize_affine(x, scale, zp, 1, -128, 127, pack_mask)
            yg, mg = ops.fake_quantize_affine(x.cuda(), scale.cuda(), zp.cuda(), 1, -128, 127, pack_mask)
            assert_bits_equal(yg, yc, f"last axis {rows}x{c}")
            assert_bits_equal(mg, mc, f"last axis {rows}x{c} mask")
        amax = (scale * 127).reshape(1, c)
        check_same(lambda t, a: ops.fake_quantize_amax(t, a, 8, False, True), x, amax, what=f"amax {rows}x{c}")
    x = random_values((8, 32, 17, 9), dtype, seed=5).contiguous(memory_format=torch.channels_last)
    scale = torch.rand(32) * 0.05 + 0.001
    check_same(lambda t, s: ops.fake_quantize_affine(t, s, torch.zeros(32, dtype=torch.int32, device=t.device), 1,
                                                     -128, 127),
               x, scale, what="channels_last")


@pytest.mark.parametrize("dtype", DTYPES)
def test_affine_parameter_dtypes_equal_cpu(dtype):
    x = random_values((5, 300), dtype)
    for axis in (None, 0):
        c = 1 if axis is None else 5
        scale = torch.rand(c, dtype=torch.float64) * 0.05 + 0.001
        zp = torch.randint(0, 10, (c,))
        for sd in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
            for zd in (torch.int32, torch.int64, torch.int8, torch.uint8, torch.int16, torch.float32, torch.float64, torch.float16):
                check_same(
                    lambda t, s, z: ops.fake_quantize_affine(t, s, z, axis, -128, 127),
                    x, scale.to(sd), zp.to(zd), what=f"scale {sd} zero_point {zd}",
                )


AMAX_SETTINGS = [(8, False, True), (8, False, False), (8, True, False), (4, False, True), (2, False, False), (16, True, True)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", [ops.fake_quantize_amax, ops.quantize_amax])
def test_amax_equals_cpu(dtype, op):
    for name, x, xg in layouts(dtype):
        shapes = [(), (1,) * x.dim()] + [tuple(x.size(d) if d == k else 1 for d in range(x.dim())) for k in range(x.dim())]
        if x.dim() >= 2:
            shapes += [tuple(x.shape), tuple(x.shape[1:]), tuple(x.size(d) if d in (0, x.dim() - 1) else 1 for d in range(x.dim()))]
        for shape in shapes:
            amax = torch.rand(shape) * 3 + 0.1
            if amax.numel() > 1:
                amax.view(-1)[0] = 0.0  # quantizes to 0
                amax.view(-1)[-1] = 2.0**-25
            for num_bits, unsigned, narrow in AMAX_SETTINGS:
                yc, mc = op(x, amax, num_bits, unsigned, narrow)
                yg, mg = op(xg, amax.cuda(), num_bits, unsigned, narrow)
                what = f"{op} {name} amax {shape} {num_bits} {unsigned} {narrow}"
                assert_bits_equal(yg, yc, what)
                assert_bits_equal(mg, mc, what + " mask")


@pytest.mark.parametrize("dtype", DTYPES)
def test_amax_parameter_dtypes_equal_cpu(dtype):
    x = random_values((6, 50), dtype)
    for ad in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        for amax in (torch.tensor(1.7), torch.rand(6, 1) + 0.5):
            check_same(lambda t, a: ops.fake_quantize_amax(t, a, 8, False, True), x, amax.to(ad), what=str(ad))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_bits", [8, 4, 16])
def test_min_max_equals_cpu(dtype, num_bits):
    for name, x, xg in layouts(dtype):
        per_first = tuple(x.size(0) if d == 0 else 1 for d in range(x.dim()))
        per_last = tuple(x.size(-1) if d == x.dim() - 1 else 1 for d in range(x.dim()))
        for mn_shape, mx_shape in [((), ()), (per_first, ()), ((), per_last), (per_first, per_last)]:
            mn = -torch.rand(mn_shape) - 0.5
            mx = torch.rand(mx_shape) + 0.5
            yc, mc = ops.fake_quantize_min_max(x, mn, mx, num_bits)
            yg, mg = ops.fake_quantize_min_max(xg, mn.cuda(), mx.cuda(), num_bits)
            what = f"min_max {name} {mn_shape} {mx_shape}"
            assert_bits_equal(yg, yc, what)
            assert_bits_equal(mg, mc, what + " mask")


@pytest.mark.parametrize("dtype", DTYPES)
def test_mask_backward_equals_cpu(dtype):
    for name, x, _ in layouts(dtype):
        y, packed = ops.fake_quantize_amax(x, torch.tensor(2.0), 8, False, True)
        grad = random_values(tuple(x.shape), dtype, seed=7)
        grads = [grad, torch.empty_strided(y.shape, y.stride(), dtype=dtype).copy_(grad)]
        for g in grads:
            gg = to_device_strided(g, "cuda")
            assert_bits_equal(ops.mask_backward(gg, packed.cuda()), ops.mask_backward(g, packed), f"packed {name}")
            boolean = torch.rand(g.shape) > 0.4
            assert_bits_equal(ops.mask_backward(gg, boolean.cuda()), ops.mask_backward(g, boolean), f"bool {name}")
            if boolean.dim() >= 2:
                bt = boolean.transpose(0, 1).contiguous().transpose(0, 1)
                got = ops.mask_backward(gg, to_device_strided(bt, "cuda"))
                assert_bits_equal(got, ops.mask_backward(g, bt), f"bool transposed {name}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_ties_equal_cpu(dtype):
    # x / s near and at .5 for scales that are and are not powers of two.
    k = torch.arange(-300, 300, dtype=torch.float64)
    for s in (2.0**-3, 0.0371, 0.1, 1 / 3):
        x = ((k + 0.5) * s).to(dtype)
        check_same(lambda t, sc: ops.fake_quantize_affine(t, sc, torch.zeros(1, dtype=torch.int32, device=t.device), None, -128, 127),
                   x, torch.tensor([s], dtype=torch.float32), what=f"ties s={s}")
        check_same(lambda t, a: ops.fake_quantize_amax(t, a, 8, False, False), x, torch.tensor(127 * s), what=f"amax ties s={s}")


# --- every sample call of the op table (tests/op_table.py), every layout ------------------------

TABLE_CALLS = op_table.variants()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("entry,variant", TABLE_CALLS, ids=op_table.variant_ids(TABLE_CALLS))
def test_table_calls_equal_cpu(entry, variant, dtype):
    for layout in op_table.LAYOUTS:
        x, xg = op_table.sample_input(layout, dtype, "cpu"), op_table.sample_input(layout, dtype, "cuda")
        assert x.stride() == xg.stride()
        cpu_args, gpu_args = variant.args(x), variant.args(xg)
        expected, actual = entry.op(*cpu_args), entry.op(*gpu_args)
        if isinstance(expected, torch.Tensor):
            expected, actual = (expected,), (actual,)
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            what = f"{variant.name} {layout} output {i}"
            if i in entry.reduced_outputs:
                torch.testing.assert_close(a.cpu(), e, rtol=1e-6, atol=0, equal_nan=True, msg=what)
            else:
                assert_bits_equal(a, e, what)
        if entry.stateful:  # the buffers it updated
            for i, (a, e) in enumerate(zip(gpu_args, cpu_args)):
                if isinstance(e, torch.Tensor) and i > 0:
                    assert_bits_equal(a, e, f"{variant.name} {layout} argument {i}")


INVALID_METADATA = [p for p in op_table.invalid_cases() if not p[1].value]


@pytest.mark.parametrize("entry,case", INVALID_METADATA, ids=op_table.invalid_ids(INVALID_METADATA))
def test_table_invalid_arguments_on_cuda(entry, case):
    """The op table's invalid arguments (but the checks of values) on CUDA tensors raise as on the CPU."""
    args = [op_table.to_device(a, "cuda") for a in case.arguments(entry.invalid_base())]
    with pytest.raises(case.exc, match=case.match):
        entry.op(*args)


def test_table_value_checks_raise_with_checks_on():
    """With FAKEQUANT_CHECK_VALUES=1, each invalid parameter value of the op table raises on
    CUDA tensors as on the CPU."""
    out = run_python(
        """
        import pytest, op_table
        cases = [(e, c) for e, c in op_table.invalid_cases() if c.value]
        for entry, case in cases:
            args = [op_table.to_device(a, "cuda") for a in case.arguments(entry.invalid_base())]
            with pytest.raises(case.exc, match=case.match):
                entry.op(*args)
        print("raised", len(cases))
        """,
        env={"FAKEQUANT_CHECK_VALUES": "1"},
    )
    expected = sum(c.value for _, c in op_table.invalid_cases())
    assert expected > 0 and f"raised {expected}" in out


# --- llama.cpp's Q8_0/Q4_0 blocks (csrc/cuda/ggml.cu) ---------------------------------------


@pytest.mark.parametrize("num_bits", [8, 4], ids=["q8_0", "q4_0"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_ggml_equals_cpu(dtype, num_bits):
    # the corner-case blocks (tests/test_ggml.py) and random ones: whole blocks of 1 to 32
    # vectors (the vector kernel: whole trips and a part of one), beyond, ragged rows, rows
    # shorter than a block, and the same at odd offsets (the general kernel)
    from test_ggml import hard_blocks

    for block_size in (2, 4, 8, 16, 32, 64, 128, 256, 512, 7, 33, 1500):
        hard = hard_blocks(block_size).to(dtype)
        for rows in (hard.shape[0], 3000):
            x = torch.cat([hard, random_values((rows, block_size), dtype, seed=block_size)])
            check_same(lambda t: ops.fake_quantize_ggml(t, block_size, num_bits), x, what=f"blocks of {block_size}")
        for shape in ((3001, 2 * block_size + 5), (7, max(1, block_size // 2))):
            x = random_values(shape, dtype, seed=shape[1])
            check_same(lambda t: ops.fake_quantize_ggml(t, block_size, num_bits), x, what=f"{shape} {block_size}")
        for offset in (1, 3):
            base = random_values((64 * block_size + offset,), dtype, seed=offset)
            check_same(lambda t: ops.fake_quantize_ggml(t[offset:].view(64, block_size), block_size, num_bits), base,
                       what=f"offset {offset} blocks of {block_size}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_ggml_large_and_backward_equal_cpu(dtype):
    # GGUF's blocks of 32 over several grid steps, forward and the gradient through the mask
    x = random_values((4096 + 3, 4096), dtype, seed=11)
    for num_bits in (8, 4):
        def step(t):
            t = t.detach().requires_grad_()
            y = fakequant.ops.fake_quantize_ggml(t, 32, num_bits)
            (g,) = torch.autograd.grad(y, t, torch.ones_like(y))
            return y.detach(), g
        check_same(step, x, what=f"num_bits {num_bits}")


# --- inputs that are not 16-byte aligned -------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("offset", [1, 2, 3])
def test_misaligned_inputs(dtype, offset):
    n = 4 * 6 * 5 * 7
    base_cpu = random_values((n + offset,), dtype, seed=offset)
    base = base_cpu.cuda()
    x, xc = base[offset:].view(4, 6, 5, 7), base_cpu[offset:].view(4, 6, 5, 7)
    assert x.data_ptr() % 16 == (offset * x.element_size()) % 16
    scale = torch.rand(6) * 0.05 + 0.01
    zp = torch.randint(-5, 5, (6,), dtype=torch.int32)
    for pack in (True, False):
        for args in ((scale[:1], zp[:1], None), (scale, zp, 1)):
            yc, mc = ops.fake_quantize_affine(xc, *args, -128, 127, pack)
            yg, mg = ops.fake_quantize_affine(x, *(a.cuda() if isinstance(a, torch.Tensor) else a for a in args), -128, 127, pack)
            assert_bits_equal(yg, yc, "affine")
            assert_bits_equal(mg, mc, "affine mask")
    amax = torch.rand(1, 6, 1, 1) + 0.5
    for op in (ops.fake_quantize_amax, ops.quantize_amax):
        yc, mc = op(xc, amax, 8, False, True)
        yg, mg = op(x, amax.cuda(), 8, False, True)
        assert_bits_equal(yg, yc, str(op))
        assert_bits_equal(mg, mc, f"{op} mask")
    yc, mc = ops.fake_quantize_min_max(xc, torch.tensor(-1.0), torch.tensor(2.0), 8)
    yg, mg = ops.fake_quantize_min_max(x, torch.tensor(-1.0, device="cuda"), torch.tensor(2.0, device="cuda"), 8)
    assert_bits_equal(yg, yc, "min_max")
    assert_bits_equal(mg, mc, "min_max mask")
    # backward with a misaligned gradient and a misaligned bool mask
    _, packed = ops.fake_quantize_amax(xc, amax, 8, False, True)
    gbase_cpu = random_values((n + offset,), dtype, seed=9)
    g, gc = gbase_cpu.cuda()[offset:].view(4, 6, 5, 7), gbase_cpu[offset:].view(4, 6, 5, 7)
    assert_bits_equal(ops.mask_backward(g, packed.cuda()), ops.mask_backward(gc, packed), "packed backward")
    mbase = torch.rand(n + offset) > 0.5
    m, mcpu = mbase.cuda()[offset:].view(4, 6, 5, 7), mbase[offset:].view(4, 6, 5, 7)
    assert_bits_equal(ops.mask_backward(g, m), ops.mask_backward(gc, mcpu), "bool backward")


# --- autograd, streams, devices ---------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_training_step_equals_cpu(dtype):
    x = random_values((8, 3, 5, 6), dtype, seed=4).to(memory_format=torch.channels_last)
    scale, zp = torch.rand(3) * 0.05 + 0.01, torch.randint(-3, 3, (3,), dtype=torch.int32)

    grad_out = random_values(tuple(x.shape), dtype, seed=5)

    def step(t, s, z, a):
        t = t.detach().requires_grad_()
        y = fakequant.fake_quantize_per_channel_affine(t, s, z, 1, -128, 127)
        y = fakequant.fake_quantize_amax(y, a)
        y = fakequant.fake_quantize_min_max(y, -1.0, 1.5)
        (g,) = torch.autograd.grad(y, t, grad_out.to(t.device))
        return y.detach(), g

    amax = torch.rand(1, 3, 1, 1) + 0.3
    yc, gc = step(x, scale, zp, amax)
    yg, gg = step(to_device_strided(x, "cuda"), scale.cuda(), zp.cuda(), amax.cuda())
    assert_bits_equal(yg, yc, "y")
    assert_bits_equal(gg, gc, "grad")


def test_runs_on_the_current_stream():
    x = torch.randn(1 << 20, device="cuda")
    amax = torch.tensor(2.0, device="cuda")
    expected = ops.fake_quantize_amax(x, amax, 8, False, True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            y, mask = ops.fake_quantize_amax(x, amax, 8, False, True)
            g = ops.mask_backward(x, mask)
    side.synchronize()
    assert bits_equal(y, expected[0]) and bits_equal(mask, expected[1])
    assert bits_equal(g, torch.where(fakequant.unpack_mask(mask, x), x, torch.zeros_like(x)))


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_second_device():
    x = random_values((33, 17), torch.float32)
    with torch.cuda.device(0):
        y, mask = ops.fake_quantize_amax(x.to("cuda:1"), torch.tensor(1.5, device="cuda:1"), 8, False, True)
    assert y.device == torch.device("cuda:1")
    yc, mc = ops.fake_quantize_amax(x, torch.tensor(1.5), 8, False, True)
    assert_bits_equal(y, yc)
    assert_bits_equal(mask, mc)


def test_no_synchronisation_in_forward_and_backward():
    x = torch.randn(64, 3, 8, 8, device="cuda", requires_grad=True)
    scale, zp = torch.rand(3, device="cuda") * 0.05 + 0.01, torch.zeros(3, dtype=torch.int32, device="cuda")
    amax, lo, hi = torch.rand(64, 1, 1, 1, device="cuda") + 0.5, torch.tensor(-1.0, device="cuda"), torch.tensor(2.0, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        y = ops.fake_quantize_affine(x, scale, zp, 1, -128, 127)[0]
        y = ops.fake_quantize_amax(y, amax, 8, False, True)[0]
        y = ops.quantize_amax(y, amax, 8, False, True)[0]
        y = ops.fake_quantize_min_max(y, lo, hi, 8)[0]
        y.backward(torch.ones_like(y))
        ops.fake_quantize_affine(x.detach(), scale[:1], zp[:1], None, -128, 127, False)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()


# --- CUDA graphs ---------------------------------------------------------------------------


def test_cuda_graph_capture_forward_and_backward():
    static_x = torch.randn(32, 3, 16, 16, device="cuda").to(memory_format=torch.channels_last).requires_grad_()
    scale = torch.tensor([0.02, 0.03, 0.05], device="cuda")
    zp = torch.tensor([0, 2, -3], dtype=torch.int32, device="cuda")
    amax = torch.rand(1, 3, 1, 1, device="cuda") + 0.5
    amax_t = torch.tensor(1.5, device="cuda")
    lo, hi = torch.tensor(-1.0, device="cuda"), torch.tensor(1.0, device="cuda")

    def step(x):
        y = fakequant.fake_quantize_per_channel_affine(x, scale, zp, 1, -128, 127)
        y = fakequant.fake_quantize_amax(y, amax)
        y = fakequant.fake_quantize_amax(y, amax_t, num_bits=4, narrow_range=False)
        y = fakequant.fake_quantize_min_max(y, lo, hi)
        q, _ = fakequant.quantize_amax(y, amax_t)
        loss = (y * q).sum()
        (g,) = torch.autograd.grad(loss, x)
        return y.detach(), g

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture, as torch.cuda.graphs asks
        for _ in range(3):
            step(static_x)
    torch.cuda.current_stream().wait_stream(side)

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y, static_g = step(static_x)

    for seed in range(3):
        torch.manual_seed(seed)
        fresh = torch.randn(32, 3, 16, 16, device="cuda")
        with torch.no_grad():
            static_x.copy_(fresh)
        amax.copy_(torch.rand(1, 3, 1, 1, device="cuda") + 0.5)  # parameters are read on the device
        graph.replay()
        y, g = step(static_x)
        assert_bits_equal(static_y, y, "replayed forward")
        assert_bits_equal(static_g, g, "replayed backward")


def test_cuda_graph_capture_with_value_checks_on():
    # The checks need a synchronisation, which capture forbids: they are skipped.
    run_python(
        """
        import torch, fakequant
        ops = torch.ops.fakequant
        x = torch.randn(1000, device="cuda")
        amax = torch.tensor(2.0, device="cuda")
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            ops.fake_quantize_amax(x, amax, 8, False, True)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y, m = ops.fake_quantize_amax(x, amax, 8, False, True)
        amax.fill_(-1.0)
        g.replay()
        torch.cuda.synchronize()
        assert bool(y.isnan().all()) and not bool(m.any())
        """,
        env={"FAKEQUANT_CHECK_VALUES": "1"},
    )


# --- value checks ---------------------------------------------------------------------------


def run_python(code, env):
    full_env = dict(os.environ, **env)
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    full_env["PYTHONPATH"] = os.pathsep.join([tests_dir] + [p for p in [full_env.get("PYTHONPATH")] if p])
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full_env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_invalid_values_give_nan_with_checks_off():
    # The default: no synchronising check on CUDA; an invalid parameter gives NaN
    # outputs and a zero mask, only where it applies.
    x = torch.randn(4, 300, device="cuda")
    bad_scales = [0.0, -0.5, float("nan"), float("inf")]
    for s in bad_scales:
        y, m = ops.fake_quantize_affine(x, torch.tensor([s], device="cuda"), torch.tensor([0], device="cuda"), None, -128, 127)
        assert bool(y.isnan().all()) and not bool(m.any()), s
    for zp in (torch.tensor([0.5]), torch.tensor([200])):
        y, m = ops.fake_quantize_affine(x, torch.tensor([0.1], device="cuda"), zp.cuda(), None, -128, 127)
        assert bool(y.isnan().all()) and not bool(m.any())
    scale = torch.tensor([0.1, -1.0, 0.1, 0.1], device="cuda")
    y, m = ops.fake_quantize_affine(x, scale, torch.zeros(4, dtype=torch.int32, device="cuda"), 0, -128, 127)
    assert bool(y[1].isnan().all()) and not bool(y[[0, 2, 3]].isnan().any())
    unpacked = fakequant.unpack_mask(m, y)
    assert not bool(unpacked[1].any()) and bool(unpacked[0].any())
    for a in (-1.0, float("nan"), float("inf")):
        for op in (ops.fake_quantize_amax, ops.quantize_amax):
            y, m = op(x, torch.tensor(a, device="cuda"), 8, False, True)
            assert bool(y.isnan().all()) and not bool(m.any()), a
    for lo, hi in [(1.0, 1.0), (2.0, 1.0), (0.0, float("inf")), (float("nan"), 1.0)]:
        y, m = ops.fake_quantize_min_max(x, torch.tensor(lo, device="cuda"), torch.tensor(hi, device="cuda"), 8)
        assert bool(y.isnan().all()) and not bool(m.any()), (lo, hi)


def test_dynamic_amax_propagates_nan_with_checks_on():
    # A quantizer's dynamic amax is not user input: NaN outputs on CUDA as on the CPU, even
    # with FAKEQUANT_CHECK_VALUES=1 (which still checks a given amax).
    run_python(
        """
        import math, torch, pytest
        from fakequant.nn import TensorQuantizer
        from fakequant.tensor_quant import QuantDescriptor
        for device in ("cpu", "cuda"):
            x = torch.randn(3, 8, device=device)
            x[1, 2] = math.nan
            assert bool(TensorQuantizer(QuantDescriptor()).to(device)(x).isnan().all())
            y = TensorQuantizer(QuantDescriptor(axis=0)).to(device)(x)
            assert bool(y[1].isnan().all()) and not bool(y[0].isnan().any())
            q = TensorQuantizer(QuantDescriptor(amax=1.0)).to(device)
            q.amax = torch.tensor(math.nan)  # a given amax is still checked
            with pytest.raises(ValueError, match="amax"):
                q(x)
        """,
        env={"FAKEQUANT_CHECK_VALUES": "1"},
    )


def test_invalid_values_raise_with_checks_on():
    out = run_python(
        """
        import pytest, torch, fakequant
        ops = torch.ops.fakequant
        x = torch.randn(4, 30, device="cuda")
        c = lambda *v: torch.tensor(v, device="cuda")
        cases = [
            (lambda: ops.fake_quantize_affine(x, c(-1.0), c(0), None, -128, 127), "scale"),
            (lambda: ops.fake_quantize_affine(x, c(0.1, 0.1, 0.0, 0.1), c(0, 0, 0, 0), 0, -128, 127), r"scale\\[2\\]"),
            (lambda: ops.fake_quantize_affine(x, c(0.1), c(0.5), None, -128, 127), "zero_point"),
            (lambda: ops.fake_quantize_affine(x, c(0.1), c(300), None, -128, 127), "zero_point"),
            (lambda: ops.fake_quantize_amax(x, c(-1.0), 8, False, True), "amax"),
            (lambda: ops.quantize_amax(x, c(float("nan")), 8, False, True), "amax"),
            (lambda: ops.fake_quantize_min_max(x, c(1.0), c(1.0), 8), "max_range"),
        ]
        for fn, name in cases:
            with pytest.raises(ValueError, match=name):
                fn()
        # and valid values still work
        y, m = ops.fake_quantize_amax(x, c(1.0), 8, False, True)
        assert not bool(y.isnan().any())
        print("raised", len(cases))
        """,
        env={"FAKEQUANT_CHECK_VALUES": "1"},
    )
    assert "raised 7" in out


def test_value_check_messages_match_cpu():
    code = """
        import torch, fakequant
        ops = torch.ops.fakequant
        def message(device):
            try:
                ops.fake_quantize_affine(torch.randn(4, 5, device=device), torch.tensor([0.1, -2.0, 0.1, 0.1], device=device),
                                         torch.zeros(4, dtype=torch.int32, device=device), 0, -128, 127)
            except ValueError as e:
                return str(e).splitlines()[0]
        assert message("cpu") == message("cuda"), (message("cpu"), message("cuda"))
        print("same")
        """
    assert "same" in run_python(code, env={"FAKEQUANT_CHECK_VALUES": "1"})


def test_metadata_errors_on_cuda():
    x = torch.randn(4, 3, 5, device="cuda")
    with pytest.raises(ValueError, match="scale"):
        ops.fake_quantize_affine(x, torch.ones(4, device="cuda"), torch.zeros(4, device="cuda"), 1, -128, 127)
    with pytest.raises(ValueError, match="scale"):
        ops.fake_quantize_affine(x, torch.ones(1), torch.zeros(1, device="cuda"), None, -128, 127)  # CPU scale
    with pytest.raises(ValueError, match="input"):
        ops.fake_quantize_amax(torch.randn(3), torch.tensor(1.0, device="cuda"), 8, False, True)  # CPU input
    with pytest.raises(ValueError, match="amax"):
        ops.fake_quantize_amax(x, torch.ones(2, 1, device="cuda"), 8, False, True)
    with pytest.raises(TypeError, match="input"):
        ops.fake_quantize_amax(x.int(), torch.tensor(1.0, device="cuda"), 8, False, True)
    with pytest.raises(ValueError, match="mask"):
        ops.mask_backward(x, torch.zeros(2, dtype=torch.uint8, device="cuda"))


# --- tensors over 2^31 and 2^32 elements ------------------------------------------------------


def free_gpu_bytes():
    free, _ = torch.cuda.mem_get_info()
    return free


@pytest.mark.skipif(not torch.cuda.is_available() or free_gpu_bytes() < 14 * 2**30, reason="needs 14 GiB of free GPU memory")
def test_more_than_2_to_31_elements():
    n = 2**31 + 13
    tail = torch.tensor([0.3, -7.0, 1.26, float("nan"), 0.5, -0.5, 2.0, 9.0, -1.1, 0.0, 1.0, 0.1, -0.26], dtype=torch.float16)
    x = torch.zeros(n, dtype=torch.float16, device="cuda")
    x[-13:] = tail.cuda()
    x[2**31 - 3 : 2**31 + 3] = torch.tensor([1.0, -1.0, 3.0, 0.3, -0.3, 2.0], dtype=torch.float16, device="cuda")
    amax = torch.tensor(2.0, device="cuda")
    y, mask = ops.fake_quantize_amax(x, amax, 8, False, True)
    assert mask.numel() == (n + 7) // 8
    for lo, hi in ((n - 13, n), (2**31 - 3, 2**31 + 3)):
        ey, emask = ops.fake_quantize_amax(x[lo:hi].cpu(), amax.cpu(), 8, False, True)
        assert_bits_equal(y[lo:hi], ey)
    assert not bool(y[: 2**31 - 3].any())
    bits = fakequant.unpack_mask(mask[-2:], torch.empty(16))  # n % 8 == 5: the last 13 elements
    # (their first three were overwritten just above: the expected mask is of x's own tail)
    assert bits_equal(bits[:13].cpu(), ref.fake_quantize_amax(x[-13:].cpu(), 2.0)[1])
    del y
    g = ops.mask_backward(x, mask)
    last = x[-13:].cpu()
    assert_bits_equal(g[-13:], torch.where(ref.fake_quantize_amax(last, 2.0)[1], last, torch.zeros_like(last)))
    del g
    # misaligned, so the scalar path, past 2^31 too
    ym, mm = ops.fake_quantize_amax(x[1:], amax, 8, False, True)
    assert_bits_equal(ym[-12:], ops.fake_quantize_amax(last[1:], amax.cpu(), 8, False, True)[0])


@pytest.mark.skipif(not torch.cuda.is_available() or free_gpu_bytes() < 28 * 2**30, reason="needs 28 GiB of free GPU memory")
def test_more_than_2_to_32_elements_per_channel():
    # Per-channel over 2^32 elements takes the 64-bit index arithmetic.
    rows, cols = 4, 2**30 + 10
    x = torch.zeros(rows, cols, dtype=torch.float16, device="cuda")
    probe = torch.tensor([0.3, -7.0, 1.26, float("nan"), 0.5, -0.5, 2.0, 9.0], dtype=torch.float16)
    for r in range(rows):
        x[r, :8] = probe.cuda()
        x[r, -8:] = probe.cuda()
    amax = torch.tensor([[1.0], [2.0], [0.5], [4.0]], device="cuda")
    scale = amax.flatten() / 100
    zp = torch.tensor([0, 3, -3, 1], dtype=torch.int32, device="cuda")
    y, mask = ops.fake_quantize_amax(x, amax, 8, False, True)
    ya, maska = ops.fake_quantize_affine(x, scale, zp, 0, -128, 127)
    probes = x[:, :8].cpu()
    ey, _ = ops.fake_quantize_amax(probes, amax.cpu(), 8, False, True)
    eya, _ = ops.fake_quantize_affine(probes, scale.cpu(), zp.cpu(), 0, -128, 127)
    assert_bits_equal(y[:, :8], ey)
    assert_bits_equal(y[:, -8:], ey)
    assert_bits_equal(ya[:, :8], eya)
    assert_bits_equal(ya[:, -8:], eya)
    bits = fakequant.unpack_mask(mask[-1:], torch.empty(8))  # numel % 8 == 0: the last byte, row 3
    assert bits_equal(bits.cpu(), probe.float().abs() <= 4.0)


def test_compiled_backward_is_fused_and_exact():
    """torch.compile on CUDA takes the operators' backward as plain PyTorch that Inductor fuses
    into its kernels (fakequant.composite.compiled.FUSED_BACKWARD_DEVICE_TYPES): every op of the
    op table's compiled calls, outputs and input gradients bit for bit eager's (a channels-last
    input holding NaN, +-inf, +-0 and ties: one compile, within gpu-check's time for this file),
    and no mask_backward call in the step (tests/test_compiled.py runs the same on the CPU, every
    layout and dtype, in `make slow`)."""
    from fakequant.composite import compiled
    from test_compiled import check_inductor_equals_eager, check_mask_backward_calls

    assert "cuda" in compiled.FUSED_BACKWARD_DEVICE_TYPES
    check_inductor_equals_eager("opaque", "cuda", torch.float32, layouts=("channels_last",))
    check_mask_backward_calls("cuda", fused=True)
