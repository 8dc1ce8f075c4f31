"""Double backward through the mask backward keeps the forward's memory layout.

The first backward lays the incoming gradient out like the forward output
before it applies the packed mask (bit i belongs to element i in that memory
order); the backward of that backward must do the same with its own incoming
gradient. A contiguous vector against a channels_last (or transposed) forward
is the case that went wrong: bits applied in the wrong order. The operators are the op
table's (tests/op_table.py) whose backward is the mask backward.
"""
import pytest
import torch

import fakequant
import op_table
from conftest import DEVICES

ops = torch.ops.fakequant

LAYOUTS = [(layout, op_table.sample_input(layout, torch.float64, special=False))
           for layout in ("channels_last", "channels_last_3d", "transposed", "permuted")]
LAYOUT_IDS = [name for name, _ in LAYOUTS]

# Every sample call whose backward is the mask backward, with a packed mask that has both values.
OPS = op_table.variants(lambda e, v: e.backward == "mask" and e.name != "mask_backward" and v.packed and v.clips)
OP_IDS = op_table.variant_ids(OPS)


def _call(entry, variant, x):
    """(y, packed mask) of input x."""
    return entry.op(*variant.args(x))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("entry,variant", OPS, ids=OP_IDS)
@pytest.mark.parametrize("layout,base", LAYOUTS, ids=LAYOUT_IDS)
def test_double_backward_follows_the_forward_layout(device, entry, variant, layout, base):
    x = base.to(device).requires_grad_()
    y, packed = _call(entry, variant, x)
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


@pytest.mark.parametrize("entry,variant", OPS, ids=OP_IDS)
@pytest.mark.parametrize("layout,base", LAYOUTS, ids=LAYOUT_IDS)
def test_gradgradcheck_over_layouts(entry, variant, layout, base):
    x = base.clone().requires_grad_()  # keeps the strides of base
    assert x.stride() == base.stride()
    # gradgradcheck's own grad_outputs are contiguous: against a non-contiguous
    # forward they exercise the re-striding of both backwards.
    assert torch.autograd.gradgradcheck(lambda t: _call(entry, variant, t)[0], (x,), eps=1e-7, atol=1e-6)


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
