"""The state a :class:`~fakequant.nn.TensorQuantizer` keeps: its ``_amax`` and
``_pre_quant_scale`` buffers, and what sets them: the user (the ``amax`` and
``pre_quant_scale`` setters), calibration (``load_calib_amax``) and checkpoints
(``load_state_dict``, which makes room for buffers of another shape). ``model.half()``
leaves amax in float32. ``init_learn_amax`` starts the learned range from amax."""
from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Union

import torch
from torch import nn

from .. import _core
from ..calib import HistogramCalibrator, MaxCalibrator
from ..tensor_quant import QuantSpec
from .clip import Clip

if TYPE_CHECKING:
    import numpy as np

    # What the amax and pre_quant_scale setters take: anything torch.tensor reads.
    _TensorLike = Union[torch.Tensor, float, Sequence[float], np.ndarray]

__all__: List[str] = []


def _as_float_tensor(value: Any, name: str) -> torch.Tensor:
    if isinstance(value, bool):
        raise TypeError(f"{name} must be a number, an array or a tensor, got a bool")
    if isinstance(value, torch.Tensor):
        t = value.detach()
    else:
        try:
            t = torch.tensor(value)
        except (TypeError, ValueError, RuntimeError) as e:
            raise TypeError(f"{name}={value!r} cannot be read as a tensor: {e}") from None
    return t.to(torch.float32) if not t.is_floating_point() or t.dtype != torch.float32 else t


class _AmaxState(nn.Module):
    """The base of :class:`~fakequant.nn.TensorQuantizer` that holds its buffers (see the module)."""

    # Set by TensorQuantizer.__init__ (clip: the clip stage, with learn_amax only).
    _spec: QuantSpec
    clip: Clip
    _calibrator: Optional[Union[HistogramCalibrator, MaxCalibrator]]
    _quantizes_weight: bool

    @property
    def pre_quant_scale(self) -> Optional[torch.Tensor]:
        return self._buffers.get("_pre_quant_scale")

    @pre_quant_scale.setter
    def pre_quant_scale(self, value: Optional[_TensorLike]) -> None:
        if value is None:
            self._buffers.pop("_pre_quant_scale", None)
            return
        value = _as_float_tensor(value, "pre_quant_scale")
        old = self._buffers.get("_pre_quant_scale")
        if old is None:
            self.register_buffer("_pre_quant_scale", value.clone())
        elif old.shape != value.shape:
            raise ValueError(f"pre_quant_scale has shape {tuple(old.shape)}; cannot set a value of shape "
                             f"{tuple(value.shape)}")
        else:
            old.copy_(value)

    @property
    def amax(self) -> Optional[torch.Tensor]:
        """The ``_amax`` buffer, or None while amax is dynamic."""
        return self._buffers.get("_amax")

    @amax.setter
    def amax(self, value: Optional[_TensorLike]) -> None:
        # None returns the quantizer to dynamic amax.
        if value is None:
            self._buffers.pop("_amax", None)
            return
        value = _as_float_tensor(value, "amax")
        old = self._buffers.get("_amax")
        if old is None:
            self.register_buffer("_amax", value.clone().to(self._state_device(value.device)))
        elif old.shape != value.shape:
            raise ValueError(f"amax has shape {tuple(old.shape)}; cannot set a value of shape {tuple(value.shape)} "
                             "(set amax = None first to change its shape)")
        else:
            old.copy_(value)

    # -- amax ------------------------------------------------------------------------
    def _state_device(self, default: torch.device) -> torch.device:
        for t in list(self._buffers.values()) + list(self.parameters()):
            if t is not None:
                return t.device
        return default

    def _set_amax_buffer(self, value: _TensorLike) -> None:
        """Sets ``_amax`` to ``value``, whatever the current shape."""
        value = _as_float_tensor(value, "amax").clone()
        old = self._buffers.get("_amax")
        if old is not None and old.shape == value.shape:
            old.copy_(value)
        else:
            device = old.device if old is not None else value.device
            self._buffers.pop("_amax", None)
            self.register_buffer("_amax", value.to(device))

    def load_calib_amax(self, *args: Any, strict: bool = True, **kwargs: Any) -> None:
        """Sets amax from the calibrator: ``compute_amax(*args, **kwargs)``.

        Args:
            strict: if True (default) a calibrator that has seen nothing raises
                RuntimeError; if False it warns and the quantizer keeps its amax
                (dynamic if it had none).
        """
        calibrator = getattr(self, "_calibrator", None)
        if calibrator is None:
            raise RuntimeError("this quantizer has no calibrator")
        if isinstance(calibrator, MaxCalibrator):
            method = kwargs.pop("method", args[0] if args else "max")
            if method != "max" or len(args) > 1 or kwargs:
                raise TypeError(f"a MaxCalibrator computes the max only; got method={method!r}, "
                                f"extra arguments {args[1:]} {sorted(kwargs)}")
            calib_amax = calibrator.compute_amax()
        else:
            calib_amax = calibrator.compute_amax(*args, **kwargs)
        if calib_amax is None:
            message = "Calibrator returned None: it has not collected any tensor"
            if strict:
                raise RuntimeError(message + "; pass strict=False to load_calib_amax() to skip it")
            warnings.warn(message + "; amax left unchanged", stacklevel=2)
            return
        self._load_calibrated_amax(calib_amax)

    def _new_calibrator(self, histogram: bool) -> Union[HistogramCalibrator, MaxCalibrator]:
        """A calibrator for this quantizer's format: a ``HistogramCalibrator`` or a ``MaxCalibrator``."""
        spec = self._spec
        if histogram:
            return HistogramCalibrator(num_bits=spec.num_bits, axis=spec.axis, unsigned=spec.unsigned,
                                       narrow_range=spec.narrow_range)
        return MaxCalibrator(num_bits=spec.num_bits, axis=spec.axis, unsigned=spec.unsigned)

    def _load_calibrated_amax(self, calib_amax: torch.Tensor, name: str = "quantizer") -> bool:
        """Sets ``_amax`` from calibration; False where it was left dynamic instead.

        An amax <= AMAX_EPSILON (a zero-initialised layer, collapsed activations) makes
        the outputs where it applies 0 and masks their gradient (once the values move off
        0): a weight could never train away from it. It warns; a weight quantizer is left
        dynamic (amax computed from the weight at each forward, so it follows the weight as
        it trains) and its ``_amax`` removed; other quantizers take it as calibrated."""
        degenerate = int((calib_amax <= _core.AMAX_EPSILON).sum())
        if degenerate:
            where = f"{name}: calibration gave amax <= 2^-24 in {degenerate} of {calib_amax.numel()} entries"
            if getattr(self, "_quantizes_weight", False):  # (quantizers pickled before it existed)
                warnings.warn(f"{where} (a zero or constant weight?); left dynamic, so that the weight can train "
                              "(amax computed from the weight at each forward until calibrated again)", stacklevel=3)
                self.amax = None
                return False
            warnings.warn(f"{where}: there its outputs are 0 and their gradient is masked (collapsed inputs?)",
                          stacklevel=3)
        self._set_amax_buffer(calib_amax)
        return True

    def init_learn_amax(self) -> None:
        """Initialises the learned range ``[-amax, amax]`` from ``_amax`` (its max if per channel)."""
        if not self._spec.learn_amax:
            raise RuntimeError("init_learn_amax needs a quantizer created with learn_amax=True")
        amax = self.amax
        if amax is None:
            raise RuntimeError("init_learn_amax needs an amax: calibrate (load_calib_amax) or set amax first")
        init = amax.max() if amax.numel() != 1 else amax.reshape(())
        with torch.no_grad():
            for bound, value in ((self.clip.clip_value_min, -init), (self.clip.clip_value_max, init)):
                # A bound sharded by FSDP2 (a DTensor; fakequant.utils.prepare_fully_shard)
                # holds this one value in every element: each rank fills its own shard.
                local = bound.to_local() if hasattr(bound, "to_local") else bound
                local.copy_(value)

    # -- dtype and checkpoints ---------------------------------------------------------
    def _apply(self, fn: Any, recurse: bool = True) -> _AmaxState:
        # model.half() / .bfloat16() would round amax to 8 or 11 bits of mantissa,
        # moving every quantization step; keep it float32 (devices still follow).
        amax = self._buffers.get("_amax")
        out = super()._apply(fn, recurse)
        moved = self._buffers.get("_amax")
        if amax is not None and moved is not None and moved.dtype != amax.dtype and amax.dtype == torch.float32:
            self._buffers["_amax"] = amax.to(moved.device)
        return out

    # The buffers a checkpoint may bring to a quantizer that lacks them.
    _LOADABLE_BUFFERS = ("_amax", "_pre_quant_scale")

    def _make_room(self, name: str, shape: Sequence[int]) -> None:
        """Registers buffer ``name`` (one of ``_LOADABLE_BUFFERS``) with ``shape``,
        zero-filled float32 on this module's device, unless it has that shape already."""
        shape = torch.Size(shape)
        dst = self._buffers.get(name)
        if dst is None or dst.shape != shape:
            device = dst.device if dst is not None else self._state_device(torch.device("cpu"))
            self._buffers.pop(name, None)
            self.register_buffer(name, torch.zeros(shape, dtype=torch.float32, device=device))

    def _load_from_state_dict(self, state_dict: Dict[str, Any], prefix: str, local_metadata: Dict[str, Any],
                              strict: bool, missing_keys: List[str], unexpected_keys: List[str],
                              error_msgs: List[str]) -> None:
        # amax and pre_quant_scale are data, not architecture: a checkpoint may
        # bring them to a quantizer that has none yet (still dynamic), or with
        # another shape (per channel instead of per tensor). Make room for them
        # on this module's device (pytorch-quantization forces CUDA here).
        for name in self._LOADABLE_BUFFERS:
            src = state_dict.get(prefix + name)
            if isinstance(src, torch.Tensor):
                self._make_room(name, src.shape)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)
