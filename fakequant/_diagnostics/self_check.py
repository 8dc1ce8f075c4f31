"""The operators' self-check: each operator on a device, in every dtype, against the
plain-PyTorch rule (``fakequant.composite.rules``), forward values and backward masks
(``python -m fakequant info`` and ``gpu-check``)."""
import time

import torch

import fakequant
from fakequant.composite import rules as ref

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def _cases(device, dtype, gen):
    """(name, fakequant function, reference function, input) for each operator."""
    x = (torch.randn(257 * 33, generator=gen, dtype=torch.float64) * 3).to(device, dtype)
    ties = ((torch.arange(-140, 140, dtype=torch.float64) + 0.5) / 8).to(device, dtype)
    special = torch.tensor([float("nan"), float("inf"), -float("inf")], device=device, dtype=dtype)
    x = torch.cat([x, ties, special])
    xc = x[: 257 * 33].view(257, 33)
    scale = torch.rand(33, generator=gen).to(device) * 0.05 + 0.01
    zp = torch.randint(0, 20, (33,), generator=gen, dtype=torch.int32).to(device)
    amax = torch.rand(257, 1, generator=gen).to(device) * 3
    s1, z1, a0, a1 = scale[:1], zp[:1], amax[0, 0], amax[1, 0]
    # static blocks of 32 (an amax a block): on CUDA, the rows' constants in shared memory over
    # several tiles and a tail (quantize_rows_kernel), where xc's runs of 33 take the table
    xs = x[: 264 * 32].view(264, 32)
    amax_s = torch.rand(264, 1, generator=gen).to(device) * 3
    # NVFP4 in aligned rows of whole blocks (on CUDA the vector kernel): scale_amax the data's
    # (every block's quotients inside E2M1's limit: the trips without saturation), and a0, below
    # most blocks' amax (scales clamped to E4M3's 448: the trips with it)
    a_xs = xs.abs().amax()
    # per token, asymmetric: rows of 2048 (on CUDA, rows held in registers; bfloat16's row keys
    # on 16-bit pairs), the second row all negative
    xt = x[: 4 * 2048].view(4, 2048).clone()
    xt[1] = -xt[1].abs()
    yield ("affine per-tensor", lambda t: fakequant.fake_quantize_affine(t, s1, z1, None, -128, 127),
           lambda t: ref.fake_quantize_affine(t, s1, z1, None, -128, 127), x)
    yield ("affine per-channel", lambda t: fakequant.fake_quantize_affine(t, scale, zp, 1, 0, 255),
           lambda t: ref.fake_quantize_affine(t, scale, zp, 1, 0, 255), xc)
    yield ("amax per-tensor", lambda t: fakequant.fake_quantize_amax(t, a0), lambda t: ref.fake_quantize_amax(t, a0), x)
    yield ("amax per-channel 4-bit", lambda t: fakequant.fake_quantize_amax(t, amax, 4, True, False),
           lambda t: ref.fake_quantize_amax(t, amax, 4, True, False), xc)
    yield ("amax static blocks of 32", lambda t: fakequant.fake_quantize_amax(t, amax_s),
           lambda t: ref.fake_quantize_amax(t, amax_s), xs)
    yield ("quantize", lambda t: fakequant.quantize_amax(t, a1, 8, False, False)[0],
           lambda t: ref.quantize_amax(t, a1, 8, False, False), x)
    yield ("min/max", lambda t: fakequant.fake_quantize_min_max(t, -amax[2, 0], amax[3, 0]),
           lambda t: ref.fake_quantize_min_max(t, -amax[2, 0], amax[3, 0]), x)
    yield ("fp8 e4m3 per-channel", lambda t: fakequant.fake_quantize_fp8(t, amax),
           lambda t: ref.fake_quantize_fp8(t, amax), xc)
    yield ("block-wise int4 b16", lambda t: fakequant.fake_quantize_blockwise(t, 16, 4),
           lambda t: ref.fake_quantize_blockwise(t, 16, 4), xc)
    yield ("block-wise nvfp4", lambda t: fakequant.fake_quantize_blockwise(t, 16, 4, exponent_bits=2, scale_amax=a0),
           lambda t: ref.fake_quantize_blockwise(t, 16, 4, False, True, 2, a0), xc)
    for name, sa in (("inside", a_xs), ("saturating", a0)):
        yield (f"block-wise nvfp4 vectors, {name}",
               lambda t, sa=sa: fakequant.fake_quantize_blockwise(t, 16, 4, exponent_bits=2, scale_amax=sa),
               lambda t, sa=sa: ref.fake_quantize_blockwise(t, 16, 4, False, True, 2, sa), xs)
    yield ("per-token centered int8 rows",
           lambda t: fakequant.fake_quantize_blockwise(t, 2048, 8, False, False, centered=True),
           lambda t: ref.fake_quantize_blockwise(t, 2048, 8, False, False, centered=True), xt)
    yield ("lsq per-channel", lambda t: fakequant.fake_quantize_lsq(t, scale, zp, 1, 0, 255),
           lambda t: ref.fake_quantize_affine(t, scale, zp, 1, 0, 255), xc)


def _same(y, expected):
    return torch.equal(y.isnan(), expected.isnan()) and bool((y.isnan() | (y == expected)).all())


def self_check(devices):
    """(failures, cases checked, seconds): forward values and backward masks of
    every op, for each dtype and device, against the reference."""
    gen = torch.Generator().manual_seed(0)
    failures, checked, start = [], 0, time.perf_counter()
    for device in devices:
        for dtype in DTYPES:
            for name, op, reference, x in _cases(device, dtype, gen):
                xr = x.detach().requires_grad_()
                y = op(xr)
                (grad,) = torch.autograd.grad(y.sum(), xr)
                ey, emask = reference(x)
                checked += 1
                if not (_same(y.detach(), ey) and torch.equal(grad, emask.to(dtype))):
                    failures.append(f"{name} {dtype} on {device}")
    return failures, checked, time.perf_counter() - start
