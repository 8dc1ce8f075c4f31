"""Drop-ins for torch.ao's fake-quant modules (eager QAT: ``prepare_qat``, ``convert``).

:class:`FakeQuantize`, :class:`FusedMovingAvgObsFakeQuantize` and
:class:`LearnableFakeQuantize` are torch's classes (constructor, ``with_args``,
``calculate_qparams``, buffers and state_dict keys) with the arithmetic of fakequant's
operators: ``rint(x / scale)`` as ONNX QuantizeLinear computes it, a one-bit mask saved for
backward, the fused observer in one operator without a device synchronisation, LSQ in
float16/bfloat16 too. The one-line switch of a torch.ao QAT script::

    model.qconfig = fakequant.ao.use_fakequant(torch.ao.quantization.get_default_qat_qconfig("x86"))

For torchao's PT2E QAT (``prepare_qat_pt2e``) use :mod:`fakequant.ao.pt2e`, whose classes
derive from torchao's.
"""
from __future__ import annotations

import torch
from torch.ao.quantization import FakeQuantize as _TorchFakeQuantize
from torch.ao.quantization import FusedMovingAvgObsFakeQuantize as _TorchFused
from torch.ao.quantization import QConfig
from torch.ao.quantization._learnable_fake_quantize import _LearnableFakeQuantize as _TorchLearnable

from ._forward import FakeQuantizeForward, FusedForward, LearnableForward, swap_classes

__all__ = ["FakeQuantize", "FusedMovingAvgObsFakeQuantize", "LearnableFakeQuantize", "use_fakequant"]


class FakeQuantize(FakeQuantizeForward, _TorchFakeQuantize):
    """``torch.ao.quantization.FakeQuantize`` with fakequant's fake quantization."""


class FusedMovingAvgObsFakeQuantize(FusedForward, _TorchFused):
    """``torch.ao.quantization.FusedMovingAvgObsFakeQuantize`` with
    :func:`fakequant.ops.fused_moving_avg_obs_fake_quant`."""


class LearnableFakeQuantize(LearnableForward, _TorchLearnable):
    """``torch.ao.quantization._learnable_fake_quantize._LearnableFakeQuantize`` (LSQ+) with
    fakequant's learnable operators."""

    # Buffers registered by torch's constructor (torch declares no type for them).
    static_enabled: torch.Tensor
    eps: torch.Tensor

    def _observe(self, X: torch.Tensor) -> None:
        # torch's: the observer sets scale and zero point while static_enabled, else the
        # scale is kept above eps.
        if self.static_enabled[0] == 1:
            self.activation_post_process(X.detach())
            scale, zero_point = self.activation_post_process.calculate_qparams()
            self.scale.data.copy_(scale.to(self.scale.device))
            self.zero_point.data.copy_(zero_point.to(self.zero_point.device))
        else:
            self.scale.data.clamp_(min=self.eps.item())


_SWAP = {_TorchFakeQuantize: FakeQuantize, _TorchFused: FusedMovingAvgObsFakeQuantize,
         _TorchLearnable: LearnableFakeQuantize}


def use_fakequant(qconfig: QConfig) -> QConfig:
    """``qconfig`` with torch's fake-quant classes replaced by fakequant's, with the same
    arguments (observers and other classes stay)."""
    if not isinstance(qconfig, QConfig):
        raise TypeError(f"fakequant: qconfig must be a torch.ao.quantization.QConfig, got {type(qconfig).__name__}")
    return QConfig(activation=swap_classes(qconfig.activation, _SWAP), weight=swap_classes(qconfig.weight, _SWAP))
