"""How each ``torch.ops.fakequant`` operator becomes ONNX, for both exporters.

The functions here are written against a small graph-builder interface
(:class:`Builder`): the TorchScript exporter and the dynamo exporter each
implement it (``symbolic_torchscript.py``, ``translation_dynamo.py``), so the
graph is the same whichever exporter runs.

The contract to reproduce (docs/design.md, "Numerics contract"): with ``s`` the float32 scale,
``y = dtype_of_x((clamp(rint(fp32(x) / s) + zp, qmin, qmax) - zp) * s)``.
ONNX ``QuantizeLinear`` computes ``saturate(rint(x / s) + zp)`` and
``DequantizeLinear`` ``(q - zp) * s``, in float32 when ``x`` and ``s`` are
float32, so the pair reproduces it bit for bit when:

* the scale is the float32 value the operator used (``fp32(amax) / bound``,
  one IEEE division; the exporters fold it into an initializer);
* ``x`` is float32: float16/bfloat16 inputs are cast to float32 before
  QuantizeLinear and the float32 result cast back after DequantizeLinear (the
  operator also computes in float32 and rounds once at the end);
* ``[qmin, qmax]`` is the saturation range of the integer type, or a Clip
  narrows it (on the integer tensor for int8/uint8, after DequantizeLinear for
  the 4- and 16-bit types, which ONNX Runtime's Clip does not take).

Where no QDQ pair can reproduce the operator (float64 inputs, more than 8 bits
below opset 21, a scale that varies along more than one axis) the graph is the
arithmetic itself: Div, Round (ties to even), Clip, Mul; a warning says so.
"""
import math
import warnings
from typing import Dict, Optional, Set, Tuple

import torch

from ... import _core

# ONNX TensorProto data types (no import of onnx needed).
FLOAT, UINT8, INT8, UINT16, INT16 = 1, 2, 3, 4, 5
FLOAT16, DOUBLE, BFLOAT16, UINT4, INT4 = 10, 11, 16, 21, 22
FLOAT8E4M3FN, FLOAT8E5M2 = 17, 19

_INT_RANGES = {
    INT4: (-8, 7), UINT4: (0, 15), INT8: (-128, 127), UINT8: (0, 255),
    INT16: (-32768, 32767), UINT16: (0, 65535),
}
_TYPE_NAMES = {INT4: "int4", UINT4: "uint4", INT8: "int8", UINT8: "uint8", INT16: "int16", UINT16: "uint16"}
INT32, INT64, BOOL = 6, 7, 9
# The ONNX type of each torch dtype a lowering's values can have (the builders map both ways).
ONNX_TYPES = {torch.float32: FLOAT, torch.uint8: UINT8, torch.int8: INT8, torch.uint16: UINT16, torch.int16: INT16,
              torch.int32: INT32, torch.int64: INT64, torch.bool: BOOL, torch.float16: FLOAT16, torch.float64: DOUBLE,
              torch.bfloat16: BFLOAT16, torch.float8_e4m3fn: FLOAT8E4M3FN, torch.float8_e5m2: FLOAT8E5M2}
ONNX_FLOAT_TYPES = {dt: ONNX_TYPES[dt] for dt in (torch.float32, torch.float16, torch.bfloat16, torch.float64)}

# Scale given to channels whose amax is <= 2^-24, which the operators set to 0:
# rint(x / 2^100) is 0 for every |x| < 2^99 (all float16 values, and any
# activation a network produces), so the QDQ pair yields 0 as the operator does.
ZERO_CHANNEL_SCALE = 2.0**100


class ExportWarning(UserWarning):
    """A fakequant ONNX export that is exact in ONNX Runtime but not QDQ-only or
    not constant-scale, so TensorRT may not take it as is."""


class Builder:
    """What a lowering needs from an exporter. ``opset`` is the ONNX opset
    the graph is built for."""

    opset: int
    # Whether the exporter's graph can carry int4/uint4/int16/uint16 tensors
    # (the TorchScript exporter's cannot: it maps every ONNX type to a torch dtype).
    wide_int_types: bool = True

    def op(self, op_type: str, *inputs, **attrs):
        raise NotImplementedError

    def const(self, tensor: torch.Tensor):
        raise NotImplementedError

    def ints(self, values) -> object:
        """A constant int64 vector (axes, shapes, pads, slice bounds)."""
        return self.const(torch.tensor(list(values), dtype=torch.int64))

    def dtype(self, value) -> Optional[torch.dtype]:
        raise NotImplementedError

    def shape(self, value) -> Optional[Tuple[Optional[int], ...]]:
        raise NotImplementedError

    def depends_on(self, value, other) -> bool:
        """Whether ``value`` is computed from ``other``."""
        raise NotImplementedError


def _warn(message):
    warnings.warn("fakequant ONNX export: " + message, ExportWarning, stacklevel=4)


# --- small helpers ----------------------------------------------------------------


def _to_float(b, value, onnx_type=FLOAT):
    dt = b.dtype(value)
    if dt is not None and ONNX_FLOAT_TYPES.get(dt) == onnx_type:
        return value
    return b.op("Cast", value, to=onnx_type)


def _scalar(b, value, dtype=torch.float32):
    return b.const(torch.tensor(value, dtype=dtype))


def _axes(b, axes):
    return b.ints(axes)


def _squeeze(b, value):
    """``value`` without its size-1 dimensions: a scalar, or (C,) for a per-axis parameter.
    (Squeeze/Unsqueeze rather than Reshape: ONNX's version converter, which the
    dynamo exporter runs for opsets below 18, has no Reshape-14 -> 13 adapter.)"""
    shape = b.shape(value)
    if shape is None:
        raise RuntimeError("fakequant ONNX export: a quantization parameter has an unknown shape")
    # One axis at a time, from the last: the TorchScript exporter's constant
    # folding gets Squeeze with several axes wrong.
    for i in reversed(range(len(shape))):
        if shape[i] == 1:
            value = b.op("Squeeze", value, _axes(b, [i]))
    return value


def _int_const(b, value, onnx_type, shape=()):
    dtype = {INT8: torch.int8, UINT8: torch.uint8}[onnx_type]
    return b.const(torch.full(tuple(shape), value, dtype=dtype))


def _rank(b, value, what):
    shape = b.shape(value)
    if shape is None:
        raise RuntimeError(f"fakequant ONNX export: the rank of {what} is unknown")
    return len(shape)


def _granularity(b, x, param_shapes):
    """``(kind, axis, channels)`` of parameters broadcast to ``x``: ``("tensor",
    None, 1)``, ``("axis", axis, C)`` when they vary along one axis of ``x``,
    or ``("broadcast", None, None)`` when no per-axis QDQ can hold them."""
    rank = _rank(b, x, "the input")
    varying: Dict[int, Set[int]] = {}
    for shape in param_shapes:
        if shape is None or any(d is None for d in shape):
            return "broadcast", None, None
        offset = rank - len(shape)
        for i, d in enumerate(shape):
            if d != 1:
                varying.setdefault(offset + i, set()).add(d)
    if not varying:
        return "tensor", None, 1
    if len(varying) == 1:
        (axis, sizes), = varying.items()
        if len(sizes) == 1:
            return "axis", axis, sizes.pop()
    return "broadcast", None, None


def _compute_type(b, x):
    dt = b.dtype(x)
    if dt is None:
        raise RuntimeError("fakequant ONNX export: the input's dtype is unknown")
    if dt not in ONNX_FLOAT_TYPES:
        raise TypeError(f"fakequant ONNX export: input must be float32, float16, bfloat16 or float64, got {dt}")
    return dt, (DOUBLE if dt == torch.float64 else FLOAT)


def choose_qtype(qmin: int, qmax: int, opset: int, prefer_unsigned: bool, wide_int_types: bool = True) -> Optional[int]:
    """The ONNX integer type whose saturation range is the smallest holding
    ``[qmin, qmax]`` at this opset, or None when none does."""
    candidates = []
    if opset < 21 or not wide_int_types:
        opset = min(opset, 20)
    if opset >= 21:
        candidates += [UINT4, INT4] if prefer_unsigned else [INT4, UINT4]
    candidates += [UINT8, INT8] if prefer_unsigned else [INT8, UINT8]
    if opset >= 21:
        candidates += [UINT16, INT16] if prefer_unsigned else [INT16, UINT16]
    for t in candidates:
        lo, hi = _INT_RANGES[t]
        if lo <= qmin and qmax <= hi:
            return t
    return None


class _Clip:
    """How ``[qmin, qmax]`` is imposed inside the type's saturation range."""

    def __init__(self, qtype, qmin, qmax):
        lo, hi = _INT_RANGES[qtype]
        self.needed = (qmin, qmax) != (lo, hi)
        # ONNX Runtime's Clip takes int8 and uint8 tensors; other types are
        # clipped after DequantizeLinear, in float (exact: q -> (q - zp) * s is monotonic).
        self.on_integers = qtype in (INT8, UINT8)
        self.narrow_only = (qmin, qmax) == (lo + 1, hi) and lo < 0


def _numel(shape):
    return math.prod(shape)


def _describe(qmin, qmax):
    return f"[{qmin}, {qmax}]"


# --- the QDQ core -------------------------------------------------------------------


def _qdq(b, x, scale, zero_point, axis, channels, qmin, qmax, qtype, integer_output=False,
         zero_point_float=None):
    """Q -> [Clip] -> DQ (or the integer values) of float32 ``x`` with a float32
    ``scale`` (scalar or (C,)) and ``zero_point`` (None: 0, or a value of ``qtype``).
    ``zero_point_float``: the zero point as float32, needed for a float-side clip."""
    clip = _Clip(qtype, qmin, qmax)
    if clip.needed and clip.narrow_only and not _core.current_export_options().clip_narrow_range:
        _warn(f"the range {_describe(qmin, qmax)} is exported as {_TYPE_NAMES[qtype]} "
              f"{_describe(*_INT_RANGES[qtype])} without its Clip (clip_narrow_range=False): "
              f"values that round below {qmin} give {qmin - 1} * scale where PyTorch gives {qmin} * scale")
        clip.needed = False
    axis_attr = {} if axis is None else {"axis": axis}
    if qtype in (INT8, UINT8) and (zero_point is not None or b.opset < 21):
        # Below opset 21 only a zero point makes QuantizeLinear's output int8. From 21 on a
        # zero point of 0 is left out (output_dtype says the type): ONNX Runtime 1.31-1.32's
        # default optimizations rewrite a MatMul on a 3-D input plus a bias Add into Gemm, copy
        # the input's QuantizeLinear with output_dtype and a uint8 zero point of their own,
        # and then refuse the model (every transformer's Linear hit it).
        zp = zero_point if zero_point is not None else _int_const(
            b, 0, qtype, () if axis is None else (channels,))
        q = b.op("QuantizeLinear", x, scale, zp, **axis_attr)
    else:
        if zero_point is None:
            zp = None
            q = b.op("QuantizeLinear", x, scale, output_dtype=qtype, **axis_attr)
        else:
            zp = zero_point
            q = b.op("QuantizeLinear", x, scale, zp, **axis_attr)
    if clip.needed and clip.on_integers:
        q = b.op("Clip", q, _int_const(b, qmin, qtype), _int_const(b, qmax, qtype))
    if integer_output:  # quantize_amax: rint(x / s) clamped, zero point 0
        y = b.op("Cast", q, to=FLOAT)
        if clip.needed and not clip.on_integers:
            y = b.op("Clip", y, _scalar(b, float(qmin)), _scalar(b, float(qmax)))
        return y
    dq_inputs = (q, scale) if zp is None else (q, scale, zp)
    y = b.op("DequantizeLinear", *dq_inputs, **axis_attr)
    if clip.needed and not clip.on_integers:
        s_b = _broadcast_param(b, scale, axis, x)
        if zero_point is None:
            lo = b.op("Mul", _scalar(b, float(qmin)), s_b)
            hi = b.op("Mul", _scalar(b, float(qmax)), s_b)
        else:
            z_b = _broadcast_param(b, zero_point_float, axis, x)
            lo = b.op("Mul", b.op("Sub", _scalar(b, float(qmin)), z_b), s_b)
            hi = b.op("Mul", b.op("Sub", _scalar(b, float(qmax)), z_b), s_b)
        y = _float_clip(b, y, lo, hi, axis is not None)
    return y


def _broadcast_param(b, param, axis, x):
    """A scalar or (C,) parameter reshaped to broadcast against ``x`` along ``axis``."""
    if axis is None:
        return param
    return b.op("Unsqueeze", param, _axes(b, [d for d in range(_rank(b, x, "the input")) if d != axis]))


def _float_clip(b, y, lo, hi, per_channel):
    if not per_channel:
        lo = _scalar(b, lo) if isinstance(lo, float) else lo
        hi = _scalar(b, hi) if isinstance(hi, float) else hi
        return b.op("Clip", y, lo, hi)
    lo = _scalar(b, lo) if isinstance(lo, float) else lo
    hi = _scalar(b, hi) if isinstance(hi, float) else hi
    return b.op("Max", b.op("Min", y, hi), lo)


def _unsigned_zero(b, r, dtype=torch.float32):
    """The rounded level with +0.0 for -0.0 (Round keeps the sign of a small negative
    quotient; the operators give +0.0), every other value unchanged. A Where: the
    exporters' optimizers drop an ``Add(r, 0)``."""
    zero = _scalar(b, 0.0, dtype)
    return b.op("Where", b.op("Equal", r, zero), zero, r)


def _cast_back(b, y, dtype, onnx_compute):
    target = ONNX_FLOAT_TYPES[dtype]
    return y if target == onnx_compute else b.op("Cast", y, to=target)


def _warn_dynamic(b, param, x, what):
    if b.depends_on(param, x):
        _warn(f"{what} is computed from the input (dynamic range): the graph computes the scale at run "
              "time, which ONNX Runtime runs but TensorRT does not take (it needs constant scales); "
              "calibrate the quantizer (or give it an amax) for a deployable graph")

BLOCK_MIN_OPSET = 21  # QuantizeLinear/DequantizeLinear with block_size
