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

from .. import _core

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


# --- amax family: fake_quantize_amax, quantize_amax ---------------------------------


def _amax_scale(b, amax32, bound):
    """``fp32(amax) / bound``, with ZERO_CHANNEL_SCALE where amax <= 2^-24."""
    s = b.op("Div", amax32, _scalar(b, float(bound)))
    keep = b.op("Greater", amax32, _scalar(b, _core.AMAX_EPSILON))
    return b.op("Where", keep, s, _scalar(b, ZERO_CHANNEL_SCALE))


def lower_amax(b, x, amax, num_bits, unsigned, narrow_range, integer_output=False):
    """``fake_quantize_amax`` (or ``quantize_amax`` with ``integer_output``)."""
    dtype, compute = _compute_type(b, x)
    qmin, qmax = _core.amax_range(num_bits, unsigned, narrow_range)
    bound = qmax
    _warn_dynamic(b, amax, x, "amax")
    kind, axis, channels = _granularity(b, x, [b.shape(amax)])
    qtype = choose_qtype(qmin, qmax, b.opset, unsigned, b.wide_int_types)
    block = _block_layout(b, x, amax) if kind == "broadcast" else None
    if block is not None and qtype is not None and dtype != torch.float64 and b.opset >= BLOCK_MIN_OPSET:
        return _cast_back(b, _blocked_qdq(b, x, amax, block, bound, qmin, qmax, qtype, unsigned, integer_output),
                          dtype, FLOAT)
    reason = _no_qdq_reason(dtype, kind, qtype, qmin, qmax, b)
    if reason is not None:
        _warn(f"{num_bits}-bit amax quantization {reason}; exported as Div/Round/Clip/Mul "
              "(exact in ONNX Runtime, but not a QuantizeLinear/DequantizeLinear pair)")
        ct = torch.float64 if compute == DOUBLE else torch.float32
        s = _to_float(b, _amax_scale(b, _to_float(b, amax), bound), compute)  # amax's own shape
        r = _unsigned_zero(b, b.op("Round", b.op("Div", _to_float(b, x, compute), s)), ct)
        q = b.op("Clip", r, _scalar(b, float(qmin), ct), _scalar(b, float(qmax), ct))
        y = q if integer_output else b.op("Mul", q, s)
        return _cast_back(b, y, dtype, compute)
    scale = _amax_scale(b, _to_float(b, _squeeze(b, amax)), bound)
    y = _qdq(b, _to_float(b, x), scale, None, axis, channels, qmin, qmax, qtype, integer_output)
    return _cast_back(b, y, dtype, FLOAT)


def _block_layout(b, x, amax):
    """``(axis, block_size)`` when ``amax`` is shaped like ``x`` but for one axis where it
    has size 1: one amax per block of that whole axis (how TensorQuantizer's static
    block-wise quantization lays out a weight), which a block-wise QuantizeLinear holds."""
    xs, shape = b.shape(x), b.shape(amax)
    if xs is None or shape is None or any(d is None for d in xs + shape) or len(shape) > len(xs):
        return None
    shape = (1,) * (len(xs) - len(shape)) + tuple(shape)
    differing = [d for d in range(len(xs)) if shape[d] != xs[d]]
    if len(differing) != 1 or shape[differing[0]] != 1:
        return None
    return differing[0], xs[differing[0]]


def _blocked_qdq(b, x, amax, block, bound, qmin, qmax, qtype, unsigned, integer_output):
    axis, block_size = block
    rank = _rank(b, x, "the input")
    if _Clip(qtype, qmin, qmax).needed and qtype not in (INT8, UINT8):
        qtype = choose_qtype(qmin, qmax, 13, unsigned)  # clip on 8-bit integers: exact
    a = _to_float(b, amax)
    missing = rank - _rank(b, a, "amax")
    if missing:
        a = b.op("Unsqueeze", a, _axes(b, range(missing)))
    scale = _amax_scale(b, a, bound)
    attrs = {"axis": axis, "block_size": block_size}
    q = b.op("QuantizeLinear", _to_float(b, x), scale, output_dtype=qtype, **attrs)
    if _Clip(qtype, qmin, qmax).needed:
        q = b.op("Clip", q, _int_const(b, qmin, qtype), _int_const(b, qmax, qtype))
    if integer_output:
        return b.op("Cast", q, to=FLOAT)
    return b.op("DequantizeLinear", q, scale, **attrs)


def _no_qdq_reason(dtype, kind, qtype, qmin, qmax, b):
    if dtype == torch.float64:
        return "of a float64 tensor has no QuantizeLinear (float32/16 only)"
    if kind == "broadcast":
        return "with a scale that varies along more than one axis has no per-axis QuantizeLinear"
    if qtype is None:
        if not b.wide_int_types:
            return (f"to the range {_describe(qmin, qmax)} needs an int16 QuantizeLinear, which the "
                    "TorchScript exporter cannot write (use dynamo=True and opset_version >= 21)")
        if b.opset < 21:
            return f"to the range {_describe(qmin, qmax)} needs an int16 QuantizeLinear (opset_version >= 21)"
        return f"to the range {_describe(qmin, qmax)} fits no ONNX integer type"
    return None


# --- affine family: fake_quantize_affine, fake_quantize_min_max -------------------------


def lower_affine(b, x, scale, zero_point, axis, quant_min, quant_max):
    """``fake_quantize_affine``: given scale and zero point, per tensor or along ``axis``."""
    dtype, compute = _compute_type(b, x)
    rank = _rank(b, x, "the input")
    if axis is not None:
        axis = axis % rank if rank else 0
        if _numel(b.shape(scale) or (2,)) == 1:
            axis = None  # one channel: per tensor
    _warn_dynamic(b, scale, x, "the scale")
    qtype = choose_qtype(quant_min, quant_max, b.opset, quant_min >= 0, b.wide_int_types)
    reason = _no_qdq_reason(dtype, "tensor", qtype, quant_min, quant_max, b)
    if qtype in (INT4, UINT4, INT16, UINT16) and reason is None:
        # A zero point of these types needs a Cast to them; keep 8 bits when it fits.
        wide = choose_qtype(quant_min, quant_max, 13, prefer_unsigned=quant_min >= 0)
        if wide is not None and _INT_RANGES[qtype] != (quant_min, quant_max):
            qtype = wide
    s = _to_float(b, _squeeze(b, scale))
    z32 = _to_float(b, _squeeze(b, zero_point))
    if reason is not None:
        _warn(f"affine quantization {reason}; exported as Div/Round/Add/Clip/Sub/Mul "
              "(exact in ONNX Runtime, but not a QuantizeLinear/DequantizeLinear pair)")
        ct = torch.float64 if compute == DOUBLE else torch.float32
        s_b = _to_float(b, _broadcast_param(b, s, axis, x), compute)
        z_b = _to_float(b, _broadcast_param(b, z32, axis, x), compute)
        xq = b.op("Add", b.op("Round", b.op("Div", _to_float(b, x, compute), s_b)), z_b)
        q = b.op("Clip", xq, _scalar(b, float(quant_min), ct), _scalar(b, float(quant_max), ct))
        y = b.op("Mul", b.op("Sub", q, z_b), s_b)
        return _cast_back(b, y, dtype, compute)
    zp = b.op("Cast", _squeeze(b, zero_point), to=qtype)
    y = _qdq(b, _to_float(b, x), s, zp, axis, None, quant_min, quant_max, qtype, zero_point_float=z32)
    return _cast_back(b, y, dtype, FLOAT)


def lower_min_max(b, x, min_range, max_range, num_bits):
    """``fake_quantize_min_max``: step ``(max - min) / (2^n - 1)``; zero point ``-rint(min / step)``.

    Exact when ``min_range <= 0 <= max_range`` (the zero point is then in
    ``[0, 2^n - 1]``, the unsigned type's range), as for every range that holds 0.
    """
    dtype, compute = _compute_type(b, x)
    levels = _core.min_max_levels(num_bits)
    _warn_dynamic(b, min_range, x, "min_range")
    kind, axis, channels = _granularity(b, x, [b.shape(min_range), b.shape(max_range)])
    qtype = choose_qtype(0, levels, b.opset, True, b.wide_int_types)
    reason = _no_qdq_reason(dtype, kind, qtype, 0, levels, b)
    if reason is not None:
        _warn(f"{num_bits}-bit min/max quantization {reason}; exported as Div/Round/Max/Min/Mul "
              "(exact in ONNX Runtime, but not a QuantizeLinear/DequantizeLinear pair)")
        mn, mx = _to_float(b, min_range), _to_float(b, max_range)
        step = b.op("Div", b.op("Sub", mx, mn), _scalar(b, float(levels)))
        first = b.op("Round", b.op("Div", mn, step))
        last = b.op("Add", first, _scalar(b, float(levels)))
        step_c, first_c, last_c = (_to_float(b, v, compute) for v in (step, first, last))
        ct = torch.float64 if compute == DOUBLE else torch.float32
        r = _unsigned_zero(b, b.op("Round", b.op("Div", _to_float(b, x, compute), step_c)), ct)
        y = b.op("Mul", b.op("Max", b.op("Min", r, last_c), first_c), step_c)
        return _cast_back(b, y, dtype, compute)
    mn, mx = _to_float(b, _squeeze(b, min_range)), _to_float(b, _squeeze(b, max_range))
    if kind == "axis" and _numel(b.shape(min_range)) != _numel(b.shape(max_range)):
        # One of them is per tensor: spread it over the channels.
        ones = b.const(torch.ones(channels, dtype=torch.float32))
        mn, mx = b.op("Mul", mn, ones), b.op("Mul", mx, ones)
    step = b.op("Div", b.op("Sub", mx, mn), _scalar(b, float(levels)))
    # -rint(min / step), as M - (min / step + M) with M = 1.5 * 2^23: the sum lands
    # where float32 steps are 1, so it rounds half to even, exactly (|min / step| <
    # 2^22 here). Unlike Round, Add and Sub fold into a constant in both exporters.
    magic = _scalar(b, 1.5 * 2.0**23)
    z32 = b.op("Sub", magic, b.op("Add", b.op("Div", mn, step), magic))
    zp = b.op("Cast", z32, to=qtype)
    y = _qdq(b, _to_float(b, x), step, zp, axis, channels, 0, levels, qtype, zero_point_float=z32)
    return _cast_back(b, y, dtype, FLOAT)


# --- FP8: fake_quantize_fp8 -------------------------------------------------------------

# (exponent_bits, mantissa_bits): (ONNX type, largest finite value)
FP8_FORMATS = {(4, 3): (FLOAT8E4M3FN, _core.E4M3_MAX), (5, 2): (FLOAT8E5M2, _core.E5M2_MAX)}
FP8_MIN_OPSET = 19


def _fp8_format(exponent_bits, mantissa_bits):
    """(ONNX type or None, largest value) of a small float format: FP8 has ONNX types,
    FP6 and FP4 E2M1 are rounded by arithmetic (_round_to_format)."""
    fmt = (exponent_bits, mantissa_bits)
    if fmt in FP8_FORMATS:
        return FP8_FORMATS[fmt]
    if fmt in _core.FLOAT_FORMATS:
        return None, _core.FLOAT_FORMATS[fmt][0]
    raise ValueError(f"fakequant ONNX export: no float format with exponent_bits={exponent_bits}, "
                     f"mantissa_bits={mantissa_bits}; the formats are {sorted(_core.FLOAT_FORMATS)}") from None


def _fp8_zero(b, qtype, shape):
    # A float8 zero point: a Cast of a float32 zero, which the exporters fold into
    # an initializer (neither builder writes float8 constants directly).
    return b.op("Cast", b.const(torch.zeros(shape, dtype=torch.float32)), to=qtype)


def _cast_round_fp8(b, v32, qtype):
    """fp8(v) as float32: a saturating Cast there and back (Cast-19, ties to even)."""
    return b.op("Cast", b.op("Cast", v32, to=qtype, saturate=1), to=FLOAT)


def lower_fp8(b, x, amax, exponent_bits, mantissa_bits):
    """``fake_quantize_fp8``: QuantizeLinear/DequantizeLinear with a float8 zero point
    (opset >= 19): ``saturate(fp8(x / s)) * s`` with ``s = fp32(amax) / max``.

    ONNX Runtime's float32 -> float8 conversion rounds to nearest even and saturates, as
    the operator does (checked on every midpoint between float8 values)."""
    dtype, compute = _compute_type(b, x)
    qtype, fmax = _fp8_format(exponent_bits, mantissa_bits)
    if b.opset < FP8_MIN_OPSET:
        raise RuntimeError(f"fakequant ONNX export of FP8 quantization needs opset_version >= "
                           f"{FP8_MIN_OPSET} (float8 QuantizeLinear), got {b.opset}")
    _warn_dynamic(b, amax, x, "amax")
    kind, axis, channels = _granularity(b, x, [b.shape(amax)])
    if dtype == torch.float64 or kind == "broadcast" or qtype is None:
        # float64 has no QuantizeLinear, nor a broadcast scale, and FP6 no ONNX type: Div,
        # Cast to float8 and back (or FP6's rounding arithmetic), Mul. float64 goes
        # through float32 first, as torch's cast does.
        why = ("of a float64 tensor" if dtype == torch.float64 else
               "with a scale that varies along more than one axis" if kind == "broadcast" else
               f"to FP6 E{exponent_bits}M{mantissa_bits} (no ONNX type)")
        _warn(f"FP8/FP6 quantization {why} is exported as Div/round/Mul (exact in ONNX Runtime, but not a "
              "QuantizeLinear/DequantizeLinear pair)")
        s = _to_float(b, _amax_scale(b, _to_float(b, amax), fmax), compute)
        xs = _to_float(b, b.op("Div", _to_float(b, x, compute), s))
        q = (_cast_round_fp8(b, xs, qtype) if qtype is not None
             else _round_to_format(b, xs, exponent_bits, mantissa_bits))
        return _cast_back(b, b.op("Mul", _to_float(b, q, compute), s), dtype, compute)
    scale = _amax_scale(b, _to_float(b, _squeeze(b, amax)), fmax)
    zp = _fp8_zero(b, qtype, () if axis is None else (channels,))
    axis_attr = {} if axis is None else {"axis": axis}
    q = b.op("QuantizeLinear", _to_float(b, x), scale, zp, **axis_attr)
    y = b.op("DequantizeLinear", q, scale, zp, **axis_attr)
    return _cast_back(b, y, dtype, FLOAT)


# --- block-wise dynamic: fake_quantize_blockwise --------------------------------------------

BLOCK_MIN_OPSET = 21  # QuantizeLinear/DequantizeLinear with block_size


def _reduce_max(b, value, axes, keepdims, op="ReduceMax"):
    if b.opset >= 18:
        return b.op(op, value, _axes(b, axes), keepdims=keepdims)
    return b.op(op, value, axes=list(axes), keepdims=keepdims)


def _reduce_min(b, value, axes, keepdims):
    return _reduce_max(b, value, axes, keepdims, op="ReduceMin")


def _to_blocks(b, value, rank, length, block_size, mode="constant"):
    """(..., L) -> (..., nblocks, block_size), padded at the end of each row with zeros
    (or, mode="edge", with the row's last element: the last block's min and max stay)."""
    nblocks = -(-length // block_size)
    pad = nblocks * block_size - length
    if pad:
        pads = [0] * (2 * rank)
        pads[2 * rank - 1] = pad  # the end of the last axis
        value = b.op("Pad", value, b.ints(pads), mode=mode)
    # -1 for the first dimension, 0 (keep) for the others before the last: the TorchScript
    # exporter's shape inference cannot take a shape with a 0 and no -1 (an internal assert).
    shape = ([-1] + [0] * (rank - 2) if rank > 1 else []) + [nblocks, block_size]
    return b.op("Reshape", value, b.ints(shape))


def _from_blocks(b, value, rank, length):
    """The inverse of _to_blocks."""
    value = b.op("Reshape", value, b.ints([0] * (rank - 1) + [-1]))
    return b.op("Slice", value, b.ints([0]), b.ints([length]), b.ints([rank - 1]))


def _round_to_format(b, v, exponent_bits, mantissa_bits):
    """float32 v saturated to the format's +-max and rounded to it, ties to even (FP6
    E3M2/E2M3 and FP4 E2M1, which ONNX Runtime has no QuantizeLinear for): the spacing of
    the values around |v| is 2^(e - M) in the binade [2^e, 2^(e+1)) and the subnormals'
    below, a power of two chosen by comparisons (Where); Round (ties to even) of v /
    spacing, times the spacing, is exact and picks the even code, as the operator does."""
    fmax, emax = _core.FLOAT_FORMATS[(exponent_bits, mantissa_bits)]
    emin = 2 - 2 ** (exponent_bits - 1)  # the exponent of the smallest normal value
    v = b.op("Clip", v, _scalar(b, -fmax), _scalar(b, fmax))
    a = b.op("Abs", v)
    step = _scalar(b, 2.0 ** (emax - mantissa_bits))
    for e in range(emax - 1, emin - 1, -1):  # below 2^(e+1): the spacing of binade e (or less)
        step = b.op("Where", b.op("Less", a, _scalar(b, 2.0 ** (e + 1))), _scalar(b, 2.0 ** (e - mantissa_bits)), step)
    return b.op("Mul", b.op("Round", b.op("Div", v, step)), step)


def _e8m0_scale(b, amax, emax):
    """The MX scale 2^clamp(floor(log2 amax) - emax, -127, 127) of each block, exactly, from
    operators ONNX Runtime runs (it has no E8M0 QuantizeLinear): k = Floor(Log2(amax)) from
    Log, corrected by comparing amax with Pow(2, k) (powers of two are exact in Pow), then
    Pow(2, clamp(k - emax)); NaN where amax is NaN or infinite, as the operator gives."""
    k = b.op("Floor", b.op("Div", b.op("Log", amax), _scalar(b, math.log(2.0))))
    two = _scalar(b, 2.0)
    p = b.op("Pow", two, k)
    k = b.op("Sub", k, b.op("Cast", b.op("Greater", p, amax), to=FLOAT))  # Log rounded up past a power of 2
    k = b.op("Add", k, b.op("Cast", b.op("LessOrEqual", b.op("Mul", b.op("Pow", two, k), two), amax), to=FLOAT))
    e = b.op("Clip", b.op("Sub", k, _scalar(b, float(emax))), _scalar(b, -127.0), _scalar(b, 127.0))
    s = b.op("Pow", two, e)
    bad = b.op("Or", b.op("IsNaN", amax), b.op("IsInf", amax))
    return b.op("Where", bad, _scalar(b, float("nan")), s)


def lower_blockwise(b, x, block_size, num_bits, unsigned, narrow_range, exponent_bits, scale_amax,
                    e8m0_scale=False, centered=False):
    """``fake_quantize_blockwise``: the block amax computed in the graph (Abs, Pad, Reshape,
    ReduceMax), the block scales from it (one level, E4M3 under a per-tensor scale, or the
    MX formats' powers of two: _e8m0_scale), then a block-wise QuantizeLinear/
    DequantizeLinear (opset >= 21) for integer and FP8 elements; FP6 and FP4 E2M1, which
    ONNX Runtime has no QuantizeLinear for, as Div/round/Mul on the blocks. Exact in ONNX
    Runtime except in blocks holding NaN (one-level and E4M3 scales). Centered blocks
    subtract their centre (from ReduceMax and ReduceMin) first and add it back last."""
    dtype, compute = _compute_type(b, x)
    shape = b.shape(x)
    if shape is None or not shape or shape[-1] is None:
        raise RuntimeError("fakequant ONNX export of block-wise quantization needs a known size of the last axis")
    rank, length = len(shape), shape[-1]
    if exponent_bits:
        mantissa_bits = num_bits - 1 - exponent_bits
        qtype, elem_max = _fp8_format(exponent_bits, mantissa_bits)
        emax = _core.FLOAT_FORMATS[(exponent_bits, mantissa_bits)][1]
    else:
        emax = num_bits - 2
        qmin, qmax = _core.amax_range(num_bits, unsigned, narrow_range)
        elem_max = qmax
        qtype = choose_qtype(qmin, qmax, b.opset, unsigned, b.wide_int_types)
        if qtype is not None and _Clip(qtype, qmin, qmax).needed and qtype not in (INT8, UINT8):
            qtype = choose_qtype(qmin, qmax, 13, unsigned)  # clip on 8-bit integers: exact
    if qtype is not None and b.opset < BLOCK_MIN_OPSET:
        raise RuntimeError(f"fakequant ONNX export of block-wise quantization needs opset_version >= "
                           f"{BLOCK_MIN_OPSET} (QuantizeLinear with block_size), got {b.opset}")
    if dtype == torch.float64:
        raise RuntimeError("fakequant ONNX export of block-wise quantization takes float32/16 inputs, not float64")
    _warn(f"block-wise dynamic quantization computes its scales at run time; ONNX Runtime runs it, "
          "TensorRT needs constant (calibrated) scales for QuantizeLinear")
    x32 = _to_float(b, x)
    if centered:
        edged = _to_blocks(b, x32, rank, length, block_size, mode="edge")
        mx, mn = _reduce_max(b, edged, [rank], 0), _reduce_min(b, edged, [rank], 0)
        half = _scalar(b, 0.5)
        center = b.op("Add", b.op("Mul", mx, half), b.op("Mul", mn, half))  # (..., nblocks)
        center_b = b.op("Unsqueeze", center, _axes(b, [rank]))
        blocks = b.op("Sub", edged, center_b)
        amax = b.op("Max", b.op("Sub", mx, center), b.op("Sub", center, mn))
        x32 = _from_blocks(b, blocks, rank, length)
    else:
        blocks = _to_blocks(b, x32, rank, length, block_size)
        amax = _reduce_max(b, b.op("Abs", blocks), [rank], 0)

    def uncenter(y):  # (..., L) -> y + the centre of its block
        if not centered:
            return y
        return _from_blocks(b, b.op("Add", _to_blocks(b, y, rank, length, block_size), center_b), rank, length)

    if e8m0_scale:
        s = _e8m0_scale(b, amax, emax)  # never degenerate
    else:
        s = b.op("Div", amax, _scalar(b, float(elem_max)))
        degenerate = b.op("LessOrEqual", amax, _scalar(b, _core.AMAX_EPSILON))  # NaN: not degenerate
        if scale_amax is not None:
            g = b.op("Div", _to_float(b, _squeeze(b, scale_amax)), _scalar(b, float(elem_max) * _core.E4M3_MAX))
            s = b.op("Mul", _cast_round_fp8(b, b.op("Div", s, g), FLOAT8E4M3FN), g)
            degenerate = b.op("Or", degenerate, b.op("LessOrEqual", s, _scalar(b, 0.0)))
        s = b.op("Where", degenerate, _scalar(b, ZERO_CHANNEL_SCALE), s)  # (..., nblocks)
        if exponent_bits:
            # A degenerate block's elements are +0, but a float grid keeps the sign of the
            # tiny quotients x / ZERO_CHANNEL_SCALE: their outputs are set to +0 in blocks.
            zero_blocks = b.op("Unsqueeze", degenerate, _axes(b, [rank]))
    if qtype is None and exponent_bits:  # FP6, FP4 E2M1
        _warn(f"E{exponent_bits}M{mantissa_bits} elements are exported as Div/round/Mul (ONNX Runtime has no "
              "QuantizeLinear for FP6 or FP4)")
        s_b = b.op("Unsqueeze", s, _axes(b, [rank]))
        xs = b.op("Div", blocks, s_b)
        y = b.op("Mul", _round_to_format(b, xs, exponent_bits, mantissa_bits), s_b)
        if not e8m0_scale:
            y = b.op("Where", zero_blocks, _scalar(b, 0.0), y)
        if centered:
            y = b.op("Add", y, center_b)
        return _cast_back(b, _from_blocks(b, y, rank, length), dtype, FLOAT)
    attrs = {"axis": rank - 1, "block_size": block_size}
    q = b.op("QuantizeLinear", x32, s, output_dtype=qtype, **attrs)
    if not exponent_bits and _Clip(qtype, qmin, qmax).needed:
        q = b.op("Clip", q, _int_const(b, qmin, qtype), _int_const(b, qmax, qtype))
    y = b.op("DequantizeLinear", q, s, **attrs)
    if exponent_bits and not e8m0_scale:
        y = b.op("Where", zero_blocks, _scalar(b, 0.0), _to_blocks(b, y, rank, length, block_size))
        y = _from_blocks(b, y, rank, length)
    return _cast_back(b, uncenter(y), dtype, FLOAT)
