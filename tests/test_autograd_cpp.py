"""The autograd formulas registered in C++ (csrc/ops/autograd.cpp) and what makes a
call cheap: a node only where one is needed, mask_backward's mask_strides, Python
numbers as cached parameter tensors, and compiled autograd taking the nodes."""
import pytest
import torch

import fakequant
import op_table
from conftest import DEVICES, assert_same

ops = torch.ops.fakequant


# Every sample call of the op table (tests/op_table.py) whose backward is the mask's.
MASKED = op_table.variants(lambda e, v: e.backward == "mask" and e.name != "mask_backward")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("entry,variant", MASKED, ids=op_table.variant_ids(MASKED))
def test_gradient_is_grad_where_mask(device, entry, variant):
    # Every masked op: grad_fn from C++, the mask without a gradient, and the input's
    # gradient grad where the mask is set, whatever layout the gradient arrives in.
    x = (torch.randn(6, 8, device=device) * 3).t().requires_grad_()  # a transposed output layout
    y, mask = entry.op(*variant.args(x))
    assert "MaskedFunction" in y.grad_fn.name()  # the C++ node
    assert not mask.requires_grad
    for grad in (torch.randn(8, 6, device=device), torch.randn(6, 8, device=device).t(),
                 torch.randn(1, 1, device=device).expand(8, 6)):
        (got,) = torch.autograd.grad(y, x, grad, retain_graph=True)
        assert_same(got, ops.mask_backward(grad.contiguous(), mask, list(y.stride())))
        bits = mask if mask.dtype == torch.bool else fakequant.unpack_mask(mask, y)
        assert_same(got, torch.where(bits, grad, torch.zeros_like(grad)))


@pytest.mark.parametrize("device", DEVICES)
def test_node_only_where_needed(device):
    x = torch.randn(4, 5, device=device)
    amax = torch.tensor(1.0, device=device, requires_grad=True)
    y, _ = ops.fake_quantize_amax(x, amax.detach())
    assert y.grad_fn is None and not y.requires_grad
    with torch.no_grad():
        y, _ = ops.fake_quantize_amax(x.requires_grad_(), amax)
    assert y.grad_fn is None
    # A parameter that requires grad makes the output require grad (as the Python
    # formulas did); its gradient is None: amax has no gradient in this op.
    y, _ = ops.fake_quantize_amax(x.detach(), amax)
    assert y.requires_grad
    (g,) = torch.autograd.grad(y.sum(), amax, allow_unused=True)
    assert g is None


def test_second_backward_through_freed_graph_raises():
    x = torch.randn(10, requires_grad=True)
    y, _ = ops.fake_quantize_amax(x, torch.tensor(1.0))
    y.sum().backward()
    with pytest.raises(RuntimeError, match="second time"):
        y.sum().backward()


@pytest.mark.parametrize("device", DEVICES)
def test_mask_backward_lays_out_by_mask_strides(device):
    x = torch.randn(2, 3, 4, 5, device=device).to(memory_format=torch.channels_last)
    y, mask = ops.fake_quantize_amax(x, torch.tensor(1.0, device=device))
    grad = torch.randn(2, 3, 4, 5, device=device)
    out = ops.mask_backward(grad, mask, list(y.stride()))
    assert out.stride() == y.stride()
    assert_same(out, torch.where(fakequant.unpack_mask(mask, y), grad, torch.zeros_like(grad)))


@pytest.mark.parametrize("strides, match", [
    ([1, 2], "mask_strides must have 3 entries"),
    ([20, 5, -1], "must not be negative"),
    ([20, 5, 2], "densely without overlap"),
    ([1, 1, 1], "densely without overlap"),
])
def test_bad_mask_strides(strides, match):
    grad = torch.randn(3, 4, 5)
    mask = ops.fake_quantize_amax(grad, torch.tensor(1.0))[1]
    with pytest.raises(ValueError, match=match):
        ops.mask_backward(grad, mask, strides)


# --- Python numbers as parameters ---------------------------------------------------


def test_python_numbers_become_one_cached_tensor():
    from fakequant.ops import _SCALE_ZERO_POINT

    x = torch.randn(100)
    a = _SCALE_ZERO_POINT(x, 0.02, 3)
    assert _SCALE_ZERO_POINT(x, 0.02, 3) is a
    assert a[0].dtype == torch.float32 and a[1].dtype == torch.int32
    assert _SCALE_ZERO_POINT(x, 0.02, 4) is not a
    # results equal those with tensors made on every call
    assert_same(fakequant.fake_quantize_per_tensor_affine(x, 0.02, 3, -128, 127),
                fakequant.fake_quantize_per_tensor_affine(x, torch.tensor(0.02), torch.tensor(3), -128, 127))


def test_cached_number_made_under_inference_mode_trains():
    # LSQ saves its scale for backward: a cached scale must not be an inference tensor.
    x = torch.randn(64)
    with torch.inference_mode():
        fakequant.fake_quantize_lsq(x, 0.0371, 0)
    xr = x.clone().requires_grad_()
    fakequant.fake_quantize_lsq(xr, 0.0371, 0).sum().backward()
    assert xr.grad is not None


def test_numbers_under_fake_mode_are_fake():
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    with FakeTensorMode():
        x = torch.randn(8)
        y = fakequant.fake_quantize_amax(x, 1.25)
    assert isinstance(y, FakeTensor)
    for cache in (fakequant.ops._AMAX.cache,):
        assert not any(isinstance(t, FakeTensor) for v in cache.values() for t in v)


def test_bad_numbers_still_raise():
    x = torch.randn(8)
    with pytest.raises(TypeError, match="scale must be a tensor or a number"):
        fakequant.fake_quantize_per_tensor_affine(x, "0.1", 0, -128, 127)
    with pytest.raises(ValueError, match="zero_point must be an integer"):
        fakequant.fake_quantize_per_tensor_affine(x, 0.1, 0.5, -128, 127)
    with pytest.raises(ValueError, match="scale must be positive"):
        fakequant.fake_quantize_per_tensor_affine(x, -0.1, 0, -128, 127)
    with pytest.raises(TypeError, match="num_bits must be an int"):
        fakequant.fake_quantize_amax(x, 1.0, num_bits=8.0)


# --- compiled autograd ----------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_compiled_autograd_takes_the_nodes(device):
    from torch._dynamo import compiled_autograd

    x = torch.randn(8, 16, device=device, requires_grad=True)
    amax = torch.tensor(1.0, device=device)
    scale = torch.tensor(0.05, device=device, requires_grad=True)

    def loss():
        y = fakequant.fake_quantize_amax(x, amax) * 2
        return (y + fakequant.fake_quantize_lsq(x, scale, 0, None, -128, 127, 1.0)).square().sum()

    loss().backward()
    expected = x.grad.clone(), scale.grad.clone()
    x.grad = scale.grad = None
    torch._dynamo.reset()
    with compiled_autograd._enable(torch.compile(backend="eager")):
        loss().backward()
    assert_same(x.grad, expected[0])
    assert_same(scale.grad, expected[1])
