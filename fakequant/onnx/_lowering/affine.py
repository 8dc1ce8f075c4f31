"""The affine family (``fake_quantize_affine``, ``fake_quantize_min_max``) as ONNX."""


import torch

from ... import _core

from ._common import (
    DOUBLE, FLOAT, INT16, INT4, UINT16, UINT4, _INT_RANGES, _broadcast_param, _cast_back, _compute_type,
    _granularity, _numel, _qdq, _rank, _scalar, _squeeze, _to_float, _unsigned_zero, _warn, _warn_dynamic,
    choose_qtype,
)
from .amax import _no_qdq_reason


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
