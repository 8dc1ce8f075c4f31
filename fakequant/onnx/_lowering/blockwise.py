"""Block-wise dynamic quantization (``fake_quantize_blockwise``) as ONNX: blocked QDQ at
opset 21, scales computed in the graph (one level, E4M3 under a per-tensor amax, E8M0)."""

import math

import torch

from ... import _core

from ._common import (
    BLOCK_MIN_OPSET, FLOAT, FLOAT8E4M3FN, INT8, UINT8, ZERO_CHANNEL_SCALE, _Clip, _axes, _cast_back,
    _compute_type, _int_const, _scalar, _squeeze, _to_float, _warn, choose_qtype,
)
from .fp8 import _cast_round_fp8, _fp8_format, _round_to_format


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
    _warn("block-wise dynamic quantization computes its scales at run time; ONNX Runtime runs it, "
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
