"""torch's fake-quant family as drop-ins: the _cachemask forms and the learnable (LSQ)
ops, against torch's own ops in the same process.

Our fake quantization divides by the scale (the contract); torch multiplies by
1 / scale, so outputs may differ by one step where x / scale is within rounding of
a tie. Those are counted, checked to be ties, and bounded; everything else (masks
away from ties) is compared bit for bit.
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

