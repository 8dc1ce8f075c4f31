"""torch's fake-quant family as drop-ins: the _cachemask forms, the learnable (LSQ)
ops and fused_moving_avg_obs_fake_quant, against torch's own ops in the same process.

Our fake quantization divides by the scale (the contract); torch multiplies by
1 / scale, so outputs may differ by one step where x / scale is within rounding of
a tie. Those are counted, checked to be ties, and bounded; everything else (masks
away from ties, running statistics, scales, zero points) is compared bit for bit.
"""
import pytest
import torch

import fakequant
import reference as ref
from conftest import DEVICES, assert_same
from fakequant import ops


def tie_differences(y, t, x, scale, zero_point, axis=None):
    """How many elements of y and t differ; asserts each is one step apart at a
    near-tie of x / scale."""
    diff = (y != t)
    if not bool(diff.any()):
        return 0
    s, _ = (scale, zero_point) if axis is None else (
        scale.reshape([-1 if d == axis % x.dim() else 1 for d in range(x.dim())]), None)
    v = (x.double() / s.double())
    near_tie = ((v - v.floor()) - 0.5).abs() < 1e-5
    assert bool(near_tie[diff].all()), "a difference away from a tie"
    step = torch.broadcast_to(s.double(), x.shape)[diff]
    assert bool(((y[diff].double() - t[diff].double()).abs() <= step * 1.001).all())
    return int(diff.sum())


# --- the _cachemask forms ---------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_per_tensor_cachemask_matches_torch(device, dtype):
    x = (torch.randn(64, 65, device=device) * 3).to(dtype).requires_grad_()
    y, mask = ops.fake_quantize_per_tensor_affine_cachemask(x, 0.0213, 5, -128, 127)
    t, tmask = torch.ops.aten.fake_quantize_per_tensor_affine_cachemask(x, 0.0213, 5, -128, 127)
    assert mask.dtype == torch.bool and mask.shape == x.shape and not mask.requires_grad
    assert tie_differences(y.detach(), t.detach(), x.detach(), torch.tensor(0.0213), 5) <= 20
    assert_same(y.detach(), ref.fake_quantize_affine(x.detach(), torch.tensor([0.0213]), torch.tensor([5]), None,
                                                     -128, 127)[0].to(device))
    assert int((mask != tmask).sum()) <= 2  # only at a tie on the range's edge
    gy, = torch.autograd.grad(y.sum(), x)
    assert_same(gy, mask.to(dtype))


@pytest.mark.parametrize("device", DEVICES)
def test_per_channel_cachemask_matches_torch(device):
    x = torch.randn(8, 3, 4, 4, device=device) * 2
    scale = torch.rand(3, device=device) * 0.05 + 0.01
    zp = torch.randint(0, 10, (3,), dtype=torch.int32, device=device)
    y, mask = ops.fake_quantize_per_channel_affine_cachemask(x, scale, zp, 1, 0, 255)
    t, tmask = torch.ops.aten.fake_quantize_per_channel_affine_cachemask(x, scale, zp, 1, 0, 255)
    assert tie_differences(y, t, x, scale, zp, axis=1) <= 10
    assert int((mask != tmask).sum()) <= 2
    assert fakequant.fake_quantize_per_channel_affine_cachemask is ops.fake_quantize_per_channel_affine_cachemask


# --- the learnable ops ---------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("per_channel", [False, True])
def test_learnable_matches_torch(device, per_channel):
    x = torch.randn(6, 4, 5, device=device) * 2
    if per_channel:
        scale = torch.rand(4, device=device) * 0.05 + 0.01
        zp = torch.randn(4, device=device) * 3
    else:
        scale = torch.tensor([0.031], device=device)
        zp = torch.tensor([2.3], device=device)
    grads = []
    for fn in (ops, torch):
        xs, ss, zs = (t.clone().requires_grad_() for t in (x, scale, zp))
        if per_channel:
            y = fn._fake_quantize_learnable_per_channel_affine(xs, ss, zs, 1, -128, 127, 0.5)
        else:
            y = fn._fake_quantize_learnable_per_tensor_affine(xs, ss, zs, -128, 127, 0.5)
        g = torch.linspace(-1, 1, y.numel(), device=device).reshape(y.shape)
        y.backward(g)
        grads.append((y.detach(), xs.grad, ss.grad, zs.grad))
    (y, gx, gs, gz), (t, tgx, tgs, tgz) = grads
    zr = zp.round().clamp(-128, 127)
    assert tie_differences(y, t, x, scale, zr, axis=1 if per_channel else None) <= 3
    assert int((gx != tgx).sum()) <= 3
    assert gs.shape == tgs.shape and gz.shape == tgz.shape
    # torch sums in float32, fakequant in float64: close, not bit for bit.
    torch.testing.assert_close(gs, tgs, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(gz, tgz, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_learnable_half_precision(dtype):
    # torch's per-tensor learnable op is float32 only; ours takes float16/bfloat16.
    x = (torch.randn(32, 8) * 2).to(dtype).requires_grad_()
    scale = torch.tensor([0.05], requires_grad=True)
    zp = torch.tensor([1.0], requires_grad=True)
    y = ops._fake_quantize_learnable_per_tensor_affine(x, scale, zp, -128, 127, 1.0)
    assert y.dtype == dtype
    y.sum().backward()
    assert scale.grad is not None and zp.grad is not None and x.grad.dtype == dtype
    assert_same(y.detach(), ops.fake_quantize_affine(x.detach(), 0.05, 1, None, -128, 127))


def test_learnable_rejects_integer_params():
    x = torch.randn(4)
    with pytest.raises(TypeError, match="zero_point must be a floating-point tensor"):
        ops._fake_quantize_learnable_per_tensor_affine(x, torch.tensor([0.1]), torch.tensor([0]), 0, 255)
    with pytest.raises(ValueError, match="one element"):
        ops._fake_quantize_learnable_per_tensor_affine(x, torch.tensor([0.1, 0.2]), torch.tensor([0.0]), 0, 255)


# --- fused_moving_avg_obs_fake_quant --------------------------------------------------------------


def _buffers(device, channels=None):
    if channels is None:
        return [torch.tensor([float("inf")], device=device), torch.tensor([float("-inf")], device=device),
                torch.tensor([1.0], device=device), torch.tensor([0], dtype=torch.int32, device=device)]
    return [torch.empty(0, device=device), torch.empty(0, device=device),
            torch.empty(0, device=device), torch.empty(0, dtype=torch.int32, device=device)]


FUSED_CASES = [
    # (shape, per_row, ch_axis, symmetric, quant_min, quant_max, input scale, input shift)
    ((64, 33), False, 0, False, 0, 255, 3.0, 0.5),
    ((64, 33), False, 0, True, -128, 127, 3.0, 0.5),
    ((8, 3, 5, 5), True, 0, True, -128, 127, 2.0, 0.0),
    ((8, 3, 5, 5), True, 0, False, 0, 255, 2.0, 1.0),
    ((16, 40), False, 0, False, 0, 15, 1.0, 3.0),     # all positive: min widened to 0
    ((16, 40), False, 0, False, -128, 127, 1e-6, 0.0),  # tiny range: the small-scale cut-off
    ((5, 7), True, 0, False, -8, 7, 0.0, 0.0),          # all zero: scale 0.1 then cut off
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", FUSED_CASES)
def test_fused_moving_avg_obs_fake_quant_matches_torch(device, case):
    shape, per_row, ch_axis, symmetric, qmin, qmax, spread, shift = case
    gen = torch.Generator().manual_seed(sum(shape))
    ours = _buffers(device, shape[ch_axis] if per_row else None)
    theirs = [b.clone() for b in ours]
    ties = 0
    for step in range(6):
        x = (torch.randn(shape, generator=gen) * spread * (1 + step / 3) + shift).to(device)
        observer_on = torch.tensor([0 if step == 3 else 1], dtype=torch.uint8, device=device)
        fake_quant_on = torch.tensor([0 if step == 1 else 1], dtype=torch.uint8, device=device)
        xs = x.clone().requires_grad_()
        y = ops.fused_moving_avg_obs_fake_quant(xs, observer_on, fake_quant_on, *ours, 0.01, qmin, qmax, ch_axis,
                                                per_row, symmetric)
        t = torch.fused_moving_avg_obs_fake_quant(x, observer_on, fake_quant_on, *theirs, 0.01, qmin, qmax, ch_axis,
                                                  per_row, symmetric)
        for a, b in zip(ours[:2], theirs[:2]):
            assert_same(a, b)
        if step != 1:  # torch leaves scale/zero point as they were with fake quant off, so does fakequant
            assert_same(ours[2], theirs[2])
            assert_same(ours[3], theirs[3])
        ties += tie_differences(y.detach(), t, x, ours[2], ours[3], axis=ch_axis if per_row else None)
        y.backward(torch.ones_like(y))
        if step == 1:
            assert_same(y.detach(), x)
            assert_same(xs.grad, torch.ones_like(x))
        else:
            _, mask = torch.ops.aten.fake_quantize_per_channel_affine_cachemask(
                x, ours[2], ours[3], ch_axis, qmin, qmax) if per_row else \
                torch.ops.aten.fake_quantize_per_tensor_affine_cachemask(x, float(ours[2]), int(ours[3]), qmin, qmax)
            assert int((xs.grad != mask.float()).sum()) <= 2
    assert ties <= 0.002 * 6 * x.numel() + 2


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_fused_other_dtypes_follow_contract(device, dtype):
    x = (torch.randn(32, 9) * 2).to(device=device, dtype=dtype)
    bufs = _buffers(device)
    on = torch.tensor([1], device=device)
    y = ops.fused_moving_avg_obs_fake_quant(x, on, on, *bufs, 0.01, 0, 255, 0)
    assert y.dtype == dtype
    assert float(bufs[0]) == float(x.min()) and float(bufs[1]) == float(x.max())
    assert_same(y, ops.fake_quantize_per_tensor_affine(x, bufs[2], bufs[3], 0, 255))


@pytest.mark.parametrize("device", DEVICES)
def test_fused_any_channel_axis(device):
    # torch supports ch_axis 0 only; fakequant any axis: the same as moving the axis first.
    x = torch.randn(4, 6, 5, device=device)
    on = torch.tensor([1], device=device)
    a, b = _buffers(device, 6), _buffers(device, 6)
    y = ops.fused_moving_avg_obs_fake_quant(x, on, on, *a, 0.01, -128, 127, 1, True, True)
    yt = ops.fused_moving_avg_obs_fake_quant(x.movedim(1, 0).contiguous(), on, on, *b, 0.01, -128, 127, 0, True, True)
    for p, q in zip(a, b):
        assert_same(p, q)
    assert_same(y, yt.movedim(0, 1))


def test_fused_errors_name_the_argument():
    x = torch.randn(4, 5)
    on = torch.tensor([1])
    bufs = _buffers("cpu")
    with pytest.raises(TypeError, match="zero_point must be an int32 tensor"):
        ops.fused_moving_avg_obs_fake_quant(x, on, on, *bufs[:3], bufs[3].long(), 0.01, 0, 255, 0)
    with pytest.raises(ValueError, match="quant_min"):
        ops.fused_moving_avg_obs_fake_quant(x, on, on, *bufs, 0.01, 5, 5, 0)
    with pytest.raises(ValueError, match="averaging_const"):
        ops.fused_moving_avg_obs_fake_quant(x, on, on, *bufs, 1.5, 0, 255, 0)
    with pytest.raises(ValueError, match="running_min must have 5 elements"):
        ops.fused_moving_avg_obs_fake_quant(x, on, on, *_buffers("cpu")[:1] * 2, *bufs[2:], 0.01, 0, 255, 1, True)
    with pytest.raises(IndexError, match="axis 2 is out of range"):
        ops.fused_moving_avg_obs_fake_quant(x, on, on, *bufs, 0.01, 0, 255, 2, True)
    with pytest.raises(ValueError, match="observer_on must have one element"):
        ops.fused_moving_avg_obs_fake_quant(x, torch.ones(2), on, *bufs, 0.01, 0, 255, 0)


@pytest.mark.parametrize("fused_backward", [False, True])
@pytest.mark.parametrize("device", DEVICES)
def test_fused_compiles_fullgraph(device, fused_backward, monkeypatch):
    # with and without the backward in plain PyTorch (fakequant.composite.compiled's
    # FUSED_BACKWARD_DEVICE_TYPES: CUDA's default)
    from fakequant.composite import compiled

    monkeypatch.setattr(compiled, "FUSED_BACKWARD_DEVICE_TYPES", (device,) if fused_backward else ())
    torch._dynamo.reset()

    def step(x, on, bufs):
        return ops.fused_moving_avg_obs_fake_quant(x, on, on, *bufs, 0.01, 0, 255, 0).square().sum()

    x = torch.randn(16, 8, device=device, requires_grad=True)
    on = torch.tensor([1], device=device)
    eager, compiled = _buffers(device), _buffers(device)
    f = torch.compile(step, fullgraph=True)
    for _ in range(3):
        ge, = torch.autograd.grad(step(x, on, eager), x)
        gc, = torch.autograd.grad(f(x, on, compiled), x)
        assert_same(gc, ge)
        for a, b in zip(compiled, eager):
            assert_same(a, b)
