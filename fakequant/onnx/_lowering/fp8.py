"""FP8 (``fake_quantize_fp8``) as ONNX float8 QuantizeLinear/DequantizeLinear, and the small
float formats' rounding that ONNX has no type for (FP6, FP4 E2M1)."""


import torch

from ... import _core

from ._common import (
    FLOAT, FLOAT8E4M3FN, FLOAT8E5M2, _cast_back, _compute_type, _granularity, _scalar, _squeeze, _to_float,
    _warn, _warn_dynamic,
)
from .amax import _amax_scale


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
