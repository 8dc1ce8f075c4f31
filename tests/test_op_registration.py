"""The operators as the PyTorch stack sees them: torch.library.opcheck (schema,
fake kernels, autograd registration, AOT dispatch), gradcheck in float64, and
torch.compile(fullgraph=True)."""
import pytest
import torch

import fakequant
import reference as ref
from conftest import DEVICES

ops = torch.ops.fakequant


def _inputs(device):
    x = torch.randn(4, 3, 5, 6, device=device, requires_grad=True)
    xcl = torch.randn(4, 3, 5, 6, device=device).to(memory_format=torch.channels_last).requires_grad_()
    xt = torch.randn(6, 5, device=device).t().requires_grad_()
    s1 = torch.tensor([0.02], device=device)
    z1 = torch.tensor([1], dtype=torch.int32, device=device)
    s3 = torch.tensor([0.01, 0.02, 0.03], device=device)
    z3 = torch.tensor([0, -2, 4], dtype=torch.int32, device=device)
    amax_c = torch.rand(1, 3, 1, 1, device=device) + 0.5
    return x, xcl, xt, s1, z1, s3, z3, amax_c


def opcheck_cases(device):
    x, xcl, xt, s1, z1, s3, z3, amax_c = _inputs(device)
    amax = torch.tensor(1.5, device=device)
    lo, hi = torch.tensor(-1.0, device=device), torch.tensor(2.0, device=device)
    packed = ops.fake_quantize_amax(x.detach(), amax, 8, False, True)[1]
    return [
        (ops.fake_quantize_affine, (x, s1, z1, None, -128, 127)),
        (ops.fake_quantize_affine, (xcl, s3, z3, 1, -128, 127)),
        (ops.fake_quantize_affine, (xt, s1, z1, None, 0, 255, False)),
        (ops.fake_quantize_amax, (x, amax, 8, False, True)),
        (ops.fake_quantize_amax, (xcl, amax_c, 4, True, False)),
        (ops.quantize_amax, (x, amax_c, 8, False, True)),
        (ops.fake_quantize_min_max, (xt, lo, hi, 8)),
        (ops.mask_backward, (torch.randn(4, 3, 5, 6, device=device, requires_grad=True), packed)),
        (ops.mask_backward, (torch.randn(3, 4, device=device, requires_grad=True), torch.rand(3, 4, device=device) > 0.5)),
        # a contiguous gradient for a channels_last output: laid out as the output, bits in its order
        (ops.mask_backward, (torch.randn(4, 3, 5, 6, device=device, requires_grad=True),
                             ops.fake_quantize_amax(xcl.detach(), amax, 8, False, True)[1], list(xcl.stride()))),
        # FP8 cases (FP8 work adds here)
        (ops.fake_quantize_fp8, (x, amax, 4, 3)),
        (ops.fake_quantize_fp8, (xcl, amax_c, 5, 2)),
        (ops.fake_quantize_fp8, (xt, amax, 4, 3)),
        # block-wise cases (block-wise work adds here)
        (ops.fake_quantize_blockwise, (x, 4, 8, False, True, 0, None)),  # ragged: 4 + 2
        (ops.fake_quantize_blockwise, (xcl, 3, 4, False, True, 2, torch.tensor(2.0, device=device))),
        (ops.fake_quantize_blockwise, (xt, 2, 4, True, False, 0, None)),
        (ops.fake_quantize_blockwise, (x, 16, 8, False, True, 4, None)),
        # LSQ cases (LSQ work adds here)
        (ops.fake_quantize_lsq, (x, s1.clone().requires_grad_(), z1, None, -128, 127, 0.5)),
        (ops.fake_quantize_lsq, (xcl, s3.clone().requires_grad_(), z3.float().requires_grad_(), 1, -8, 7)),
        (ops.fake_quantize_lsq, (xt, s1, z1, None, 0, 255, 1.0)),
        (ops.fake_quantize_lsq_backward, (torch.randn(4, 3, 5, 6, device=device), x.detach(), s3, z3, 1, -8, 7, 0.25)),
        (ops.fake_quantize_lsq_backward, (torch.randn(6, 5, device=device).t(), xt.detach(), s1, z1, None, 0, 255, 1.0)),
        # torch's fused observer (its autograd is an autograd.Function: the op mutates its buffers)
        (ops.fused_moving_avg_obs_fake_quant, (x.detach(), torch.tensor([1], device=device),
                                               torch.tensor([1], device=device), *_fused_buffers(device, 1),
                                               0.01, 0, 255, 0, False, False)),
        (ops.fused_moving_avg_obs_fake_quant, (xcl.detach(), torch.tensor([1], device=device),
                                               torch.tensor([0], device=device), *_fused_buffers(device, 3),
                                               0.01, -128, 127, 1, True, True)),
    ]


def _fused_buffers(device, n):
    return (torch.full((n,), float("inf"), device=device), torch.full((n,), float("-inf"), device=device),
            torch.ones(n, device=device), torch.zeros(n, dtype=torch.int32, device=device))


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_every_op(device):
    checked = set()
    for op, args in opcheck_cases(device):
        torch.library.opcheck(op, args)
        checked.add(op)
    registered = {getattr(ops, name) for name in ops}
    assert registered == checked, f"ops without an opcheck case: {registered - checked}"


# gradcheck: a fake quantizer is piecewise constant, and its backward is the
# straight-through estimator. With steps far below gradcheck's finite-difference
# eps, the numerical Jacobian of the quantizer is that of the STE (1 inside the
# range, 0 outside), so gradcheck checks the backward against the forward.


def _away_from(x, edges, margin):
    for e in edges:
        x = torch.where((x - e).abs() < margin, x + 3 * margin, x)
    return x


@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck_affine(device):
    s = 2.0**-40  # float32 scale; steps of 1e-12
    x = (torch.rand(40, dtype=torch.float64, device=device) - 0.5) * 2**-7
    x = _away_from(x, [-(2**31) * s, (2**31 - 1) * s], 1e-4).requires_grad_()  # some outside the range
    scale = torch.tensor([s], device=device)
    zp = torch.tensor([0], device=device)
    fn = lambda t: fakequant.fake_quantize_affine(t, scale, zp, None, -(2**31) + 1, 2**31 - 1)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x,), eps=1e-6, atol=1e-5)
    assert torch.autograd.gradgradcheck(fn, (x,), eps=1e-6, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck_amax_and_min_max(device):
    # 16 bits over [-1, 1]: steps of 3e-5, eps 1e-2, so the quotients are 1 within 0.3%.
    x = (torch.rand(60, dtype=torch.float64, device=device) - 0.5) * 4
    x = _away_from(x, [-1.0, 1.0, -0.5, 1.5], 0.03).requires_grad_()
    amax = lambda t: fakequant.fake_quantize_amax(t, 1.0, num_bits=16)  # noqa: E731
    minmax = lambda t: fakequant.fake_quantize_min_max(t, -0.5, 1.5, num_bits=16)  # noqa: E731
    # (quantize_amax's backward is the mask too, as pytorch-quantization's
    # tensor_quant: not the derivative of x / s, so it is not gradchecked.)
    for fn in (amax, minmax):
        assert torch.autograd.gradcheck(fn, (x,), eps=1e-2, atol=1e-2)


@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck_mask_backward(device):
    grad = torch.randn(5, 7, dtype=torch.float64, device=device, requires_grad=True)
    mask = torch.rand(5, 7, device=device) > 0.5
    packed = ops.fake_quantize_amax(torch.randn(5, 7, dtype=torch.float64, device=device), torch.tensor(1.0, device=device), 8, False, True)[1]
    for m in (mask, packed):
        assert torch.autograd.gradcheck(lambda g: ops.mask_backward(g, m), (grad,))
        assert torch.autograd.gradgradcheck(lambda g: ops.mask_backward(g, m), (grad,))


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph(device):
    scale = torch.tensor([0.05, 0.1, 0.2], device=device)
    zp = torch.tensor([0, 1, -1], dtype=torch.int32, device=device)
    amax = torch.tensor([[1.0], [2.0], [3.0]], device=device)

    def qat_step(x, w):
        xq = fakequant.fake_quantize_amax(x, 2.0, narrow_range=False)
        wq = fakequant.fake_quantize_amax(w, amax)
        h = xq @ wq.t()
        h = fakequant.fake_quantize_per_channel_affine(h, scale, zp, 1, -128, 127)
        return fakequant.fake_quantize_min_max(h, -1.0, 4.0).relu().sum()

    x = torch.randn(8, 5, device=device, requires_grad=True)
    w = torch.randn(3, 5, device=device, requires_grad=True)
    compiled = torch.compile(qat_step, fullgraph=True, dynamic=False)
    out_c = compiled(x, w)
    gx_c, gw_c = torch.autograd.grad(out_c, (x, w))
    out_e = qat_step(x, w)
    gx_e, gw_e = torch.autograd.grad(out_e, (x, w))
    assert torch.allclose(out_c, out_e) and torch.allclose(gx_c, gx_e) and torch.allclose(gw_c, gw_e)


def test_version_mismatch_names_both_versions(monkeypatch):
    from fakequant import _build, _extension

    monkeypatch.setattr(_build, "TORCH_VERSION", "1.0.0+fake")
    with pytest.raises(ImportError, match=r"1\.0\.0\+fake.*" + torch.__version__.replace("+", r"\+")):
        _extension.check_build()


def test_build_info():
    assert fakequant.BUILT_FOR_TORCH == torch.__version__
    assert ref.AMAX_EPSILON == 2.0**-24
