"""``TensorQuantizer``: the module that quantizes one tensor of a network."""
from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Dict, List, Optional, Tuple, Union, cast

import torch

from .. import _core
from ..calib import HistogramCalibrator, MaxCalibrator
from ..tensor_quant import QuantDescriptor, QuantSpec, ScaledQuantDescriptor
from . import _input_amax, _paths
from ._amax_state import _AmaxState
from ._switches import _Switches
from .clip import Clip

__all__ = ["TensorQuantizer"]


class TensorQuantizer(_AmaxState, metaclass=_Switches):
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
    (The buffers and what sets them: the base class, ``nn/_amax_state.py``; the amax
    computed from an input: ``nn/_input_amax.py``; the numeric paths: ``nn/_paths.py``;
    the class-wide switches: the metaclass, ``nn/_switches.py``.)
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
        previous, self._spec = self._spec, dataclasses.replace(self._spec, **changes)
        try:
            self._configure()
        except Exception:  # a configuration the paths refuse: keep the quantizer as it was
            self._spec = previous
            self._configure()
            raise
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
        """pytorch-quantization's scale of the last real (``fake_quant=False``) quantization,
        ``bound / amax``: the one public name in which a scale is not fakequant's ``amax / bound``
        (docs/design.md, "Scale"); 1.0 in fake mode."""
        if self._scale is None:
            warnings.warn("TensorQuantizer.scale read before any tensor was quantized", stacklevel=2)
        return self._scale

    @property
    def step_size(self) -> Optional[torch.Tensor]:
        """``amax / maxbound``, or None while amax is dynamic."""
        amax = self.amax
        if amax is None:
            return None
        return _core.divide(amax, float(self.maxbound))

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

    @property
    def is_enabled(self) -> bool:
        """Whether forward quantizes (the module is not disabled and its quant stage is on)."""
        return not self._disabled and self._if_quant

    @property
    def scale_bits(self) -> Optional[Tuple[int, int]]:
        """The format of the block scales (the descriptor's ``block_sizes["scale_bits"]``):
        ``(4, 3)`` E4M3 under a per-tensor amax (NVFP4), ``(8, 0)`` E8M0 (MX), llama.cpp's
        float16 ``(5, 10)`` (GGUF); None otherwise."""
        return self._spec.scale_bits

    @property
    def scale_format(self) -> Optional[_core.BlockScales]:
        """The format ``scale_bits`` names (``fakequant._core.BlockScales``: ``E4M3``, ``E8M0``,
        ``GGML``), decided once when the spec is built; None without block scales."""
        return self._spec.scale_format

    @property
    def target(self) -> str:
        """The serving target whose rules this quantizer follows (``spec.target``, one of
        ``fakequant.tensor_quant.spec.TARGETS``): ``"onnx"`` (the default: the library's contract, what
        ONNX Runtime, TensorRT and Model Optimizer compute) or ``"vllm"`` (compressed-tensors as
        vLLM serves it: docs/serving.md, "Targets"). :func:`fakequant.quantize_model` sets it on
        every quantizer of a model (``target=``); an exporter reads it to refuse a model trained
        for another target. Setting it chooses the numeric path again; a target whose engine
        does not compute this quantizer's configuration raises (ValueError, NotImplementedError)."""
        return self._spec.target

    @target.setter
    def target(self, value: str) -> None:
        self._update_spec(target=value)

    @property
    def centered(self) -> bool:
        """Whether dynamic blocks are quantized about their centre (a ``"max_min"`` bias)."""
        return self._spec.centered

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

    # -- amax of the input (nn/_input_amax.py) --------------------------------------------
    def _computes_amax(self) -> bool:
        """Whether amax is computed from each input (no ``_amax`` yet, or ``dynamic``). Such
        an amax is not user input: the operators do not check it, and NaN or inf in the
        input give NaN outputs, the same on every device."""
        return self._spec.dynamic or self._buffers.get("_amax") is None

    def _get_amax(self, inputs: torch.Tensor) -> torch.Tensor:
        """amax from the buffer, or computed from ``inputs`` when dynamic."""
        amax = self._buffers.get("_amax")
        if self._computes_amax():
            amax = _input_amax.axis_amax(self._spec, inputs)
        else:
            assert amax is not None  # (not _computes_amax(): the buffer is set)
            if amax.device != inputs.device:
                # amax set on another device than the module was moved to (module.to()
                # moves it for good; the forward leaves the buffer as it is).
                amax = amax.to(inputs.device)
            amax = _input_amax.broadcastable(self._spec, amax, inputs)
        if amax.requires_grad:
            # (only then: an exported graph would carry an Identity per detach,
            # which ONNX's converter cannot take below opset 16)
            amax = amax.detach()
        if self._spec.scale_amax is not None:
            amax = amax * self._spec.scale_amax
        return amax

    def _block_amax(self, inputs: torch.Tensor) -> torch.Tensor:
        """The amax of each block of ``inputs`` (shaped for their blocked view): the buffer's,
        or computed from ``inputs`` when dynamic."""
        if self._computes_amax():
            return _input_amax.block_amax(*_input_amax.blocked_view(self._spec, inputs))
        amax = self._buffers.get("_amax")
        assert amax is not None  # (not _computes_amax(): the buffer is set)
        amax = amax.to(inputs.device) if amax.device != inputs.device else amax
        return amax.detach() if amax.requires_grad else amax

    def _path_amax(self, inputs: torch.Tensor, values: Any) -> Tuple[torch.Tensor, Optional[torch.Tensor], bool]:
        """``(inputs, amax, check_values)`` for this quantizer's path: the amax it ``needs``
        (nn/_paths.py), computed here from the buffer, the clip stage or the input;
        ``check_values=False`` for an amax computed from the input."""
        needs = self._path.needs
        if needs == "clip":  # the learned range
            inputs = self.clip(inputs)
            clip_min, clip_max = self.clip.bounds()
            neg_min = -clip_min
            # (where, not maximum: the TorchScript ONNX exporter folds it into a constant scale)
            amax = torch.where(neg_min > clip_max, neg_min, clip_max)
            # (LSQ learns amax by its gradient; otherwise the amax operator, which exports with a constant scale)
            return inputs, amax if values is _paths.LSQ else amax.detach(), True
        if needs == "tensor":  # dynamic blocks: the per-tensor amax of E4M3 block scales
            if not self._spec.scales_need_amax:
                return inputs, None, True
            calibrated = self.amax
            if calibrated is not None and calibrated.numel() == 1:
                return inputs, calibrated.detach().reshape(()).to(inputs.device), True
            return inputs, _input_amax.tensor_amax(inputs), False
        if needs == "blocks":  # static blocks: one amax per block
            amax = self._block_amax(inputs)
            scale_amax = self._spec.scale_amax
            if scale_amax is not None:
                amax = amax * scale_amax
            return inputs, amax, not self._computes_amax()
        return inputs, self._get_amax(inputs), not self._computes_amax()

    # -- forward ------------------------------------------------------------------------
    def _configure(self) -> None:
        """Chooses the numeric path and value rule (nn/_paths.py) of this configuration."""
        weight = getattr(self, "_quantizes_weight", False)
        self._values = _paths.choose_values(self._spec, weight)
        self._path = _paths.choose_path(self._spec, weight)

    def _values_now(self) -> Any:
        """The value rule of this call: LSQ while a learned range learns
        (``learn_amax_method``), torch's own operators with ``TensorQuantizer.use_fb_fake_quant``
        (except while exporting), else the configuration's."""
        values = self._values
        if values is _paths.FAKE_INTEGER:
            if (self._spec.learn_amax and type(self).learn_amax_method == "lsq" and torch.is_grad_enabled()
                    and not torch.onnx.is_in_onnx_export()):
                return _paths.LSQ
            if TensorQuantizer._use_fb_fake_quant and not (self._export_mode() or torch.onnx.is_in_onnx_export()):
                return _paths.TORCH_NATIVE
        return values

    def _quant_forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """The quantizer computes (the value rule of this call, the amax its path needs), the
        path transforms (nn/_paths.py); a real quantization's scale is kept as ``scale``."""
        values = self._values_now()
        inputs, amax, check_values = self._path_amax(inputs, values)
        outputs, scale = self._path(self._spec, inputs, amax, values, check_values)
        if scale is not None:  # (real quantization: pytorch-quantization's ``scale``)
            self._scale = scale
        return outputs

    def _collect(self, inputs: torch.Tensor) -> None:
        # Static blocks collect one amax per block. Dynamic blocks along one axis compute
        # their block amax from each input (a ragged last block too); what calibration
        # gives them is the per-tensor amax their E4M3 block scales are relative to
        # (``scale_bits``), so they collect per tensor.
        if self._calibrator is None:
            raise RuntimeError("calibration is on but this quantizer has no calibrator")
        if self._spec.block_sizes is not None and not (self._spec.dynamic and self._spec.kernel_block is not None):
            blocked, inner = _input_amax.blocked_view(self._spec, inputs.detach())
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

    def __getstate__(self) -> Dict[str, Any]:
        # The schemes are chosen again on loading: a pickled quantizer holds module and
        # calibrator state only (loadable with weights_only once those classes are trusted).
        # The spec is pickled as its fields ("_num_bits", ..., the names pytorch-quantization's
        # quantizers pickle), so that a pickled model holds module and calibrator classes only.
        state = self.__dict__.copy()  # (object.__getstate__ is Python >= 3.11)
        state.pop("_values", None)
        state.pop("_path", None)
        spec = state.pop("_spec")
        state.update({f"_{name}": getattr(spec, name) for name in QuantSpec.arguments()})
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        state = dict(state)
        fields = {f.name: state.pop(f"_{f.name}", f.default) for f in dataclasses.fields(QuantSpec) if f.init}
        super().__setstate__(state)
        self._spec = QuantSpec(**fields)
        self._configure()



def _spec_field(name: str) -> property:
    def get(self: TensorQuantizer) -> Any:
        return getattr(self._spec, name)

    def set_(self: TensorQuantizer, value: Any) -> None:
        self._update_spec(**{name: value})

    return property(get, set_, doc=f"``spec.{name}``, under pytorch-quantization's private name")


# pytorch-quantization's private names of the configuration (``q._num_bits``, ...), which
# scripts read: views of the spec. (Pickles hold them too: see __getstate__.)
for _name in QuantSpec.arguments():
    setattr(TensorQuantizer, f"_{_name}", _spec_field(_name))
