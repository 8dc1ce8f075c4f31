"""The operators' backward in plain PyTorch (fakequant.composite.compiled.masked_grad), which
compiled graphs on CUDA take instead of a mask_backward call (Inductor fuses it): bit for bit
mask_backward's, for every layout of the op table's samples, every dtype, a gradient laid out
otherwise than the output, sizes that are not whole bytes, 0-d and empty tensors, and its own
gradient. Eager, no compile: tests/test_compiled.py runs it compiled (slow), tests/test_cuda.py on
a GPU."""
import pytest
import torch

import fakequant
import op_table
from conftest import DEVICES, DTYPES, assert_same
from fakequant.composite import compiled


def _case(x):
    """(output, packed mask, a gradient) of fake_quantize_amax on x: its mask bits follow the
    output's memory order."""
    y, mask = fakequant.fake_quantize_amax(x, 2.0, return_mask=True)
    g = torch.randn(x.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64).to(x.device, x.dtype)
    return y, mask, g


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", op_table.LAYOUTS)
def test_masked_grad_is_mask_backward(layout, dtype, device):
    x = op_table.sample_input(layout, dtype, device)
    y, mask, g = _case(x)
    expected = fakequant.ops.mask_grad(g, mask, y.stride())
    assert_same(compiled.masked_grad(g, mask, y.stride()), expected)
    # a gradient in another layout than the output (contiguous, or transposed) meets the same bits
    for other in (g.contiguous(), g.transpose(0, -1).contiguous().transpose(0, -1)):
        assert_same(compiled.masked_grad(other, mask, y.stride()), expected)
    # and the selection is the mask's: where a bit is clear +0, where set the gradient as it is
    bits = fakequant.ops.unpack_mask(mask, y)
    assert bits.any() and not bits.all()
    assert_same(compiled.masked_grad(g, mask, y.stride()), torch.where(bits, g, torch.zeros((), dtype=dtype,
                                                                                             device=device)))


@pytest.mark.parametrize("shape", [(), (0,), (3, 0, 2), (1,), (7,), (9,), (3, 5), (2, 3, 1, 5)])
def test_masked_grad_of_odd_and_empty_shapes(shape):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1)) * 3
    y, mask, g = _case(x)
    g = -g  # (signs of the gradient's zeros kept where set)
    assert_same(compiled.masked_grad(g, mask, y.stride()), fakequant.ops.mask_grad(g, mask, y.stride()))


def test_masked_grad_channels_last_with_one_channel():
    # a dimension of size 1 has an arbitrary stride: its place in the memory order does not matter
    x = torch.randn(2, 1, 3, 5).to(memory_format=torch.channels_last) * 3
    y, mask, g = _case(x)
    for stride in (y.stride(), (15, 1, 5, 1), (15, 100, 5, 1)):
        assert_same(compiled.masked_grad(g, mask, stride), fakequant.ops.mask_grad(g, mask, y.stride()))


def test_masked_grad_has_mask_backward_gradient():
    # double backward: the gradient of the selection is the selection (as mask_backward's is)
    x = op_table.sample_input("channels_last", torch.float64)
    y, mask, g = _case(x)
    g.requires_grad_()
    v = torch.randn_like(g)
    (ga,) = torch.autograd.grad(compiled.masked_grad(g, mask, y.stride()), g, v)
    (ge,) = torch.autograd.grad(fakequant.ops.mask_grad(g, mask, y.stride()), g, v)
    assert_same(ga, ge)


def test_fused_backward_only_while_compiling():
    x = torch.randn(4, 8, requires_grad=True)
    assert compiled.FUSED_BACKWARD_DEVICE_TYPES == ("cuda",)
    assert not compiled.fuses_backward(x)  # (eager: the operators' autograd formulas)
    assert not compiled.fuses_backward(x.detach())
