"""Drop-ins for torchao's PT2E fake-quant modules (``prepare_qat_pt2e``, ``convert_pt2e``):
torchao's classes (``torchao.quantization.pt2e``) with fakequant's arithmetic, as
:mod:`fakequant.ao` does for torch.ao's. Needs torchao. The one-line switch of a PT2E QAT
script, on a quantizer's config or on one ``QuantizationSpec``::

    quantizer.set_global(fakequant.ao.pt2e.use_fakequant(get_default_x86_inductor_quantization_config(is_qat=True)))
    QuantizationSpec(..., observer_or_fake_quant_ctr=fakequant.ao.pt2e.FusedMovingAvgObsFakeQuantize.with_args(...))
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from torchao.quantization.pt2e.fake_quantize import FakeQuantize as _AoFakeQuantize
from torchao.quantization.pt2e.fake_quantize import FusedMovingAvgObsFakeQuantize as _AoFused
from torchao.quantization.pt2e.learnable_fake_quantize import LearnableFakeQuantize as _AoLearnable

from ._forward import FakeQuantizeForward, FusedForward, LearnableForward, swap_classes

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

# A torchao QuantizationConfig or QuantizationSpec (dataclasses).
_Config = TypeVar("_Config", bound="DataclassInstance")

__all__ = ["FakeQuantize", "FusedMovingAvgObsFakeQuantize", "LearnableFakeQuantize", "use_fakequant"]


class FakeQuantize(FakeQuantizeForward, _AoFakeQuantize):
    """``torchao.quantization.pt2e.FakeQuantize`` with fakequant's fake quantization."""


class FusedMovingAvgObsFakeQuantize(FusedForward, _AoFused):
    """``torchao.quantization.pt2e.FusedMovingAvgObsFakeQuantize`` with
    :func:`fakequant.ops.fused_moving_avg_obs_fake_quant`."""


class LearnableFakeQuantize(LearnableForward, _AoLearnable):
    """``torchao.quantization.pt2e.learnable_fake_quantize.LearnableFakeQuantize`` (LSQ+)
    with fakequant's learnable operators."""

    if TYPE_CHECKING:  # (torchao's, untyped: the type checker sees torch.ao's base here)
        _initialized: bool

        def _initialize_or_update_qparams(self, scale: torch.Tensor, zero_point: torch.Tensor) -> None: ...

    def _observe(self, X: torch.Tensor) -> None:
        # torchao's: the observer sets (or first initialises) scale and zero point while
        # observer_enabled, and once in any case.
        if self.observer_enabled[0] == 1 or not self._initialized:
            self.activation_post_process(X.detach())
            self._initialize_or_update_qparams(*self.activation_post_process.calculate_qparams())


_SWAP = {_AoFakeQuantize: FakeQuantize, _AoFused: FusedMovingAvgObsFakeQuantize, _AoLearnable: LearnableFakeQuantize}


def _swap_spec(spec: Any) -> Any:
    ctr = getattr(spec, "observer_or_fake_quant_ctr", None)
    if ctr is None:
        return spec
    return dataclasses.replace(spec, observer_or_fake_quant_ctr=swap_classes(ctr, _SWAP))


def use_fakequant(config: _Config) -> _Config:
    """A quantizer's ``QuantizationConfig`` (or one ``QuantizationSpec``) with torchao's
    fake-quant classes replaced by fakequant's, with the same arguments."""
    if not dataclasses.is_dataclass(config):
        raise TypeError(
            f"fakequant: config must be a torchao QuantizationConfig or QuantizationSpec, got {type(config).__name__}")
    if hasattr(config, "observer_or_fake_quant_ctr"):
        return _swap_spec(config)
    changes = {f.name: _swap_spec(getattr(config, f.name)) for f in dataclasses.fields(config)
               if dataclasses.is_dataclass(getattr(config, f.name))}
    return dataclasses.replace(config, **changes)
