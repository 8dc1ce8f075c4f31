"""``TensorQuantizer``: the module that quantizes one tensor of a network."""
from __future__ import annotations

import dataclasses
import warnings
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple, Union, cast

import torch
from torch import nn

from .. import _core
from ..calib import HistogramCalibrator, MaxCalibrator
from ..calib.reduce_amax import reduce_amax
from ..tensor_quant import QuantDescriptor, QuantSpec, ScaledQuantDescriptor
from . import _schemes
from .clip import Clip

if TYPE_CHECKING:
    import numpy as np

    # What the amax and pre_quant_scale setters take: anything torch.tensor reads.
    _TensorLike = Union[torch.Tensor, float, Sequence[float], np.ndarray]
    _ModuleMeta = type
else:
    _ModuleMeta = type(nn.Module)

__all__ = ["TensorQuantizer"]


class _Switches(_ModuleMeta):
    """The class-wide switches of :class:`TensorQuantizer`, as pytorch-quantization
    spells them. ``_enable_onnx_export`` is this thread's export mode
    (``fakequant.enable_onnx_export``), not a class attribute; ``use_fb_fake_quant``
    is the user's class-wide choice, and reads True inside the export mode (as
    pytorch-quantization's ``enable_onnx_export`` set it; fakequant's operators
    are used while exporting whatever it says)."""

    @property
    def _enable_onnx_export(cls) -> bool:
        return _core.onnx_export_enabled()

    @_enable_onnx_export.setter
    def _enable_onnx_export(cls, value: bool) -> None:
        _core.set_onnx_export_enabled(bool(value))

    @property
    def use_fb_fake_quant(cls) -> bool:
        return cls._use_fb_fake_quant or _core.onnx_export_enabled()

    @use_fb_fake_quant.setter
    def use_fb_fake_quant(cls, value: bool) -> None:
        cls._use_fb_fake_quant = _core.check_bool(value, "use_fb_fake_quant")

    _use_fb_fake_quant: bool


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


class TensorQuantizer(nn.Module, metaclass=_Switches):
    """Quantizes a tensor as its :class:`~fakequant.tensor_quant.QuantDescriptor` says.

    Three stages, each switched on and off: ``calib`` (feed the calibrator),
    ``clip`` (clamp to the learned range, with ``learn_amax``) and ``quant``
    (fake-quantize). The whole module can be bypassed with :meth:`disable`.

    Args:
        quant_desc: a QuantDescriptor. Default: 8-bit per tensor.
        disabled: bypass the module (return the input). Default False.
        if_quant: run the quantization stage. Default True.
        if_clip: run the clip stage (needs ``learn_amax``). Default False.
        if_calib: run the calibration stage. Default False.

    State: the ``_amax`` buffer once amax is known (from the descriptor, a
    calibrator, the ``amax`` setter or a checkpoint); without it amax is
    computed from each input (dynamic). ``_pre_quant_scale`` multiplies the
    input first when set. With ``learn_amax`` the range is the parameters
    ``clip.clip_value_min`` / ``clip.clip_value_max``. These are the state_dict
    keys of pytorch-quantization, whose checkpoints load here on any device.
    """

    # Class-wide switch (``TensorQuantizer.use_fb_fake_quant``, see _Switches):
    # quantize with torch's own fake_quantize_per_*_affine (full integer range,
    # torch's rounding). Not for export: fakequant's own operators export exactly,
    # and are used whenever an ONNX export runs.
    _use_fb_fake_quant: bool = False
    # How learn_amax learns the range: "lsq" (default) adds the learned-step-size
    # gradient of the quantization error (Esser et al., LSQ) to the clip stage's;
    # "pact" keeps pytorch-quantization's, where amax learns from clipped values only.
    learn_amax_method: str = "lsq"
    # The clip stage (a submodule), with learn_amax only.
    clip: Clip
    def __init__(
        self,
        quant_desc: ScaledQuantDescriptor = QuantDescriptor(),
        disabled: bool = False,
        if_quant: bool = True,
        if_clip: bool = False,
        if_calib: bool = False,
    ) -> None:
        super().__init__()
        if not isinstance(quant_desc, QuantDescriptor):
            raise TypeError(f"quant_desc must be a QuantDescriptor, got {type(quant_desc).__name__}")
        for name, value in (("disabled", disabled), ("if_quant", if_quant), ("if_clip", if_clip),
                            ("if_calib", if_calib)):
            _core.check_bool(value, name)
        self._spec = QuantSpec.of(quant_desc)
        # A module's weight quantizer (set by QuantMixin.init_quantizer): a degenerate
        # calibrated amax leaves it dynamic rather than unable to train.
        self._quantizes_weight = False
        self._configure()
        self._scale = None if not quant_desc.fake_quant else 1.0
        self._disabled = disabled
        self._if_quant = if_quant
        self._if_clip = False
        self._if_calib = False

        if quant_desc.amax is not None:
            self.register_buffer("_amax", torch.from_numpy(quant_desc.amax))  # (float32, a copy)

        if quant_desc.learn_amax:
            init_amax = float(quant_desc.amax.reshape(())) if quant_desc.amax is not None else 1.0
            self.clip = Clip(-init_amax, init_amax, learn_min=True, learn_max=True)
            self.enable_clip()
        if if_clip:
            self.enable_clip()

        self._calibrator = self._new_calibrator(quant_desc.calib_method == "histogram")
        if if_calib:
            self.enable_calib()

    # -- properties ----------------------------------------------------------------
    @property
    def spec(self) -> QuantSpec:
        """What this quantizer computes (frozen; the setters of ``num_bits``, ``unsigned`` and
        ``narrow_range`` replace it)."""
        return self._spec

    def _update_spec(self, **changes: Any) -> None:
        """Replaces the spec with ``changes`` (checked by QuantSpec), chooses the numeric
        path again, and keeps the calibrator's format the quantizer's."""
        self._spec = dataclasses.replace(self._spec, **changes)
        self._configure()
        calibrator = self._calibrator
        if calibrator is not None:
            calibrator.num_bits = self._spec.num_bits
            calibrator.unsigned = self._spec.unsigned
            if isinstance(calibrator, HistogramCalibrator):
                calibrator.narrow_range = self._spec.narrow_range

    @property
    def num_bits(self) -> Union[int, Tuple[int, int]]:
        return self._spec.num_bits

    @num_bits.setter
    def num_bits(self, value: Union[int, Tuple[int, int]]) -> None:
        self._update_spec(num_bits=value)

    @property
    def maxbound(self) -> float:
        """The largest quantized value, ``2^(num_bits - 1 + unsigned) - 1`` (448 for E4M3,
        57344 for E5M2)."""
        num_bits = self._spec.num_bits
        if isinstance(num_bits, tuple):
            return _core.float_format_max(num_bits)
        return _core.amax_bound(num_bits, self._spec.unsigned)

    @property
    def unsigned(self) -> bool:
        return self._spec.unsigned

    @unsigned.setter
    def unsigned(self, value: bool) -> None:
        self._update_spec(unsigned=value)

    @property
    def narrow_range(self) -> bool:
        return self._spec.narrow_range

    @narrow_range.setter
    def narrow_range(self, value: bool) -> None:
        self._update_spec(narrow_range=value)

    @property
    def scale(self) -> Optional[Union[float, torch.Tensor]]:
        """The scale of the last real (``fake_quant=False``) quantization; 1.0 in fake mode."""
        if self._scale is None:
            warnings.warn("TensorQuantizer.scale read before any tensor was quantized", stacklevel=2)
        return self._scale

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

    @property
    def step_size(self) -> Optional[torch.Tensor]:
        """``amax / maxbound``, or None while amax is dynamic."""
        amax = self.amax
        if amax is None:
            return None
        return amax / float(self.maxbound)

    @property
    def axis(self) -> Optional[Union[int, Tuple[int, ...]]]:
        return self._spec.axis

    @property
    def block_sizes(self) -> Optional[Dict[int, Optional[int]]]:
        block_sizes = self._spec.block_sizes
        return None if block_sizes is None else dict(block_sizes)

    @property
    def fake_quant(self) -> bool:
        return self._spec.fake_quant

    @property
    def learn_amax(self) -> bool:
        return self._spec.learn_amax

    @property
    def dynamic(self) -> bool:
        return self._spec.dynamic

    # -- switches --------------------------------------------------------------------
    def disable(self) -> None:
        """Bypass the module: forward returns its input."""
        self._disabled = True

    def enable(self) -> None:
        self._disabled = False

    def disable_clip(self) -> None:
        """Stop the clip stage (and the learning of the clip range)."""
        self._if_clip = False
        clip = getattr(self, "clip", None)
        if clip is not None:
            clip.clip_value_min.requires_grad_(False)
            clip.clip_value_max.requires_grad_(False)

    def enable_clip(self) -> None:
        """Run the clip stage, learning the range (needs ``learn_amax=True``)."""
        if not self._spec.learn_amax:
            raise ValueError("enable_clip needs a quantizer created with learn_amax=True")
        self.clip.clip_value_min.requires_grad_(True)
        self.clip.clip_value_max.requires_grad_(True)
        self._if_clip = True

    def disable_calib(self) -> None:
        self._if_calib = False

    def enable_calib(self) -> None:
        """Feed every input to the calibrator."""
        if self._calibrator is None:
            raise ValueError("this quantizer has no calibrator; cannot enable calibration")
        self._if_calib = True

    def disable_quant(self) -> None:
        self._if_quant = False

    def enable_quant(self) -> None:
        self._if_quant = True

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

    def _kept_axes(self, ndim: int) -> List[int]:
        return _core.resolve_axes(self._spec.axis, ndim, "quantizer axis")

    def _computes_amax(self) -> bool:
        """Whether amax is computed from each input (no ``_amax`` yet, or ``dynamic``). Such
        an amax is not user input: the operators do not check it, and NaN or inf in the
        input give NaN outputs, the same on every device."""
        return self._spec.dynamic or self._buffers.get("_amax") is None

    def _get_amax(self, inputs: torch.Tensor) -> torch.Tensor:
        """amax from the buffer, or computed from ``inputs`` when dynamic."""
        amax = self._buffers.get("_amax")
        if self._computes_amax():
            if self._spec.axis is None:
                amax = self._tensor_amax(inputs)
            else:
                kept = self._kept_axes(inputs.dim())
                reduce_dims = tuple(d for d in range(inputs.dim()) if d not in kept)
                amax = reduce_amax(inputs, axis=reduce_dims, keepdims=True) if reduce_dims else inputs.abs()
        else:
            assert amax is not None  # (not _computes_amax(): the buffer is set)
            if amax.device != inputs.device:
                # amax set on another device than the module was moved to (module.to()
                # moves it for good; the forward leaves the buffer as it is).
                amax = amax.to(inputs.device)
            amax = self._broadcastable(amax, inputs)
        if amax.requires_grad:
            # (only then: an exported graph would carry an Identity per detach,
            # which ONNX's converter cannot take below opset 16)
            amax = amax.detach()
        if self._spec.scale_amax is not None:
            amax = amax * self._spec.scale_amax
        return amax

    @staticmethod
    def _tensor_amax(inputs: torch.Tensor) -> torch.Tensor:
        """max |inputs| over the whole tensor, 0-dimensional (one pass, no |x| temporary)."""
        if torch.onnx.is_in_onnx_export():
            # (the dynamo exporter cannot translate the aminmax reduce_amax uses,
            # nor an amax without dims)
            return inputs.detach().abs().amax(dim=tuple(range(inputs.dim())))
        return reduce_amax(inputs, axis=None)

    def _broadcastable(self, amax: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
        # A per-channel amax stored flat (shape (C,)) is laid along the quantizer's axis.
        if amax.dim() == 1 and amax.numel() > 1 and isinstance(self._spec.axis, int) and inputs.dim() > 1:
            shape = [1] * inputs.dim()
            shape[self._spec.axis % inputs.dim()] = amax.numel()
            return amax.reshape(shape)
        return amax

    # -- block quantization -------------------------------------------------------------
    def _blocked_view(self, inputs: torch.Tensor) -> Tuple[torch.Tensor, List[int]]:
        """``inputs`` reshaped so that each block is a trailing run of one axis,
        with the positions of the within-block axes."""
        assert self._spec.block_sizes is not None  # (only block quantizers get here)
        shape: List[int] = []
        inner: List[int] = []
        nd = inputs.dim()
        axes = _core.resolve_axes(tuple(self._spec.block_sizes), nd, "block_sizes axis")
        blocks = dict(zip(axes, self._spec.block_sizes.values()))
        for d, n in enumerate(inputs.shape):
            if d not in blocks:
                shape.append(n)
                continue
            block = blocks[d]
            size = (n or 1) if block is None else block  # (an empty axis is one empty block)
            if n % size:
                raise ValueError(f"block_sizes[{d}] = {size} does not divide the input's size {n} along axis {d}")
            shape += [n // size, size]
            inner.append(len(shape) - 1)
        return inputs.reshape(shape), inner

    def _block_amax(self, blocked: torch.Tensor, inner: List[int]) -> torch.Tensor:
        amax = self._buffers.get("_amax")
        if self._computes_amax():
            return reduce_amax(blocked, axis=tuple(inner), keepdims=True).detach().reshape(
                [1 if d in inner else n for d, n in enumerate(blocked.shape)])
        assert amax is not None  # (not _computes_amax(): the buffer is set)
        amax = amax.to(blocked.device) if amax.device != blocked.device else amax
        return amax.detach() if amax.requires_grad else amax

    def _kernel_block(self) -> Optional[Tuple[int, Optional[int]]]:
        """``QuantSpec.kernel_block``: the one axis of dynamic blocks and their size, or None."""
        return self._spec.kernel_block

    # -- forward ------------------------------------------------------------------------
    def _configure(self) -> None:
        """Chooses the numeric path and value rule (nn/_schemes.py) of this configuration."""
        self._values = _schemes.choose_values(self._spec)
        self._path = _schemes.choose_path(self._spec)

    def _quantize(self, inputs: torch.Tensor, amax: torch.Tensor, check_values: bool = True) -> torch.Tensor:
        """``inputs`` quantized with ``amax`` by the value rule (torch's own operators
        with ``TensorQuantizer.use_fb_fake_quant``, except while exporting);
        ``check_values=False`` for an amax computed from ``inputs``."""
        values = self._values
        if (values is _schemes.FAKE_INTEGER and TensorQuantizer._use_fb_fake_quant
                and not (self._export_mode() or torch.onnx.is_in_onnx_export())):
            values = _schemes.TORCH_NATIVE
        outputs, scale = values(self._spec, inputs, amax, check_values)
        if scale is not None:  # (real quantization: pytorch-quantization's ``scale``)
            self._scale = scale
        return outputs

    def _quant_forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self._path(self, inputs)

    def _collect(self, inputs: torch.Tensor) -> None:
        # Static blocks collect one amax per block. Dynamic blocks along one axis compute
        # their block amax from each input (a ragged last block too); what calibration
        # gives them is the per-tensor amax their E4M3 block scales are relative to
        # (``scale_bits``), so they collect per tensor.
        if self._calibrator is None:
            raise RuntimeError("calibration is on but this quantizer has no calibrator")
        if self._spec.block_sizes is not None and not (self._spec.dynamic and self._kernel_block() is not None):
            blocked, inner = self._blocked_view(inputs.detach())
            # one amax per block: every axis but the within-block ones is kept
            # (a MaxCalibrator: the descriptor refuses block_sizes with calib_method='histogram')
            cast(MaxCalibrator, self._calibrator).collect(blocked, kept_axes=tuple(d for d in range(blocked.dim()) if d not in inner))
        else:
            self._calibrator.collect(inputs.detach())

    def _check_onnx_readiness(self, inputs: torch.Tensor) -> None:
        if self._disabled or not self._if_quant:
            return
        if self.amax is None and not self._spec.learn_amax and not self._spec.dynamic:
            raise RuntimeError("ONNX export needs calibrated quantizers: this TensorQuantizer has no amax "
                               "(calibrate and load_calib_amax() first, or make it dynamic to export a "
                               "scale computed from each input)")
        if self._if_calib:
            warnings.warn("a TensorQuantizer is still calibrating during ONNX export", stacklevel=3)

    @staticmethod
    def _export_mode() -> bool:
        # This thread's fakequant.enable_onnx_export. (Not read while dynamo traces:
        # it cannot guard a thread-local value, and a compiled graph is no export.)
        return not torch.compiler.is_dynamo_compiling() and _core.onnx_export_enabled()

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """Quantizes ``inputs`` (after the optional calibration and clip stages)."""
        if self._export_mode():
            self._check_onnx_readiness(inputs)
        pre_quant_scale = self._buffers.get("_pre_quant_scale")
        if pre_quant_scale is not None:
            inputs = inputs * pre_quant_scale.to(device=inputs.device, dtype=inputs.dtype)
        if self._disabled:
            return inputs
        outputs = inputs
        if self._if_calib:
            self._collect(inputs)
        if self._if_clip:
            if not self._spec.learn_amax:
                raise RuntimeError("the clip stage needs learn_amax=True")
            outputs = self.clip(inputs)
        if self._if_quant:
            outputs = self._quant_forward(inputs)
        return outputs

    # -- printing and loading ----------------------------------------------------------
    def _short_amax(self, fmt: str = ".4f") -> str:
        amax = self.amax
        if amax is None:
            return "dynamic"
        if amax.numel() == 1:
            return f"{amax.item():{fmt}}"
        return f"[{amax.min().item():{fmt}}, {amax.max().item():{fmt}}]({amax.numel()})"

    def extra_repr(self) -> str:
        if self._disabled:
            return "disabled"
        s = ("unsigned " if self._spec.unsigned else "") + f"{self._spec.num_bits}bit"
        s += " narrow" if self._spec.narrow_range else ""
        s += " fake" if self._spec.fake_quant else ""
        s += f" axis={self._spec.axis}" if self._spec.axis is not None else " per-tensor"
        s += f" block_sizes={self._spec.block_sizes}" if self._spec.block_sizes is not None else ""
        s += f" amax={self._short_amax()}"
        s += " dynamic-amax" if self._spec.dynamic else ""
        s += f" *{self._spec.scale_amax}" if self._spec.scale_amax else ""
        s += " pre_quant_scale" if self.pre_quant_scale is not None else ""
        s += " learned" if self._spec.learn_amax else ""
        s += f" calibrator={type(self._calibrator).__name__}" if self._calibrator is not None else ""
        s += f" scale={self._scale}" if self._scale is not None and not self._spec.fake_quant else ""
        s += " quant" if self._if_quant else ""
        s += " clip" if self._if_clip else ""
        s += " calib" if self._if_calib else ""
        return s

    def _apply(self, fn: Any, recurse: bool = True) -> TensorQuantizer:
        # model.half() / .bfloat16() would round amax to 8 or 11 bits of mantissa,
        # moving every quantization step; keep it float32 (devices still follow).
        amax = self._buffers.get("_amax")
        out = super()._apply(fn, recurse)
        moved = self._buffers.get("_amax")
        if amax is not None and moved is not None and moved.dtype != amax.dtype and amax.dtype == torch.float32:
            self._buffers["_amax"] = amax.to(moved.device)
        return out

    def __getstate__(self) -> Dict[str, Any]:
        # The schemes are chosen again on loading: a pickled quantizer holds module and
        # calibrator state only (loadable with weights_only once those classes are trusted).
        # The spec is pickled as its fields ("_num_bits", ..., the names pytorch-quantization's
        # quantizers pickle), so that a pickled model holds module and calibrator classes only.
        state = self.__dict__.copy()  # (object.__getstate__ is Python >= 3.11)
        state.pop("_values", None)
        state.pop("_path", None)
        spec = state.pop("_spec")
        state.update({f"_{f.name}": getattr(spec, f.name) for f in dataclasses.fields(spec)})
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        state = dict(state)
        fields = {f.name: state.pop(f"_{f.name}", f.default) for f in dataclasses.fields(QuantSpec)}
        super().__setstate__(state)
        self._spec = QuantSpec(**fields)
        self._configure()

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


def _spec_field(name: str) -> property:
    def get(self: TensorQuantizer) -> Any:
        return getattr(self._spec, name)

    def set_(self: TensorQuantizer, value: Any) -> None:
        self._update_spec(**{name: value})

    return property(get, set_, doc=f"``spec.{name}``, under pytorch-quantization's private name")


# pytorch-quantization's private names of the configuration (``q._num_bits``, ...), which
# scripts read: views of the spec. (Pickles hold them too: see __getstate__.)
for _field in dataclasses.fields(QuantSpec):
    setattr(TensorQuantizer, f"_{_field.name}", _spec_field(_field.name))
