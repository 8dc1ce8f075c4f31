"""Double backward through the mask backward keeps the forward's memory layout.

The first backward lays the incoming gradient out like the forward output
before it applies the packed mask (bit i belongs to element i in that memory
order); the backward of that backward must do the same with its own incoming
gradient. A contiguous vector against a channels_last (or transposed) forward
is the case that went wrong: bits applied in the wrong order.
"""
import pytest
import torch

import fakequant
from conftest import DEVICES

ops = torch.ops.fakequant


def _layouts():
    g = torch.Generator().manual_seed(3)
    yield "channels_last", torch.randn(2, 3, 4, 5, generator=g, dtype=torch.float64).contiguous(
        memory_format=torch.channels_last)
    yield "channels_last_3d", torch.randn(2, 3, 2, 4, 5, generator=g, dtype=torch.float64).contiguous(
        memory_format=torch.channels_last_3d)
    yield "transposed", torch.randn(6, 20, generator=g, dtype=torch.float64).t()
    yield "permuted", torch.randn(4, 5, 6, generator=g, dtype=torch.float64).permute(2, 0, 1)


LAYOUTS = list(_layouts())


def _affine(x):
    return ops.fake_quantize_affine(x, torch.tensor([0.05], device=x.device),
                                    torch.tensor([3], dtype=torch.int32, device=x.device), None, -20, 20)


def _affine_per_channel(x):
    c = x.size(1)
    return ops.fake_quantize_affine(x, torch.linspace(0.02, 0.08, c, device=x.device),
                                    torch.zeros(c, dtype=torch.int32, device=x.device), 1, -16, 15)


# Every operator whose backward is the mask backward: (y, packed mask) of input x.
OPS = {
    "fake_quantize_affine": _affine,
    "fake_quantize_affine per channel": _affine_per_channel,
    "fake_quantize_amax": lambda x: ops.fake_quantize_amax(x, torch.tensor(1.2, device=x.device), 4, False, True),
    "quantize_amax": lambda x: ops.quantize_amax(x, torch.tensor(0.9, device=x.device), 8, True, False),
    "fake_quantize_min_max": lambda x: ops.fake_quantize_min_max(
        x, torch.tensor(-0.7, device=x.device), torch.tensor(1.1, device=x.device), 5),
    "fake_quantize_fp8": lambda x: ops.fake_quantize_fp8(x, torch.tensor(1.3, device=x.device), 4, 3),
    # unsigned: the negative elements clip, so the mask has both values
    "fake_quantize_blockwise": lambda x: ops.fake_quantize_blockwise(x, 3, 3, True, False, 0, None),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(OPS))
@pytest.mark.parametrize("layout,base", LAYOUTS, ids=[name for name, _ in LAYOUTS])
def test_double_backward_follows_the_forward_layout(device, name, layout, base):
    op = OPS[name]
    x = base.to(device).requires_grad_()
    y, packed = op(x)
    mask = fakequant.unpack_mask(packed, y).to(x.dtype)
    assert 0 < int(mask.sum()) < mask.numel(), "the test needs a mask with both values"

    g = torch.randn(y.shape, dtype=y.dtype, device=device).requires_grad_()  # contiguous
    (gx,) = torch.autograd.grad(y, x, g, create_graph=True)
    assert torch.equal(gx.detach(), g.detach() * mask)

    for v in (torch.randn(gx.shape, dtype=gx.dtype, device=device),  # contiguous
              torch.randn(gx.shape, dtype=gx.dtype, device=device).contiguous(memory_format=torch.channels_last)
              if gx.dim() == 4 else torch.randn(gx.shape, dtype=gx.dtype, device=device).mT.contiguous().mT,
              torch.ones((), dtype=gx.dtype, device=device).expand(gx.shape)):  # expanded, as from a sum
        (gg,) = torch.autograd.grad(gx, g, v, retain_graph=True)
        assert torch.equal(gg, v * mask), f"{int((gg != v * mask).sum())} of {gg.numel()} elements wrong"


@pytest.mark.parametrize("name", list(OPS))
@pytest.mark.parametrize("layout,base", LAYOUTS, ids=[name for name, _ in LAYOUTS])
def test_gradgradcheck_over_layouts(name, layout, base):
    op = OPS[name]
    x = base.clone().requires_grad_()  # keeps the strides of base
    assert x.stride() == base.stride()
    # gradgradcheck's own grad_outputs are contiguous: against a non-contiguous
    # forward they exercise the re-striding of both backwards.
    assert torch.autograd.gradgradcheck(lambda t: op(t)[0], (x,), eps=1e-7, atol=1e-6)


def test_double_backward_of_the_public_wrapper_channels_last():
    """The case of the bug report: fakequant.fake_quantize_amax, channels_last float64,
    first backward with create_graph=True, then a contiguous vector."""
    x = (torch.randn(2, 3, 4, 5, dtype=torch.float64) * 2).contiguous(memory_format=torch.channels_last)
    x.requires_grad_()
    y = fakequant.fake_quantize_amax(x, 1.5)
    g = torch.randn(y.shape, dtype=torch.float64).requires_grad_()
    (gx,) = torch.autograd.grad(y, x, g, create_graph=True)
    v = torch.randn(gx.shape, dtype=torch.float64)
    (gg,) = torch.autograd.grad(gx, g, v)
    assert torch.equal(gg, v * (x.detach().abs() <= 1.5))
