"""The backward of every operator (``fakequant::mask_backward``, csrc/ops/mask_backward.cpp):
the gradient where the forward's mask is set, else 0; ONNX Runtime's ``FakeQuantGrad``, and a
packed mask unpacked to a bool tensor."""
from typing import Sequence

import torch

from ..composite import compiled
from ._common import _check_meta, _ops


@torch.library.register_fake("fakequant::mask_backward")
def _(grad, mask, mask_strides=None):
    _check_meta(grad, "grad", mask=mask)
    if mask_strides is None:
        return torch.empty_like(grad)
    return torch.empty_strided(grad.shape, mask_strides, dtype=grad.dtype, device=grad.device)


# --- autograd ------------------------------------------------------------------
# The formulas are C++ (csrc/ops/autograd.cpp, under the Autograd key): the
# gradient of every op returning (output, mask) is mask_backward(grad, mask,
# output.stride()), mask_backward's own is itself, and LSQ's is
# fake_quantize_lsq_backward's.


def mask_grad(grad: torch.Tensor, mask: torch.Tensor, output_stride: Sequence[int]) -> torch.Tensor:
    """The backward of an operator: ``grad`` where its ``mask`` is set, else 0, laid
    out with ``output_stride``, the stride of the operator's output, whose memory
    order a packed mask follows."""
    return _ops.mask_backward(grad, mask, list(output_stride))


def fake_quant_grad(dy: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """ONNX Runtime's ``FakeQuantGrad``: ``dy`` where ``mask``, else 0."""
    return _ops.mask_backward(dy, mask)


def mask_backward(grad: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``grad`` where ``mask`` else 0; ``mask`` is a bool tensor shaped like
    ``grad`` or a packed mask as returned by the ``torch.ops.fakequant`` ops."""
    return _ops.mask_backward(grad, mask)


def unpack_mask(mask: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
    """The bool mask, shaped and laid out like ``output``, of a packed mask that
    an operator returned with ``output``."""
    n = output.numel()
    bits = compiled.packed_bits(mask, n)
    unpacked = torch.empty_like(output, dtype=torch.bool)
    # Bit i belongs to element i in memory order, which is output's (dense) layout.
    unpacked.as_strided((n,), (1,)).copy_(bits)
    return unpacked
