"""The amax family (``fake_quantize_amax``, ``quantize_amax``) as ONNX: QDQ pairs with the
operator's float32 scale, blocks of a static amax as blocked QDQ, or the arithmetic."""


import torch

from ... import _core

from ._common import (
    BLOCK_MIN_OPSET, DOUBLE, FLOAT, INT8, UINT8, ZERO_CHANNEL_SCALE, _Clip, _axes, _cast_back, _compute_type,
    _describe, _granularity, _int_const, _qdq, _rank, _scalar, _squeeze, _to_float, _unsigned_zero, _warn,
    _warn_dynamic, choose_qtype,
)


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
