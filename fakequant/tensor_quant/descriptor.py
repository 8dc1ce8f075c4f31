"""The quantization descriptor: how a tensor is quantized, each argument checked once.

:class:`ScaledQuantDescriptor` (alias ``QuantDescriptor``) is a frozen dataclass. Its
constructor keeps pytorch-quantization's shape (``num_bits`` and ``name``, then keyword
arguments), checks every argument with the rule of :data:`_CHECKS` and the combinations
with :meth:`ScaledQuantDescriptor._check_combination`; the fields are the checked values.
:meth:`~ScaledQuantDescriptor.dict` and YAML are written from the fields.
"""
from __future__ import annotations

import copy
import dataclasses
import math
import numbers
from typing import Any, Callable, Dict, Generic, Optional, Tuple, TypeVar, Union, overload

import numpy as np
import torch

from .. import _core
from .._core import check_bool, check_num_bits, is_int, normalize_axis

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
]

# The integer widths the operators implement (the library's limits).
MIN_NUM_BITS, MAX_NUM_BITS = _core.MIN_NUM_BITS, _core.MAX_NUM_BITS
# Floating-point (exponent, mantissa) formats a descriptor may name.
# (E, M): FP8 E4M3 and E5M2; FP4 E2M1 for block-wise quantization (NVFP4)
FP_FORMATS = tuple(_core.FLOAT_FORMAT_MAX)
CALIB_METHODS = ("max", "histogram")
_BLOCK_STRING_KEYS = ("type", "scale_bits", "scale_block_sizes")
_BIAS_STRING_KEYS = {"type": ("static", "dynamic"), "method": ("mean", "max_min")}


# --- the rule of each argument: (value) -> the value kept ------------------------------------


def _check_name(name: Any) -> Optional[str]:
    if name is not None and not isinstance(name, str):
        raise TypeError(f"name must be a str or None, got {name!r} ({type(name).__name__})")
    return name


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
        raise TypeError(f"{name} must be float, list or ndarray (or a tensor), got {type(amax).__name__}")
    if value.size == 0:
        raise ValueError(f"{name} must not be empty")
    if not bool(np.isfinite(value).all()) or bool((value < 0).any()):
        raise ValueError(f"{name} must be finite and >= 0, got {amax!r}")
    return value


def _check_scale_amax(scale_amax: Any) -> Optional[float]:
    if scale_amax is None:
        return None
    if isinstance(scale_amax, bool) or not isinstance(scale_amax, numbers.Real):
        raise TypeError(f"scale_amax must be a number or None, got {scale_amax!r}")
    # (ignore: typeshed's numbers.Real declares __lt__/__le__ only, not __gt__ with an int)
    if not (math.isfinite(scale_amax) and scale_amax > 0):  # type: ignore[operator]
        raise ValueError(f"scale_amax must be finite and > 0, got {scale_amax!r}")
    return scale_amax  # type: ignore[return-value]  # (a numbers.Real, kept as given)


def _check_calib_method(method: Any) -> str:
    if method not in CALIB_METHODS:
        raise ValueError(f"calib_method must be one of {list(CALIB_METHODS)}, got {method!r}")
    return method


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
        elif is_int(key):
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
            if key == "scale_bits":
                _core.BlockScales.of_scale_bits(value)  # (the one reading of the spelling: raises for others)
            out[key] = tuple(value) if isinstance(value, list) else value
        elif is_int(key):
            if value is not None and not (is_int(value) and value > 0):
                raise ValueError(
                    f"block_sizes[{key}] must be a positive int or None (the whole axis), got {value!r}"
                )
            out[int(key)] = None if value is None else int(value)
        else:
            raise TypeError(f"block_sizes keys must be ints (axes) or strings, got {key!r}")
    if not any(isinstance(k, int) for k in out):
        raise ValueError(f"block_sizes must name at least one axis, got {block_sizes!r}")
    return out


def _flag(name: str) -> Callable[[Any], bool]:
    return lambda value: check_bool(value, name)


# The rule of each argument, in the order they are checked (the first bad one raises).
_CHECKS: Dict[str, Callable[[Any], Any]] = {
    "num_bits": check_num_bits,
    "name": _check_name,
    "fake_quant": _flag("fake_quant"),
    "axis": normalize_axis,
    "block_sizes": _normalize_block_sizes,
    "learn_amax": _flag("learn_amax"),
    "amax": lambda amax: None if amax is None else _amax_to_array(amax),
    "scale_amax": _check_scale_amax,
    "calib_method": _check_calib_method,
    "unsigned": _flag("unsigned"),
    "narrow_range": _flag("narrow_range"),
    "dynamic": _flag("dynamic"),
    "bias": _normalize_bias,
}

_T = TypeVar("_T")


class _ReadCopy(Generic[_T]):
    """A field of a mutable type (ndarray, dict), read as a copy: the descriptor keeps its value."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    @overload
    def __get__(self, obj: None, owner: Optional[type] = None) -> None: ...

    @overload
    def __get__(self, obj: object, owner: Optional[type] = None) -> _T: ...

    def __get__(self, obj: Optional[object], owner: Optional[type] = None) -> Optional[_T]:
        if obj is None:
            return None  # the field's default, as dataclasses reads it
        return copy.copy(obj.__dict__[self._name])

    def __set__(self, obj: object, value: _T) -> None:
        # (the frozen dataclass's __setattr__ refuses assignments before this is reached)
        obj.__dict__[self._name] = value


@dataclasses.dataclass(frozen=True, eq=False, repr=False, init=False)
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
            returned by the ``amax`` field) as a float32 ``np.ndarray``.
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

    The fields hold the checked arguments and are read-only (``amax``, ``block_sizes`` and
    ``bias`` read as copies). Descriptors compare equal when all their fields are equal;
    :meth:`dict`, :meth:`to_yaml` and :meth:`from_yaml` round-trip exactly.
    """

    num_bits: Union[int, Tuple[int, int]] = 8
    name: Optional[str] = None
    fake_quant: bool = True
    axis: Optional[Union[int, Tuple[int, ...]]] = None
    block_sizes: _ReadCopy[Optional[Dict[Union[int, str], Any]]] = _ReadCopy()
    amax: _ReadCopy[Optional[np.ndarray]] = _ReadCopy()
    learn_amax: bool = False
    scale_amax: Optional[float] = None
    calib_method: str = "max"
    unsigned: bool = False
    narrow_range: bool = False
    dynamic: bool = False
    bias: _ReadCopy[Optional[Dict[Union[int, str], Any]]] = _ReadCopy()

    def __init__(self, num_bits: Union[int, Tuple[int, int]] = 8, name: Optional[str] = None, **kwargs: Any) -> None:
        kwargs.update(num_bits=num_bits, name=name)
        values = {key: check(kwargs.pop(key, _DEFAULTS[key])) for key, check in _CHECKS.items()}
        kind = kwargs.pop("type", None)  # Model Optimizer's spelling of dynamic=True
        if kind is not None:
            if kind not in ("static", "dynamic"):
                raise ValueError(f"type must be 'static' or 'dynamic', got {kind!r}")
            if kind == "static" and values["dynamic"]:
                raise ValueError("type='static' contradicts dynamic=True")
            values["dynamic"] = values["dynamic"] or kind == "dynamic"
        if kwargs:
            raise TypeError(f"QuantDescriptor got unexpected keyword arguments: {sorted(kwargs)}")
        self._check_combination(**values)
        for key, value in values.items():
            object.__setattr__(self, key, value)

    @staticmethod
    def _check_combination(*, num_bits: Any, axis: Any, block_sizes: Any, learn_amax: bool, amax: Any,
                           calib_method: str, unsigned: bool, fake_quant: bool, **_: Any) -> None:
        """The rules between arguments (each one checked already)."""
        if learn_amax and axis is not None:
            # (pytorch-quantization raised TypeError, with the words in parentheses)
            raise _core.TypeAndValueError(
                f"learn_amax=True learns one amax per tensor; axis must be None, got {axis!r} "
                f"(axis is ignored and must be None when learn_amax is true, got {type(axis)}.)")
        if learn_amax and amax is not None and amax.size != 1:
            raise ValueError(
                f"learn_amax=True learns one amax per tensor; amax must hold one value, got shape "
                f"{tuple(amax.shape)}"
            )
        scale_format = None if block_sizes is None else _core.BlockScales.of_scale_bits(block_sizes.get("scale_bits"))
        if num_bits == (2, 1) and (block_sizes is None or block_sizes.get("type") != "dynamic"):
            raise ValueError("num_bits=(2, 1) (FP4 E2M1) needs dynamic block-wise scales, e.g. "
                             f"block_sizes={{-1: 16, 'type': 'dynamic', 'scale_bits': {_core.BlockScales.E4M3.scale_bits}}} "
                             "(NVFP4)")
        if scale_format is _core.BlockScales.GGML:
            # llama.cpp's blocks (fakequant.ops.fake_quantize_ggml): its rule, its two types
            if num_bits not in _core.GGML_BLOCK_TYPES or unsigned or not fake_quant:
                raise ValueError(f"block_sizes['scale_bits'] = {scale_format.scale_bits} (llama.cpp's float16 block scales) takes "
                                 f"num_bits 8 (Q8_0) or 4 (Q4_0), signed, fake_quant=True; got num_bits="
                                 f"{num_bits!r}, unsigned={unsigned}, fake_quant={fake_quant}")
        if block_sizes is not None:
            if axis is not None:
                raise ValueError(f"block_sizes and axis cannot be combined, got axis={axis!r}")
            if learn_amax:
                raise ValueError("block_sizes cannot be combined with learn_amax=True")
            if calib_method == "histogram":
                raise ValueError("block_sizes needs calib_method='max' (one histogram per block is too large)")

    def __setstate__(self, state: Dict[str, Any]) -> None:
        # Descriptors pickled before the fields were public kept them as "_num_bits", ...
        fields = {k[1:] if k.startswith("_") else k: v for k, v in state.items()}
        self.__dict__.update({key: fields.get(key, _DEFAULTS[key]) for key in _CHECKS})

    # -- comparison and printing -------------------------------------------------
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ScaledQuantDescriptor):
            return NotImplemented
        return self.dict() == other.dict()

    # mutable-looking value type, as pytorch-quantization's. (ignore: mypy types object.__hash__ as a
    # method and rejects None, Python's spelling of an unhashable class: python/mypy#4266)
    __hash__ = None  # type: ignore[assignment]

    def __str__(self) -> str:
        s = f"{self.name}: " if self.name is not None else "QuantDescriptor"
        s += "(" + ("unsigned " if self.unsigned else "") + f"{self.num_bits}bit"
        s += " fake" if self.fake_quant else " real"
        s += f" axis={self.axis}" if self.axis is not None else " per-tensor"
        if self.block_sizes is not None:
            s += f" block_sizes={self.block_sizes}"
        amax = self.amax
        if amax is not None:
            flat = amax.flatten().tolist()
            s += f" amax={flat[0]:.2e}" if len(flat) == 1 else f" amax=[{min(flat):.2e}, {max(flat):.2e}]({len(flat)})"
        if self.learn_amax:
            s += " learn_amax"
        if self.scale_amax:
            s += f" scale_amax={self.scale_amax}"
        if self.narrow_range:
            s += " narrow"
        if self.dynamic:
            s += " dynamic"
        if self.bias is not None:
            s += f" bias={self.bias}"
        if self.calib_method != "max":
            s += f" calib_method={self.calib_method}"
        return s + ")"

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.dict().items())
        return f"QuantDescriptor({args})"

    # -- serialisation -------------------------------------------------------------
    def dict(self) -> Dict[str, Any]:
        """The constructor arguments that differ from their defaults (plus ``num_bits``
        and ``name``), as plain Python values: ``type(self)(**d.dict())`` equals ``d``."""
        d: Dict[str, Any] = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            default = _DEFAULTS[field.name]
            if field.name in ("num_bits", "name") or (value is not None if default is None else value != default):
                d[field.name] = value.tolist() if isinstance(value, np.ndarray) else value
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


_DEFAULTS: Dict[str, Any] = {f.name: f.default for f in dataclasses.fields(ScaledQuantDescriptor)}
assert set(_DEFAULTS) == set(_CHECKS), "one rule per field"

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
