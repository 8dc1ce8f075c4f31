"""Quantization descriptors and tensor quantization functions.

The pytorch-quantization-shaped front of :mod:`fakequant.ops`: a
:class:`ScaledQuantDescriptor` (alias :data:`QuantDescriptor`) says how a tensor
is quantized, and the functions below quantize it. Every function here calls
the operators in :mod:`fakequant.ops`, so the numerics are the ones documented
there (``scale = amax / bound``, ``rint(x / scale)``, as ONNX QuantizeLinear);
where pytorch-quantization multiplies by ``bound / amax`` instead, results can
differ by one step at exact ties.
"""
from __future__ import annotations

import copy
import math
import numbers
from typing import Any, Dict, Optional, Tuple, Union

import numpy as np
import torch

from . import _core, ops
from ._core import check_bool as _check_bool, check_num_bits, is_int as _is_int, normalize_axis as _normalize_axis

__all__ = [
    "ScaledQuantDescriptor",
    "QuantDescriptor",
    "QUANT_DESC_8BIT_PER_TENSOR",
    "QUANT_DESC_UNSIGNED_8BIT_PER_TENSOR",
    "QUANT_DESC_8BIT_CONV1D_WEIGHT_PER_CHANNEL",
    "QUANT_DESC_8BIT_CONV2D_WEIGHT_PER_CHANNEL",
    "QUANT_DESC_8BIT_CONV3D_WEIGHT_PER_CHANNEL",
    "QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW",
    "QUANT_DESC_8BIT_CONVTRANSPOSE1D_WEIGHT_PER_CHANNEL",
    "QUANT_DESC_8BIT_CONVTRANSPOSE2D_WEIGHT_PER_CHANNEL",
    "QUANT_DESC_8BIT_CONVTRANSPOSE3D_WEIGHT_PER_CHANNEL",
    "TensorQuantFunction",
    "FakeTensorQuantFunction",
    "FakeAffineTensorQuantFunction",
    "LegacyFakeTensorQuantFunction",
    "ScaledE4M3Function",
    "tensor_quant",
    "fake_tensor_quant",
    "fake_affine_tensor_quant",
    "legacy_fake_tensor_quant",
    "scaled_e4m3",
]

# The integer widths the operators implement (the library's limits).
MIN_NUM_BITS, MAX_NUM_BITS = _core.MIN_NUM_BITS, _core.MAX_NUM_BITS
# Floating-point (exponent, mantissa) formats a descriptor may name.
# (E, M): FP8 E4M3 and E5M2; FP4 E2M1 for block-wise quantization (NVFP4)
FP_FORMATS = tuple(_core.FLOAT_FORMAT_MAX)
CALIB_METHODS = ("max", "histogram")
_BLOCK_STRING_KEYS = ("type", "scale_bits", "scale_block_sizes")


def _amax_to_array(amax: Any, name: str = "amax") -> np.ndarray:
    """A float32 ndarray (a copy) of a user-given amax (number, list, tuple, ndarray or
    tensor): the type pytorch-quantization's descriptor holds."""
    if isinstance(amax, bool):
        raise TypeError(f"{name} must be float, list or ndarray (or a tensor), got a bool")
    if isinstance(amax, torch.Tensor):
        value = amax.detach().to("cpu", torch.float32).numpy().copy()
    elif isinstance(amax, (numbers.Real, list, tuple, np.ndarray, np.generic)):
        try:
            value = np.array(amax, dtype=np.float32)
        except (TypeError, ValueError) as e:
            raise TypeError(f"{name}={amax!r} cannot be read as an array of floats: {e}") from None
    else:
        raise TypeError(
            f"{name} must be float, list or ndarray (or a tensor), got {type(amax).__name__}"
        )
    if value.size == 0:
        raise ValueError(f"{name} must not be empty")
    if not bool(np.isfinite(value).all()) or bool((value < 0).any()):
        raise ValueError(f"{name} must be finite and >= 0, got {amax!r}")
    return value


_BIAS_STRING_KEYS = {"type": ("static", "dynamic"), "method": ("mean", "max_min")}


def _normalize_bias(bias: Any) -> Optional[Dict[Union[int, str], Any]]:
    """Model Optimizer's ``bias`` dict, checked: int axes (values None) and the string keys
    ``type`` and ``method``."""
    if bias is None:
        return None
    if not isinstance(bias, dict):
        raise TypeError(f"bias must be a dict or None, got {type(bias).__name__}")
    out: Dict[Union[int, str], Any] = {}
    for key, value in bias.items():
        if isinstance(key, str):
            if key not in _BIAS_STRING_KEYS or value not in _BIAS_STRING_KEYS[key]:
                allowed = {k: list(v) for k, v in _BIAS_STRING_KEYS.items()}
                raise ValueError(f"bias[{key!r}] = {value!r}: the string keys and values are {allowed}")
            out[key] = value
        elif _is_int(key):
            if value is not None:
                raise ValueError(f"bias[{key}] must be None (the axis the bias is computed along), got {value!r}")
            out[int(key)] = None
        else:
            raise TypeError(f"bias keys must be ints (axes) or strings, got {key!r}")
    if not any(isinstance(k, int) for k in out):
        raise ValueError(f"bias must name at least one axis, got {bias!r}")
    return out


def _normalize_block_sizes(block_sizes: Any) -> Optional[Dict[Union[int, str], Any]]:
    if block_sizes is None:
        return None
    if not isinstance(block_sizes, dict):
        raise TypeError(f"block_sizes must be a dict or None, got {type(block_sizes).__name__}")
    out: Dict[Union[int, str], Any] = {}
    for key, value in block_sizes.items():
        if isinstance(key, str):
            if key not in _BLOCK_STRING_KEYS:
                raise ValueError(
                    f"block_sizes key {key!r} is not an axis (int) nor one of {list(_BLOCK_STRING_KEYS)}"
                )
            if key == "type" and value not in ("static", "dynamic"):
                raise ValueError(f"block_sizes['type'] must be 'static' or 'dynamic', got {value!r}")
            if key == "scale_bits" and value is not None:
                value = tuple(value) if isinstance(value, (tuple, list)) else value
                if value not in _core.BLOCK_SCALE_BITS:
                    raise ValueError(f"block_sizes['scale_bits'] must be (4, 3) (E4M3 block scales under a "
                                     f"per-tensor scale, NVFP4) or (8, 0) (E8M0 power-of-two block scales, "
                                     f"the MX formats), got {value!r}")
            out[key] = tuple(value) if isinstance(value, list) else value
        elif _is_int(key):
            if value is not None and not (_is_int(value) and value > 0):
                raise ValueError(
                    f"block_sizes[{key}] must be a positive int or None (the whole axis), got {value!r}"
                )
            out[int(key)] = None if value is None else int(value)
        else:
            raise TypeError(f"block_sizes keys must be ints (axes) or strings, got {key!r}")
    if not any(isinstance(k, int) for k in out):
        raise ValueError(f"block_sizes must name at least one axis, got {block_sizes!r}")
    return out


class ScaledQuantDescriptor:
    """Describes how a tensor is quantized: ``amax``-scaled (symmetric) quantization.

    Args:
        num_bits: an int in [2, 16] for integer quantization, or the tuple ``(4, 3)``
            naming FP8 E4M3. Default 8.
        name: an optional name (str).

    Keyword Args:
        fake_quant: if True (default) quantize-dequantize; if False return the integers.
        axis: None (per tensor, the default), an int or a tuple of ints: the axes
            that keep their own amax (``axis=0`` on a conv weight is per output channel).
        block_sizes: None or a dict ``{axis: block_size_or_None, "type": "static"|"dynamic"}``:
            every ``block_size`` consecutive elements along ``axis`` share an amax.
            Cannot be combined with ``axis``.
        amax: a number, list, ndarray or tensor of user-given amax; when given the
            quantizer starts with this amax instead of a dynamic one. Kept (and
            returned by the ``amax`` property) as a float32 ``np.ndarray``.
        learn_amax: if True, amax is a learnable parameter (per tensor only).
        scale_amax: a positive number amax is multiplied by. Default None.
        calib_method: ``"max"`` (default) or ``"histogram"``: the calibrator a
            :class:`~fakequant.nn.TensorQuantizer` creates.
        unsigned: quantize to ``[0, 2^num_bits - 1]``. Default False.
        narrow_range: signed range ``[-bound, bound]`` instead of ``[-bound - 1, bound]``.
            Default False (as pytorch-quantization's descriptor).
        dynamic: if True, amax is always computed from the tensor being quantized,
            even after calibration. Default False.
        bias: None, or Model Optimizer's affine-quantization bias ``{axis: None, "type": "dynamic",
            "method": "max_min"}``: the tensor is quantized about the centre of its range along
            ``axis`` (``max / 2 + min / 2``), computed from each input in the quantizing pass.
            With ``block_sizes={-1: None}`` on the same axis it is per-token asymmetric
            quantization. Only this dynamic ``max_min`` form is implemented.
        type: ``"dynamic"`` (Model Optimizer's spelling of ``dynamic=True``) or ``"static"``.
            Per-token dynamic quantization of activations is
            ``type="dynamic", block_sizes={-1: None}``: one amax per row (token), computed
            in the quantizing pass.

    Raises:
        TypeError, ValueError: naming the argument and the value.

    All arguments are exposed as read-only properties. Descriptors compare equal
    when all their fields are equal; :meth:`dict`, :meth:`to_yaml` and
    :meth:`from_yaml` round-trip exactly.
    """

    def __init__(self, num_bits: Union[int, Tuple[int, int]] = 8, name: Optional[str] = None, **kwargs: Any) -> None:
        self._num_bits = check_num_bits(num_bits)
        if name is not None and not isinstance(name, str):
            raise TypeError(f"name must be a str or None, got {name!r} ({type(name).__name__})")
        self._name = name

        self._fake_quant = _check_bool(kwargs.pop("fake_quant", True), "fake_quant")
        self._axis = _normalize_axis(kwargs.pop("axis", None))
        self._block_sizes = _normalize_block_sizes(kwargs.pop("block_sizes", None))
        self._learn_amax = _check_bool(kwargs.pop("learn_amax", False), "learn_amax")
        amax = kwargs.pop("amax", None)
        self._amax = None if amax is None else _amax_to_array(amax)
        scale_amax = kwargs.pop("scale_amax", None)
        if scale_amax is not None:
            if isinstance(scale_amax, bool) or not isinstance(scale_amax, numbers.Real):
                raise TypeError(f"scale_amax must be a number or None, got {scale_amax!r}")
            # (ignore: typeshed's numbers.Real declares __lt__/__le__ only, not __gt__ with an int)
            if not (math.isfinite(scale_amax) and scale_amax > 0):  # type: ignore[operator]
                raise ValueError(f"scale_amax must be finite and > 0, got {scale_amax!r}")
        self._scale_amax = scale_amax
        self._calib_method = kwargs.pop("calib_method", "max")
        if self._calib_method not in CALIB_METHODS:
            raise ValueError(f"calib_method must be one of {list(CALIB_METHODS)}, got {self._calib_method!r}")
        self._unsigned = _check_bool(kwargs.pop("unsigned", False), "unsigned")
        self._narrow_range = _check_bool(kwargs.pop("narrow_range", False), "narrow_range")
        self._dynamic = _check_bool(kwargs.pop("dynamic", False), "dynamic")
        self._bias = _normalize_bias(kwargs.pop("bias", None))
        kind = kwargs.pop("type", None)  # Model Optimizer's spelling of dynamic=True
        if kind is not None:
            if kind not in ("static", "dynamic"):
                raise ValueError(f"type must be 'static' or 'dynamic', got {kind!r}")
            if kind == "static" and self._dynamic:
                raise ValueError("type='static' contradicts dynamic=True")
            self._dynamic = self._dynamic or kind == "dynamic"
        if kwargs:
            raise TypeError(f"QuantDescriptor got unexpected keyword arguments: {sorted(kwargs)}")

        if self._learn_amax and self._axis is not None:
            # (pytorch-quantization raised TypeError, with the words in parentheses)
            raise _core.TypeAndValueError(
                f"learn_amax=True learns one amax per tensor; axis must be None, got {self._axis!r} "
                f"(axis is ignored and must be None when learn_amax is true, got {type(self._axis)}.)")
        if self._learn_amax and self._amax is not None and self._amax.size != 1:
            raise ValueError(
                f"learn_amax=True learns one amax per tensor; amax must hold one value, got shape "
                f"{tuple(self._amax.shape)}"
            )
        if self._num_bits == (2, 1) and (self._block_sizes is None or self._block_sizes.get("type") != "dynamic"):
            raise ValueError("num_bits=(2, 1) (FP4 E2M1) needs dynamic block-wise scales, e.g. "
                             "block_sizes={-1: 16, 'type': 'dynamic', 'scale_bits': (4, 3)} (NVFP4)")
        if self._block_sizes is not None:
            if self._axis is not None:
                raise ValueError(f"block_sizes and axis cannot be combined, got axis={self._axis!r}")
            if self._learn_amax:
                raise ValueError("block_sizes cannot be combined with learn_amax=True")
            if self._calib_method == "histogram":
                raise ValueError("block_sizes needs calib_method='max' (one histogram per block is too large)")

    # -- read-only properties ---------------------------------------------------
    @property
    def num_bits(self) -> Union[int, Tuple[int, int]]:
        return self._num_bits

    @property
    def name(self) -> Optional[str]:
        return self._name

    @property
    def fake_quant(self) -> bool:
        return self._fake_quant

    @property
    def axis(self) -> Optional[Union[int, Tuple[int, ...]]]:
        return self._axis

    @property
    def block_sizes(self) -> Optional[Dict[Union[int, str], Any]]:
        return copy.copy(self._block_sizes)

    @property
    def amax(self) -> Optional[np.ndarray]:
        """The user-given amax as a float32 ``np.ndarray`` (a copy), as pytorch-quantization
        returns it; None if not given."""
        return None if self._amax is None else self._amax.copy()

    @property
    def learn_amax(self) -> bool:
        return self._learn_amax

    @property
    def scale_amax(self) -> Optional[float]:
        return self._scale_amax

    @property
    def calib_method(self) -> str:
        return self._calib_method

    @property
    def unsigned(self) -> bool:
        return self._unsigned

    @property
    def narrow_range(self) -> bool:
        return self._narrow_range

    @property
    def dynamic(self) -> bool:
        return self._dynamic

    @property
    def bias(self) -> Optional[Dict[Union[int, str], Any]]:
        return copy.copy(self._bias)

    # -- comparison and printing -------------------------------------------------
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ScaledQuantDescriptor):
            return NotImplemented
        return self.dict() == other.dict()

    # mutable-looking value type, as pytorch-quantization's. (ignore: mypy types object.__hash__ as a
    # method and rejects None, Python's spelling of an unhashable class: python/mypy#4266)
    __hash__ = None  # type: ignore[assignment]

    def __str__(self) -> str:
        s = f"{self._name}: " if self._name is not None else "QuantDescriptor"
        s += "(" + ("unsigned " if self._unsigned else "") + f"{self._num_bits}bit"
        s += " fake" if self._fake_quant else " real"
        s += f" axis={self._axis}" if self._axis is not None else " per-tensor"
        if self._block_sizes is not None:
            s += f" block_sizes={self._block_sizes}"
        if self._amax is not None:
            flat = self._amax.flatten().tolist()
            s += f" amax={flat[0]:.2e}" if len(flat) == 1 else f" amax=[{min(flat):.2e}, {max(flat):.2e}]({len(flat)})"
        if self._learn_amax:
            s += " learn_amax"
        if self._scale_amax:
            s += f" scale_amax={self._scale_amax}"
        if self._narrow_range:
            s += " narrow"
        if self._dynamic:
            s += " dynamic"
        if self._bias is not None:
            s += f" bias={self._bias}"
        if self._calib_method != "max":
            s += f" calib_method={self._calib_method}"
        return s + ")"

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.dict().items())
        return f"QuantDescriptor({args})"

    # -- serialisation -------------------------------------------------------------
    def dict(self) -> Dict[str, Any]:
        """The constructor arguments that differ from their defaults (plus ``num_bits``
        and ``name``), as plain Python values: ``type(self)(**d.dict())`` equals ``d``."""
        d: Dict[str, Any] = {"num_bits": self._num_bits, "name": self._name}
        if not self._fake_quant:
            d["fake_quant"] = False
        if self._axis is not None:
            d["axis"] = self._axis
        if self._block_sizes is not None:
            d["block_sizes"] = dict(self._block_sizes)
        if self._amax is not None:
            d["amax"] = self._amax.tolist()
        if self._learn_amax:
            d["learn_amax"] = True
        if self._scale_amax is not None:
            d["scale_amax"] = self._scale_amax
        if self._calib_method != "max":
            d["calib_method"] = self._calib_method
        if self._unsigned:
            d["unsigned"] = True
        if self._narrow_range:
            d["narrow_range"] = True
        if self._dynamic:
            d["dynamic"] = True
        if self._bias is not None:
            d["bias"] = dict(self._bias)
        return d

    def to_yaml(self) -> str:
        """YAML of :meth:`dict` (tuples written as lists, so plain ``yaml.safe_load`` reads it)."""
        import yaml

        d = self.dict()
        for key in ("num_bits", "axis"):
            if isinstance(d.get(key), tuple):
                d[key] = list(d[key])
        if "block_sizes" in d:
            d["block_sizes"] = {k: list(v) if isinstance(v, tuple) else v for k, v in d["block_sizes"].items()}
        return yaml.safe_dump(d, width=120, sort_keys=False)

    @classmethod
    def from_yaml(cls, yaml_str: str) -> "ScaledQuantDescriptor":
        """The descriptor written by :meth:`to_yaml` (read with ``yaml.safe_load``)."""
        import yaml

        if not isinstance(yaml_str, str):
            raise TypeError(f"yaml_str must be a str, got {type(yaml_str).__name__}")
        d = yaml.safe_load(yaml_str)
        if not isinstance(d, dict):
            raise ValueError(f"the YAML must hold a mapping of descriptor arguments, got {d!r}")
        for key in ("num_bits", "axis"):
            if isinstance(d.get(key), list):
                d[key] = tuple(d[key])
        return cls(**d)


QuantDescriptor = ScaledQuantDescriptor

# Predefined descriptors (pytorch-quantization's names and values).
QUANT_DESC_8BIT_PER_TENSOR = QuantDescriptor(num_bits=8)
QUANT_DESC_UNSIGNED_8BIT_PER_TENSOR = QuantDescriptor(num_bits=8, unsigned=True)
QUANT_DESC_8BIT_CONV1D_WEIGHT_PER_CHANNEL = QuantDescriptor(num_bits=8, axis=0)
QUANT_DESC_8BIT_CONV2D_WEIGHT_PER_CHANNEL = QuantDescriptor(num_bits=8, axis=0)
QUANT_DESC_8BIT_CONV3D_WEIGHT_PER_CHANNEL = QuantDescriptor(num_bits=8, axis=0)
QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW = QuantDescriptor(num_bits=8, axis=0)
# A transposed convolution's weight is (in, out / groups, *kernel): its output
# channels are axis 1 (as in pytorch-quantization 2.2.1).
QUANT_DESC_8BIT_CONVTRANSPOSE1D_WEIGHT_PER_CHANNEL = QuantDescriptor(num_bits=8, axis=1)
QUANT_DESC_8BIT_CONVTRANSPOSE2D_WEIGHT_PER_CHANNEL = QuantDescriptor(num_bits=8, axis=1)
QUANT_DESC_8BIT_CONVTRANSPOSE3D_WEIGHT_PER_CHANNEL = QuantDescriptor(num_bits=8, axis=1)


# --- functions ---------------------------------------------------------------

Amax = Union[torch.Tensor, float]


def _amax_like(amax: Amax, inputs: torch.Tensor) -> torch.Tensor:
    if not isinstance(inputs, torch.Tensor):
        raise TypeError(f"inputs must be a tensor, got {type(inputs).__name__}")
    if isinstance(amax, torch.Tensor):
        if amax.device == inputs.device:
            return amax
        if amax.device.type == "meta":  # (no data to move)
            raise ValueError(f"amax is on {amax.device} but inputs are on {inputs.device}")
        return amax.to(inputs.device)
    if isinstance(amax, bool) or not isinstance(amax, numbers.Real):
        raise TypeError(f"amax must be a tensor or a number, got {type(amax).__name__}")
    return torch.tensor(float(amax), dtype=torch.float32, device=inputs.device)


def fake_tensor_quant(
    inputs: torch.Tensor, amax: Amax, num_bits: int = 8, unsigned: bool = False, narrow_range: bool = True
) -> torch.Tensor:
    """Fake-quantizes ``inputs`` to ``num_bits`` with range ``[-amax, amax]``.

    ``amax`` is a number or a tensor broadcastable to ``inputs`` (its shape
    sets the granularity: ``(C, 1, 1, 1)`` is per output channel of a conv
    weight). The gradient passes where ``|inputs| <= amax`` (straight-through
    estimator with clipping); only a 1-bit mask is kept for the backward.
    """
    return ops.fake_quantize_amax(inputs, _amax_like(amax, inputs), num_bits, unsigned, narrow_range)


def legacy_fake_tensor_quant(
    inputs: torch.Tensor, amax: Amax, num_bits: int = 8, unsigned: bool = False, narrow_range: bool = True
) -> torch.Tensor:
    """pytorch-quantization's pure-PyTorch fake quantization, kept for its name:
    here it is the same operator as :func:`fake_tensor_quant`."""
    return fake_tensor_quant(inputs, amax, num_bits, unsigned, narrow_range)


def tensor_quant(
    inputs: torch.Tensor, amax: Amax, num_bits: int = 8, unsigned: bool = False, narrow_range: bool = True
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Quantizes ``inputs``: returns ``(outputs, scale)`` with integer-valued
    ``outputs`` (in ``inputs``' dtype) and ``scale = bound / amax`` (1 where
    amax is 0) in ``inputs``' dtype, so that ``outputs / scale`` dequantizes.
    Differentiable in ``inputs`` (straight-through with clipping)."""
    outputs, scale = ops.quantize_amax(inputs, _amax_like(amax, inputs), num_bits, unsigned, narrow_range)
    return outputs, scale_in_input_dtype(scale, inputs, amax)


def scale_in_input_dtype(scale: torch.Tensor, inputs: torch.Tensor, amax: Amax) -> torch.Tensor:
    """``tensor_quant``'s scale in ``inputs``' dtype (for TensorQuantizer too)."""
    if inputs.dtype == torch.half and scale.device.type == "cpu" and bool((scale > 65504).any()):
        raise ValueError(f"scale is too large for FP16: the scale bound / amax overflows float16 for amax={amax}")
    return scale.to(inputs.dtype)


def fake_affine_tensor_quant(
    inputs: torch.Tensor, min_range: Amax, max_range: Amax, num_bits: int = 8
) -> torch.Tensor:
    """Asymmetric fake quantization of ``inputs`` to ``2^num_bits`` levels over
    ``[min_range, max_range]``; the gradient passes inside the range."""
    return ops.fake_quantize_min_max(inputs, min_range, max_range, num_bits)


def _fp8_amax(amax: Optional[Amax], inputs: torch.Tensor, E: int, M: int) -> torch.Tensor:
    # amax None: scale 1, i.e. amax is the format's largest value.
    if amax is None:
        if not isinstance(inputs, torch.Tensor):
            raise TypeError(f"inputs must be a tensor, got {type(inputs).__name__}")
        return torch.tensor(ops.fp8_max(E, M), dtype=torch.float32, device=inputs.device)
    return _amax_like(amax, inputs)


def scaled_e4m3(inputs: torch.Tensor, amax: Optional[Amax] = None, E: int = 4, M: int = 3) -> torch.Tensor:
    """FP8 fake quantization of ``inputs`` with scale ``amax / 448``: the values of
    ``x / scale`` are saturated to [-448, 448] and rounded to FP8 E4M3 (to nearest
    even, as ``.to(torch.float8_e4m3fn)``), then multiplied back by the scale.

    ``amax`` is a number or a tensor broadcastable to ``inputs``; ``None`` means
    scale 1 (plain E4M3 rounding). ``E=5, M=2`` selects E5M2 (max 57344). Where
    ``amax <= 2^-24`` the output is 0. The gradient passes where ``|inputs| <= amax``
    (straight-through estimator with clipping); only a 1-bit mask is kept.
    """
    return ops.fake_quantize_fp8(inputs, _fp8_amax(amax, inputs, E, M), E, M)


# --- torch.autograd.Function classes -------------------------------------------
#
# pytorch-quantization exposes its functions as Function classes, and scripts call
# ``FakeTensorQuantFunction.apply(...)``. Here each is a thin Function over the
# same operator as the function of its name: the forward runs the operator and
# keeps the 1-bit mask it returns, the backward is the operator's own mask
# backward (fakequant.ops.mask_grad). Nothing is computed a second way.


def _output_and_mask(ctx: Any, result: Tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    y, mask = result
    ctx.save_for_backward(mask)
    ctx.output_stride = y.stride()
    return y


def _mask_grad(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
    (mask,) = ctx.saved_tensors
    return ops.mask_grad(grad, mask, ctx.output_stride)


class FakeTensorQuantFunction(torch.autograd.Function):
    """``apply(inputs, amax, num_bits=8, unsigned=False, narrow_range=True)``: :func:`fake_tensor_quant`."""

    @staticmethod
    def forward(
        ctx: Any, inputs: torch.Tensor, amax: Amax, num_bits: int = 8, unsigned: bool = False,
        narrow_range: bool = True,
    ) -> torch.Tensor:
        return _output_and_mask(ctx, ops.fake_quantize_amax(
            inputs, _amax_like(amax, inputs), num_bits, unsigned, narrow_range, return_mask=True))

    @staticmethod
    def backward(ctx: Any, grad_outputs: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:
        return _mask_grad(ctx, grad_outputs), None, None, None, None


class LegacyFakeTensorQuantFunction(FakeTensorQuantFunction):
    """``apply``: :func:`legacy_fake_tensor_quant` (the same operator)."""


class TensorQuantFunction(torch.autograd.Function):
    """``apply(inputs, amax, num_bits=8, unsigned=False, narrow_range=True)``: :func:`tensor_quant`."""

    @staticmethod
    def forward(
        ctx: Any, inputs: torch.Tensor, amax: Amax, num_bits: int = 8, unsigned: bool = False,
        narrow_range: bool = True,
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        amax = _amax_like(amax, inputs)
        outputs, scale, mask = ops.quantize_amax(inputs, amax, num_bits, unsigned, narrow_range, return_mask=True)
        outputs = _output_and_mask(ctx, (outputs, mask))
        ctx.mark_non_differentiable(scale)
        return outputs, scale_in_input_dtype(scale, inputs, amax)

    @staticmethod
    def backward(
        ctx: Any, grad_outputs: torch.Tensor, grad_scale: Optional[torch.Tensor]
    ) -> Tuple[Optional[torch.Tensor], ...]:
        return _mask_grad(ctx, grad_outputs), None, None, None, None


class FakeAffineTensorQuantFunction(torch.autograd.Function):
    """``apply(inputs, min_range, max_range, num_bits=8)``: :func:`fake_affine_tensor_quant`."""

    @staticmethod
    def forward(ctx: Any, inputs: torch.Tensor, min_range: Amax, max_range: Amax, num_bits: int = 8) -> torch.Tensor:
        return _output_and_mask(ctx, ops.fake_quantize_min_max(inputs, min_range, max_range, num_bits,
                                                              return_mask=True))

    @staticmethod
    def backward(ctx: Any, grad_outputs: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:
        return _mask_grad(ctx, grad_outputs), None, None, None


class ScaledE4M3Function(torch.autograd.Function):
    """``apply(inputs, amax=None, E=4, M=3)``: :func:`scaled_e4m3`."""

    @staticmethod
    def forward(ctx: Any, inputs: torch.Tensor, amax: Optional[Amax] = None, E: int = 4, M: int = 3) -> torch.Tensor:
        return _output_and_mask(ctx, ops.fake_quantize_fp8(inputs, _fp8_amax(amax, inputs, E, M), E, M,
                                                          return_mask=True))

    @staticmethod
    def backward(ctx: Any, grad_outputs: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:
        return _mask_grad(ctx, grad_outputs), None, None, None
