"""The forwards of fakequant's fake-quant modules, shared by the torch.ao family
(:mod:`fakequant.ao`) and the torchao PT2E family (:mod:`fakequant.ao.pt2e`): each is a
mixin placed before the framework's class, whose constructor, buffers, ``with_args``,
``calculate_qparams`` and state_dict it keeps; only the arithmetic moves to fakequant's
operators."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Optional

import torch

from .. import _core, ops

if TYPE_CHECKING:
    # The torch.ao classes the mixins below are placed before (base classes for the type
    # checker only: at run time the mixins derive from object). torchao's PT2E classes
    # have the same attributes.
    from torch.ao.quantization import FakeQuantize as _FakeQuantizeBase
    from torch.ao.quantization import FusedMovingAvgObsFakeQuantize as _FusedBase
    from torch.ao.quantization._learnable_fake_quantize import _LearnableFakeQuantize as _LearnableBase
else:
    _FakeQuantizeBase = _FusedBase = _LearnableBase = object

_SYMMETRIC = (torch.per_tensor_symmetric, torch.per_channel_symmetric)
_PER_CHANNEL = (torch.per_channel_symmetric, torch.per_channel_affine, torch.per_channel_affine_float_qparams)


class FakeQuantizeForward(_FakeQuantizeBase):
    """Observer (any), then fake quantization with its scale and zero point."""

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        if torch.jit.is_scripting():
            return self._scripted_forward(X)
        return self._eager_forward(X)

    def _update_qparams(self, X: torch.Tensor) -> None:
        """The observer, then its scale and zero point into the buffers (TorchScript
        compiles it too)."""
        self.activation_post_process(X.detach())
        scale, zero_point = self.calculate_qparams()
        scale, zero_point = scale.to(self.scale.device), zero_point.to(self.zero_point.device)
        if self.scale.shape != scale.shape:  # per-channel buffers start with one element
            self.scale.resize_(scale.shape)
            self.zero_point.resize_(zero_point.shape)
        self.scale.copy_(scale)
        self.zero_point.copy_(zero_point)

    def _scripted_forward(self, X: torch.Tensor) -> torch.Tensor:
        # What torch.jit.script compiles: torch.ao's FakeQuantize.forward, with fakequant's
        # operator.
        if self.observer_enabled[0] == 1:
            self._update_qparams(X)
        if self.fake_quant_enabled[0] == 1:
            axis: Optional[int] = self.ch_axis if self.is_per_channel else None
            X = ops.scripted_fake_quantize_affine(X, self.scale, self.zero_point, axis,
                                                  self.activation_post_process.quant_min,
                                                  self.activation_post_process.quant_max)
        return X

    @torch.jit.unused
    def _eager_forward(self, X: torch.Tensor) -> torch.Tensor:
        observer = self.activation_post_process
        # (an export's graph is for inference: no observing; _core.flag_on)
        if not _core.exporting() and self.observer_enabled[0] == 1:
            self._update_qparams(X)
        if _core.flag_on(self.fake_quant_enabled):
            if self.is_per_channel:  # (float qparams' zero points: torch's rule for them)
                X = ops.fake_quantize_per_channel_affine(X, self.scale, self.zero_point, self.ch_axis,
                                                         observer.quant_min, observer.quant_max)
            else:
                X = ops.fake_quantize_affine(X, self.scale, self.zero_point, None, observer.quant_min,
                                             observer.quant_max)
        return X


class FusedForward(_FusedBase):
    """The moving-average min/max observer and fake quantization as one operator."""

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        if torch.jit.is_scripting():
            observer = self.activation_post_process
            return ops.scripted_fused_moving_avg_obs_fake_quant(
                X, self.observer_enabled, self.fake_quant_enabled, observer.min_val, observer.max_val, self.scale,
                self.zero_point, observer.averaging_constant, observer.quant_min, observer.quant_max, self.ch_axis,
                self.is_per_channel, self.is_symmetric_quant)
        return self._eager_forward(X)

    @torch.jit.unused
    def _eager_forward(self, X: torch.Tensor) -> torch.Tensor:
        observer = self.activation_post_process
        return ops.fused_moving_avg_obs_fake_quant(
            X, self.observer_enabled, self.fake_quant_enabled, observer.min_val, observer.max_val, self.scale,
            self.zero_point, observer.averaging_constant, observer.quant_min, observer.quant_max, self.ch_axis,
            self.is_per_channel, self.is_symmetric_quant)


class LearnableForward(_LearnableBase):
    """LSQ+: scale and zero point are parameters; the gradients of both times
    ``1 / sqrt(numel * quant_max)`` with ``use_grad_scaling``. Each family initialises
    them from its observer in its own way (``_observe``), then fake-quantizes here."""

    if TYPE_CHECKING:
        def _observe(self, X: torch.Tensor) -> None: ...

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        if not _core.exporting():
            self._observe(X)
        if _core.flag_on(self.fake_quant_enabled):
            if self.qscheme in _SYMMETRIC and not _core.exporting():
                self.zero_point.data.zero_()
            grad_factor = 1.0 / (X.numel() * self.quant_max) ** 0.5 if self.use_grad_scaling else 1.0
            if self.qscheme in _PER_CHANNEL:
                X = ops._fake_quantize_learnable_per_channel_affine(
                    X, self.scale, self.zero_point, self.ch_axis, self.quant_min, self.quant_max, grad_factor)
            else:
                X = ops._fake_quantize_learnable_per_tensor_affine(
                    X, self.scale, self.zero_point, self.quant_min, self.quant_max, grad_factor)
        return X


def swap_classes(wrapper: Any, mapping: Mapping[Any, Any]) -> Any:
    """A ``with_args`` constructor of ``mapping``'s replacement for the class ``wrapper``
    builds, with the same arguments; ``wrapper`` itself when its class has none (an
    observer, say) or when it is no ``with_args`` wrapper or class."""
    if isinstance(wrapper, type):
        return mapping.get(wrapper, wrapper)
    partial: Any = getattr(wrapper, "p", None)
    cls = getattr(partial, "func", None)
    if cls not in mapping or partial.args:
        return wrapper
    swapped = mapping[cls].with_args(**partial.keywords)
    callable_args = getattr(wrapper, "callable_args", None)
    if callable_args:
        swapped = swapped.with_callable_args(**callable_args)
    return swapped
