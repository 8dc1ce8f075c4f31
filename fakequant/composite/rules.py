"""The operators' rules in plain PyTorch (README, docs/design.md): production code, written
to be obviously right. ``torch.compile`` runs them in place of the operators on the composite
path (``fakequant.composite.compiled``); they are the only implementation of torch's rule for
floating-point zero points (``fakequant.ops.affine``) and of llama.cpp's GGML blocks
(``fakequant.ops.ggml``); the serving exporters ask :func:`block_scales` and
:func:`element_codes` for a format's scales and codes; and the tests and ``python -m fakequant
info`` compare the C++/CUDA operators to them. Its constants and ranges are ``fakequant._core``'s
(from the compiled library); the tests' own oracles (LSQ by autograd, entropy one candidate at
a time) are in tests/reference.py::

    s  = scale (float32)           amax family: s = fp32(amax) / bound
    xq = rint(fp32(x) / s) + zp    IEEE division, ties to even; xq - zp exact
    y  = dtype_of_x((clamp(xq, qmin, qmax) - zp + 0.0) * s)

``+ 0.0``: where q - zp is -0.0 (x in (-s/2, 0)) the output is +0.0, as ONNX Runtime's
DequantizeLinear gives; the float grids (FP8, E2M1/E4M3/E5M2 blocks) keep the sign of a
zero, as ONNX Runtime's float8 QuantizeLinear/DequantizeLinear do.

float16/bfloat16 inputs compute in float32, float64 inputs in float64.
"""
import math

from typing import NamedTuple, Optional, Tuple

import torch

from .._core import AMAX_EPSILON, E4M3_MAX, E5M2_MAX, BlockScales, amax_range, divide, zero_keeping_sign

__all__ = ["AMAX_EPSILON", "BlockScaleValues", "amax_range", "amax_scale", "block_element",
           "block_scales", "blockwise_element_max", "blockwise_saturation_limit", "compute_dtype",
           "e8m0_exponent_of", "e8m0_scale_of", "element_codes", "fake_quantize_affine",
           "fake_quantize_affine_float_zero_point", "fake_quantize_amax", "fake_quantize_blockwise",
           "fake_quantize_fp8", "fake_quantize_min_max", "format_max", "format_values", "mx_emax", "quantize_amax",
           "round_to_format", "round_to_grid", "round_to_float16",
           "fake_quantize_ggml", "VLLM_FP8_MIN_SCALE", "vllm_block_scales", "vllm_fake_quantize_blocks",
           "vllm_mx_exponent_of", "vllm_nvfp4_global_scale", "vllm_round_fp8_reciprocal", "vllm_round_int8_rows"]


def compute_dtype(x):
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _broadcast_param(p, x, axis):
    p = torch.as_tensor(p)
    if axis is None:
        return p.reshape(())
    shape = [1] * x.dim()
    shape[axis] = -1
    return p.reshape(shape)


def _integer_bound(v, ct, up):
    """The float64 integers v in ct, rounded up (or down) to a value of ct."""
    c = v.to(ct)
    step = torch.nextafter(c, torch.full_like(c, float("inf") if up else float("-inf")))
    return torch.where(c.double() < v if up else c.double() > v, step, c)


def fake_quantize_affine(x, scale, zero_point, axis, quant_min, quant_max):
    """(y, mask) of the affine contract; mask marks xq in [quant_min, quant_max].

    xq - zp is integer arithmetic, exact: (clamp(r + zp) - zp) is clamp(r, quant_min - zp,
    quant_max - zp) with r = rint(x / s). Where those bounds are not values of the compute
    type (ranges of over 2^24 levels in float32) they round inward, keeping the mask exact.
    """
    ct = compute_dtype(x)
    s = _broadcast_param(scale, x, axis).to(x.device, torch.float32).to(ct)
    zp = _broadcast_param(zero_point, x, axis).to(x.device, torch.float64)  # int32 values: exact
    r = torch.round(x.to(ct) / s)
    lo = _integer_bound(quant_min - zp, ct, up=True)
    hi = _integer_bound(quant_max - zp, ct, up=False)
    y = ((torch.minimum(torch.maximum(r, lo), hi) + 0.0) * s).to(x.dtype)  # NaN stays NaN; +0.0
    mask = (r >= lo) & (r <= hi)
    return y, mask


def fake_quantize_affine_float_zero_point(x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor, axis: int,
                                          quant_min: int, quant_max: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """(y, mask) of torch's rule for a floating-point zero point (torch.ao's float qparams,
    whose zero points have fractions): the zero point is added before rounding,
    ``r = rint(x / s + zp)`` in the compute type, ``y = (clamp(r, quant_min, quant_max) - zp) * s``
    in float64 (exact for float32 parameters) rounded once to x's dtype, as torch's kernels
    compute it; mask ``quant_min <= r <= quant_max``. (torch multiplies by ``1 / s`` where
    this divides by ``s``, the library's rule: they can differ by one step at ties.)"""
    ct = torch.float64 if x.dtype == torch.float64 else torch.float32
    shape = [1] * x.dim()
    shape[axis] = -1
    s = scale.reshape(shape).to(x.device, torch.float32)
    zp = zero_point.reshape(shape).to(x.device, torch.float32)
    r = torch.round(x.to(ct) / s.to(ct) + zp.to(ct))
    q = torch.clamp(r.double(), float(quant_min), float(quant_max))  # NaN stays NaN
    y = ((q - zp.double()) * s.double() + 0.0).to(x.dtype)  # +0.0, never -0.0
    mask = (r >= quant_min) & (r <= quant_max)
    return y, mask


def amax_scale(amax, bound):
    """The one-level scale of the amax family, ``fp32(amax) / bound`` (float32), and 1 where
    ``amax <= AMAX_EPSILON`` (the degenerate amax, whose outputs are 0): the scale of
    ``quantize_amax``, of FP8 per tensor or channel, and of blocks with one level."""
    a32 = amax.float()
    return torch.where(a32 <= AMAX_EPSILON, torch.ones_like(a32), divide(a32, bound))


def _amax_common(x, amax, num_bits, unsigned, narrow_range):
    ct = compute_dtype(x)
    qmin, bound = amax_range(num_bits, unsigned, narrow_range)
    a32 = torch.as_tensor(amax).to(x.device, torch.float32)
    zero = a32 <= AMAX_EPSILON
    s = amax_scale(a32, bound).to(ct)
    r = torch.round(x.to(ct) / s)
    q = torch.clamp(r, qmin, bound)
    q = torch.where(zero, zero_keeping_sign(r), q)  # amax ~ 0: everything to 0, NaN stays NaN
    mask = x.to(ct).abs() <= a32.to(ct)
    return q + 0.0, s, mask  # +0.0 for q = -0.0


def fake_quantize_amax(x, amax, num_bits=8, unsigned=False, narrow_range=True):
    """(y, mask) of the amax family; mask marks ``|x| <= amax``."""
    q, s, mask = _amax_common(x, amax, num_bits, unsigned, narrow_range)
    return (q * s).to(x.dtype), mask


def quantize_amax(x, amax, num_bits=8, unsigned=False, narrow_range=True):
    """(integer-valued q in x's dtype, mask)."""
    q, _, mask = _amax_common(x, amax, num_bits, unsigned, narrow_range)
    return q.to(x.dtype), mask


def fake_quantize_min_max(x, min_range, max_range, num_bits=8):
    """(y, mask) of pytorch-quantization's affine min/max quantizer; mask marks min <= x <= max."""
    ct = compute_dtype(x)
    mn = torch.as_tensor(min_range).to(x.device, torch.float32)
    mx = torch.as_tensor(max_range).to(x.device, torch.float32)
    step = divide(mx - mn, 2**num_bits - 1)
    first = torch.round(mn / step)
    r = torch.round(x.to(ct) / step.to(ct))
    q = torch.minimum(torch.maximum(r, first.to(ct)), (first + 2**num_bits - 1).to(ct))
    y = ((q + 0.0) * step.to(ct)).to(x.dtype)  # +0.0 for q = -0.0
    xc = x.to(ct)
    mask = (xc >= mn.to(ct)) & (xc <= mx.to(ct))
    return y, mask


def fake_quantize_fp8(x, amax, exponent_bits=4, mantissa_bits=3):
    """(y, mask) of FP8 (and FP6) fake quantization, rounding to nearest even (torch's float8
    casts for E4M3/E5M2, the value grid for FP6 E3M2/E2M3):

        s = fp32(amax) / max              (float32 division; max 448 E4M3, 57344 E5M2, 28 E3M2, 7.5 E2M3)
        y = dtype_of_x(fmt(clamp(x / s, -max, max)) * s)

    in float32 (float64 for float64 x, whose cast to float8 goes through float32, as
    torch's does). Where amax <= 2^-24 the output is 0 (NaN stays NaN); mask marks
    ``|x| <= amax``.
    """
    if (exponent_bits, mantissa_bits) not in ((4, 3), (5, 2), (3, 2), (2, 3)):
        raise ValueError(
            "fakequant: (exponent_bits, mantissa_bits) must be (4, 3), (5, 2), (3, 2) or (2, 3), "
            f"got ({exponent_bits}, {mantissa_bits})"
        )
    fmax = format_max(exponent_bits, mantissa_bits)
    ct = compute_dtype(x)
    a32 = torch.as_tensor(amax).to(x.device, torch.float32)
    zero = a32 <= AMAX_EPSILON
    s = amax_scale(a32, fmax).to(ct)
    xs = x.to(ct) / s
    y = round_to_format(xs.clamp(-fmax, fmax).float(), exponent_bits, mantissa_bits).to(ct) * s
    y = torch.where(zero, zero_keeping_sign(xs), y)  # amax ~ 0: everything to 0 (-0.0 stays), NaN stays NaN
    mask = x.to(ct).abs() <= a32.to(ct)
    return y.to(x.dtype), mask


# (exponent_bits, mantissa_bits) of the formats without a torch dtype -> exponent bias
# (OCP microscaling v1.0: every code finite, no infinities or NaN).
_GRID_FORMATS = {(2, 1): 1, (3, 2): 3, (2, 3): 1}


def format_values(exponent_bits, mantissa_bits):
    """The non-negative values of a format without infinities, in code order (float64):
    subnormals k * 2^(1 - bias - M), then (1 + k / 2^M) * 2^(e - bias)."""
    bias = _GRID_FORMATS[(exponent_bits, mantissa_bits)]
    m = 2 ** mantissa_bits
    values = [k / m * 2.0 ** (1 - bias) for k in range(m)]
    values += [(1 + k / m) * 2.0 ** (e - bias) for e in range(1, 2 ** exponent_bits) for k in range(m)]
    return values


def format_max(exponent_bits, mantissa_bits):
    if (exponent_bits, mantissa_bits) == (4, 3):
        return E4M3_MAX
    if (exponent_bits, mantissa_bits) == (5, 2):
        return E5M2_MAX
    return format_values(exponent_bits, mantissa_bits)[-1]


def round_to_grid(v, values):
    """float32 v rounded to the nearest of ``values`` (ascending, >= 0, in code order),
    saturating at the last, ties to the even code; signs kept; NaN stays NaN."""
    grid = torch.tensor(values, dtype=torch.float64, device=v.device)
    top = len(values) - 1
    a = v.double().abs().clamp(max=values[-1])
    hi = torch.searchsorted(grid, a.nan_to_num(0.0)).clamp(1, top)  # grid[hi - 1] < a <= grid[hi]
    below, above = grid[hi - 1], grid[hi]
    d_below, d_above = a - below, above - a
    up = (d_above < d_below) | ((d_above == d_below) & (hi % 2 == 0))
    r = torch.where(up, above, below).float()
    return torch.where(v.isnan(), v, torch.copysign(r, v))


def round_to_format(v, exponent_bits, mantissa_bits):
    """float32 v rounded (saturating, ties to even) to a small float format: torch's float8
    casts for E4M3/E5M2, the value grid for FP6 E3M2/E2M3 and FP4 E2M1."""
    if (exponent_bits, mantissa_bits) == (4, 3):
        return v.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float()
    if (exponent_bits, mantissa_bits) == (5, 2):
        return v.clamp(-E5M2_MAX, E5M2_MAX).to(torch.float8_e5m2).float()
    return round_to_grid(v, format_values(exponent_bits, mantissa_bits))


def _block_format(num_bits, exponent_bits):
    return (exponent_bits, num_bits - 1 - exponent_bits)


def blockwise_element_max(num_bits, unsigned, exponent_bits):
    if exponent_bits == 0:
        return float(amax_range(num_bits, unsigned, False)[1])
    return format_max(*_block_format(num_bits, exponent_bits))


def blockwise_saturation_limit(num_bits, exponent_bits):
    """The largest ``|xs|`` that a float format rounds without saturating, ties included:
    max + half its top step (464 for E4M3, 61440 for E5M2, 7 for E2M1, 30 for E3M2,
    7.75 for E2M3), the top step read off the format's two largest values."""
    e, m = _block_format(num_bits, exponent_bits)
    if (e, m) in _GRID_FORMATS:
        values = format_values(e, m)
        return values[-1] + (values[-1] - values[-2]) / 2
    return {4: E4M3_MAX + 16.0, 5: E5M2_MAX + 4096.0}[e]


def mx_emax(num_bits, exponent_bits):
    """emax of the MX specification: the exponent of the element format's largest value
    (E2M1 2, E3M2 4, E2M3 2, E4M3 8, E5M2 15); num_bits - 2 for integers (MXINT8: 6)."""
    if exponent_bits == 0:
        return num_bits - 2
    return int(math.floor(math.log2(format_max(*_block_format(num_bits, exponent_bits)))))


def e8m0_exponent_of(amax, emax):
    """k = floor(log2(amax)) - emax clamped to [-127, 127], as float32 (exact): the exponent of
    the E8M0 scale 2^k; a checkpoint stores the code k + 127 (OCP microscaling v1.0, section
    6.3). -127 where amax is 0 or NaN."""
    a = amax.float()
    _, e = torch.frexp(a)  # a = m * 2^e, m in [0.5, 1): floor(log2 a) = e - 1
    # The exponent as a float (exact), frexp of float32: int32 arithmetic beside float64
    # hits an Inductor CPU code generation error (tests/test_compiled.py).
    return (torch.where(a > 0, e.float(), torch.full_like(a, -1000.0)) - (1 + emax)).clamp(-127, 127)


def e8m0_scale_of(amax, emax):
    """2^(floor(log2(amax)) - emax), the exponent clamped to [-127, 127] (:func:`e8m0_exponent_of`),
    as float32; NaN where amax is NaN or infinite (OCP microscaling v1.0, section 6.3)."""
    a = amax.float()
    k = e8m0_exponent_of(a, emax)
    s = torch.ldexp(torch.ones_like(a, dtype=torch.float64), k.double()).float()  # 2^-127: exact
    return torch.where(a.isfinite(), s, torch.full_like(s, float("nan")))


def block_element(num_bits):
    """``(num_bits, exponent_bits)`` of a block's elements as the block-wise operator takes them,
    from a descriptor's ``num_bits``: an int (integers: exponent_bits 0) or ``(E, M)`` (floats of
    1 + E + M bits)."""
    if isinstance(num_bits, tuple):
        e, m = num_bits
        return 1 + e + m, e
    return num_bits, 0


class BlockScaleValues(NamedTuple):
    """The scales of blocks, from their amax (:func:`block_scales`)."""

    #: float32: each block's elements are ``x / scale`` on the element grid, times ``scale``.
    scale: torch.Tensor
    #: bool: the blocks whose outputs are 0 (NaN stays NaN), whatever ``scale`` holds there.
    degenerate: torch.Tensor
    #: the block scale as the format stores it: the E4M3 value (float32) under ``global_scale``,
    #: the E8M0 exponent code ``k + 127`` (uint8), or ``scale`` (one level).
    code: torch.Tensor
    #: g of two-level scales (E4M3 under a per-tensor scale), else None.
    global_scale: Optional[torch.Tensor]


def block_scales(amax, num_bits, unsigned=False, exponent_bits=0, scale_format=None, scale_amax=None):
    """The rule from the amax of blocks (float32, any shape) to their scales, per format of the
    block scales (``fakequant._core.BlockScales``; None: one level), for elements of
    ``num_bits`` with ``exponent_bits`` (elem_max: :func:`blockwise_element_max`)::

        one level  s = fp32(amax) / elem_max            (1 where degenerate: amax <= 2^-24)
        E4M3       g = fp32(scale_amax) / (elem_max * 448),  c = e4m3(fp32(amax / elem_max) / g),
                   s = c * g                            degenerate also where g <= 0 or s == 0
        E8M0       s = 2^k, k = clamp(floor(log2 amax) - emax, -127, 127)   never degenerate

    What the block-wise operator, its composite and the serving exporters compute
    (:func:`element_codes` then gives the codes). llama.cpp's blocks (``BlockScales.GGML``) have
    their rule in :func:`fake_quantize_ggml`, codes included."""
    amax = amax.float()
    if scale_format is BlockScales.E8M0:
        k = e8m0_exponent_of(amax, mx_emax(num_bits, exponent_bits))
        s = e8m0_scale_of(amax, mx_emax(num_bits, exponent_bits))
        return BlockScaleValues(s, torch.zeros_like(amax, dtype=torch.bool), (k + 127).to(torch.uint8), None)
    if scale_format not in (None, BlockScales.E4M3):
        raise ValueError(f"fakequant: block_scales computes one-level, E4M3 and E8M0 block scales, got {scale_format}")
    elem_max = blockwise_element_max(num_bits, unsigned, exponent_bits)
    s = amax_scale(amax, elem_max)
    degenerate = amax <= AMAX_EPSILON
    if scale_format is None:
        return BlockScaleValues(s, degenerate, s, None)
    if scale_amax is None:
        raise ValueError("fakequant: E4M3 block scales need scale_amax (the per-tensor amax they are relative to)")
    g = divide(torch.as_tensor(scale_amax).to(amax.device, torch.float32), elem_max * E4M3_MAX)  # elem_max * 448: exact
    c = round_to_format(s / g, 4, 3)
    s = c * g
    return BlockScaleValues(s, degenerate | (g <= 0) | (s == 0), c, g)


def element_codes(xs, num_bits, unsigned=False, narrow_range=True, exponent_bits=0):
    """``(codes, inside)`` of ``xs = x / s`` (in the compute type): the rule's elements.
    Integers ``clamp(rint(xs), qmin, qmax) + 0.0``, floats ``round_to_format(fp32(xs))`` (sign
    of zero kept) in xs's dtype; ``inside``: the element did not saturate (integers
    ``qmin <= rint(xs) <= qmax``; floats ``|xs| <=`` :func:`blockwise_saturation_limit`)."""
    if exponent_bits == 0:
        qmin, bound = amax_range(num_bits, unsigned, narrow_range)
        r = torch.round(xs)
        return r.clamp(qmin, bound) + 0.0, (r >= qmin) & (r <= bound)  # NaN stays NaN; +0.0 for q = -0.0
    q = round_to_format(xs.float(), *_block_format(num_bits, exponent_bits)).to(xs.dtype)
    return q, xs.abs() <= blockwise_saturation_limit(num_bits, exponent_bits)


def _row_blocks(x, block_size):
    """x's rows along its last axis (a 0-d x: one row of one), their length, and the number of
    blocks of block_size in a row (the last one may be shorter)."""
    rows = x.reshape(-1, 1) if x.dim() == 0 else x.reshape(-1, x.shape[-1])
    length = rows.shape[1]
    return rows, length, -(-length // block_size)


def fake_quantize_blockwise(x, block_size, num_bits=8, unsigned=False, narrow_range=True, exponent_bits=0,
                            scale_amax=None, e8m0_scale=False, centered=False):
    """(y, mask) of block-wise dynamic quantization along the last dimension.

    Each row is cut into blocks of block_size (the last one shorter); per block, in float32::

        amax = max |x|                                   (NaN in the block: NaN)
        s    = amax / elem_max                           one level
        s    = e4m3(fp32(amax / elem_max) / g) * g       two levels, g = scale_amax / (elem_max * 448)
        s    = 2^clamp(floor(log2 amax) - emax, -127, 127)  e8m0_scale (MX), never degenerate
        degenerate where amax <= 2^-24, s == 0 or g <= 0: outputs 0 (NaN stays NaN), mask = not NaN

    and per element, in the compute type ct::

        xs = x / s;  q = clamp(rint(xs), qmin, qmax) (integers) or round_to_format(fp32(xs)) (floats)
        y  = dtype_of_x(q * s) (integers: (q + 0.0) * s, +0.0 for q = -0.0);  mask: the element was not saturated, i.e. qmin <= rint(xs) <= qmax
        (integers) or |xs| <= max + half the format's top step (floats: what rounds to +-max at most)

    (``|xs| <= elem_max`` would drop the gradient of block maxima whose amax / fp32(amax / bound)
    rounds just above bound.) Float elements round xs in float32 even for float64 inputs, as
    torch's float8 casts do.
    A block holding +-inf has amax inf: with one level its scale is inf and its outputs NaN.
    Centered blocks (per-token asymmetric): with mx and mn the block's max and min in float32
    (-0 below +0), the centre b = mx * 0.5 + mn * 0.5 and amax = max(mx - b, b - mn); the
    elements are x - b (in ct) quantized as above, plus b (a degenerate block gives b).
    """
    ct = compute_dtype(x)
    shape = x.shape
    if x.numel() == 0:
        return x.clone(), torch.zeros(shape, dtype=torch.bool, device=x.device)
    rows, length, nblocks = _row_blocks(x, block_size)
    extra = nblocks * block_size - length
    if centered:  # padded with the row's last element: the last block's min and max stay
        padded = torch.cat([rows, rows[:, -1:].expand(-1, extra)], 1)
    else:
        padded = torch.nn.functional.pad(rows, (0, extra))
    xb = padded.reshape(rows.shape[0], nblocks, block_size)

    if centered:
        xf = xb.float()
        zero = torch.zeros((), device=x.device)

        def zero_aware(m, keep_positive):  # a zero extreme: +0 where the block holds +0 (max) / no -0 (min)
            pos, neg = ((xf == 0) & ~xf.signbit()).any(-1, keepdim=True), ((xf == 0) & xf.signbit()).any(-1, keepdim=True)
            positive = pos if keep_positive else ~neg
            return torch.where(m == 0, torch.where(positive, zero, -zero), m)

        mx = zero_aware(xf.amax(-1, keepdim=True), True)
        mn = zero_aware(xf.amin(-1, keepdim=True), False)
        center = mx * 0.5 + mn * 0.5
        amax = torch.maximum(mx - center, center - mn)
        xb = xb.to(compute_dtype(x)) - center.to(compute_dtype(x))
    else:
        amax = xb.abs().amax(-1, keepdim=True).float()
    scale_format = BlockScales.E8M0 if e8m0_scale else None if scale_amax is None else BlockScales.E4M3
    sa = None if scale_amax is None else torch.as_tensor(scale_amax).reshape(1, 1, 1)
    s, degenerate, _, _ = block_scales(amax, num_bits, unsigned, exponent_bits, scale_format, sa)

    xc = xb.to(ct)
    xs = xc / s.to(ct)
    q, inside = element_codes(xs, num_bits, unsigned, narrow_range, exponent_bits)
    y = q * s.to(ct)
    y = torch.where(degenerate, torch.where(xc.isnan(), xc, torch.zeros_like(xc)), y)
    mask = torch.where(degenerate, ~xc.isnan(), inside)
    if centered:
        y = y + center.to(ct)

    def unblock(t):
        return t.reshape(rows.shape[0], nblocks * block_size)[:, :length].reshape(shape)

    return unblock(y).to(x.dtype), unblock(mask)


# --- llama.cpp's Q8_0 and Q4_0 blocks (GGML): the GGUF presets' rule, not the contract ---


def _round_half_away(v):
    """float32 v rounded to the nearest integer, halves away from zero (C's roundf), exactly:
    the fraction ``|v| - floor(|v|)`` is exact in float32."""
    a = v.abs()
    f = a.floor()
    return torch.copysign(f + (a - f >= 0.5).to(v.dtype), v)


def round_to_float16(v):
    """float32 v rounded to float16's values (round to nearest even, subnormals, +-inf beyond
    65504 + 16), kept in float32. Arithmetic, not a cast: Inductor drops a float16 round trip
    that it can compute in float32 (torch._inductor.config.emulate_precision_casts)."""
    _, e = torch.frexp(v)  # |v| = m * 2^e, m in [0.5, 1): float16 keeps 11 bits, steps >= 2^-24
    k = (e.float() - 11.0).clamp(min=-24.0)
    step = torch.ldexp(torch.ones_like(v, dtype=torch.float64), k.double()).float()
    r = torch.round(v / step) * step  # exact scalings by powers of two; ties to even
    return torch.where(r.abs() > 65504.0, torch.copysign(torch.full_like(r, float("inf")), r), r)


def fake_quantize_ggml(x, block_size=32, num_bits=8):
    """(y, mask) of llama.cpp's Q8_0 (``num_bits=8``) and Q4_0 (``num_bits=4``) blocks along the
    last dimension: what gguf's ``quants.quantize`` then ``quants.dequantize`` give (ggml's
    reference quantization, ggml-quants.c), in float32 whatever x's dtype::

        Q8_0:  d = amax / 127                       amax = max |x| over the block
               q = roundf(x * (1 / d))              in [-127, 127]; q = 0 where d = 0
               y = q * fp32(fp16(d))                (+0.0 for q = 0)
        Q4_0:  d = m / -8                           m = the block's first element of largest |x|, signed
               c = min(trunc(x * (1 / d) + 8.5), 15)      (the sum rounded to float32 first)
               y = fp32(fp16(d)) * (c - 8)          codes -8..7; the sign of a zero is d's

    The codes come from the float32 d, the output from d rounded to float16 (round to nearest
    even; it may underflow to 0), as llama.cpp stores it. Both products are exact in float32,
    then y is rounded once to x's dtype. A short last block (the row not a multiple of
    block_size) is a block of its own. mask (the gradient's): the element did not saturate
    (Q4_0 codes above 15, on the side opposite to m), and y is finite. NaN in a block makes
    the block NaN (as gguf's numpy rule)."""
    if num_bits not in (4, 8):
        raise ValueError(f"fakequant: num_bits must be 8 (Q8_0) or 4 (Q4_0), got {num_bits!r}")
    shape = x.shape
    if x.numel() == 0:
        return x.clone(), torch.zeros(shape, dtype=torch.bool, device=x.device)
    rows, length, nblocks = _row_blocks(x, block_size)
    padded = torch.nn.functional.pad(rows.float(), (0, nblocks * block_size - length))  # zeros: amax stays
    xb = padded.reshape(rows.shape[0], nblocks, block_size)
    if num_bits == 8:
        d = divide(xb.abs().amax(-1, keepdim=True), 127.0)
    else:
        m = xb.gather(-1, xb.abs().argmax(-1, keepdim=True))  # argmax: the first of equal magnitudes
        d = divide(m, -8.0)
    inv = torch.where(d == 0, torch.zeros_like(d), torch.ones_like(d) / d)
    d16 = round_to_float16(d)
    v = xb * inv
    if num_bits == 8:
        y = (_round_half_away(v) + 0.0) * d16
        mask = y.isfinite()
    else:
        c = torch.trunc(v + 8.5)
        y = d16 * (c.clamp(max=15.0) - 8.0)
        mask = (c <= 15.0) & y.isfinite()

    def unblock(t):
        return t.reshape(rows.shape[0], nblocks * block_size)[:, :length].reshape(shape)

    return unblock(y).to(x.dtype), unblock(mask)


# --- vLLM's activation rules (quantize_model(target="vllm")): what vLLM computes where it
# --- differs from the operators' contract (docs/serving.md, "Targets"); no C++ kernel ---


def vllm_round_int8_rows(x):
    """(y, mask) of vLLM's dynamic per-token int8 quantization (its ``dynamic_scaled_int8_quant``
    CUDA kernel) along the last dimension, in float32 whatever x's dtype::

        amax = max |x| over the row;  s = fp32(amax) / 127;  r = fp32(127 / amax)
        q = clamp(rint(fp32(x) * r), -128, 127)     (0 where the row is all zeros)
        y = dtype_of_x((q + 0.0) * s)

    The codes come from multiplying by the rounded reciprocal ``127 / amax`` (the kernel's
    ``cvt.rni.sat.s8.f32`` of ``x * tmp_scale``), where the operators divide by ``s``: the
    two differ by one step where ``x / s`` falls within an ulp of a half. mask (the
    gradient's): ``-128 <= rint(x * r) <= 127`` and the row is not NaN (it always is in range
    for finite rows: ``|x * r| <= 127`` up to rounding). NaN in a row makes the row NaN."""
    shape = x.shape
    if x.numel() == 0:
        return x.clone(), torch.zeros(shape, dtype=torch.bool, device=x.device)
    rows = x.reshape(-1, 1) if x.dim() == 0 else x.reshape(-1, x.shape[-1])
    xf = rows.float()
    amax = xf.abs().amax(-1, keepdim=True)
    s = divide(amax, 127.0)
    zero = amax == 0
    r = torch.where(zero, torch.zeros_like(amax), torch.full_like(amax, 127.0) / amax)
    v = torch.round(xf * r)
    q = v.clamp(-128.0, 127.0) + 0.0  # NaN stays NaN; +0.0 for q = -0.0
    y = q * s
    mask = (v >= -128.0) & (v <= 127.0)
    return y.reshape(shape).to(x.dtype), mask.reshape(shape)


def vllm_round_fp8_reciprocal(x, amax):
    """(y, mask) of vLLM's per-tensor FP8 E4M3 quantization of activations (its
    ``scaled_fp8_quant`` CUDA kernel, static or dynamic scale): the codes of x times the
    rounded reciprocal of the scale, where :func:`fake_quantize_fp8` divides::

        s = fp32(amax) / 448;  r = fp32(1 / s)
        y = dtype_of_x(e4m3(clamp(fp32(x) * r, -448, 448)) * s)

    in float32 (float64 x: float64). amax <= 2^-24: the outputs are 0 (NaN stays NaN), as
    :func:`fake_quantize_fp8`'s; mask marks ``|x| <= amax``."""
    ct = compute_dtype(x)
    a32 = torch.as_tensor(amax).to(x.device, torch.float32)
    zero = a32 <= AMAX_EPSILON
    s = amax_scale(a32, E4M3_MAX)
    r = (torch.ones_like(s) / s).to(ct)
    xs = x.to(ct) * r
    y = round_to_format(xs.clamp(-E4M3_MAX, E4M3_MAX).float(), 4, 3).to(ct) * s.to(ct)
    y = torch.where(zero, zero_keeping_sign(xs), y)
    mask = x.to(ct).abs() <= a32.to(ct)
    return y.to(x.dtype), mask


#: vLLM's smallest per-token FP8 scale, ``1 / (448 * 512)`` (its ``min_scaling_factor``).
VLLM_FP8_MIN_SCALE = 1.0 / (E4M3_MAX * 512.0)


def vllm_mx_exponent_of(amax, num_bits, exponent_bits):
    """The E8M0 exponent k of MX block scales as compressed-tensors computes them (its
    ``generate_mx_scales``; vLLM reads them from the checkpoint): the block's amax rounded to a
    power of two, up where its significand is at least ``2 - 2^-(m + 1)`` (m = 1, the E2M1
    mantissa width, for E2M1 and E4M3 elements; 3 for E2M3), then ``floor(log2) - emax``,
    clamped to [-127, 127]; -127 where amax is 0. float32, exact."""
    a = amax.float()
    m, e = torch.frexp(a)  # a = m * 2^e, m in [0.5, 1): significand 2m
    em = 3 if (exponent_bits, num_bits - 1 - exponent_bits) == (2, 3) else 1
    up = (m >= (2.0 - 2.0 ** -(em + 1)) / 2).float()
    k = e.float() - 1.0 + up - mx_emax(num_bits, exponent_bits)
    return torch.where(a > 0, k, torch.full_like(a, -1000.0)).clamp(-127, 127)


def vllm_nvfp4_global_scale(scale_amax):
    """compressed-tensors' NVFP4 global scale ``G = fp32(448 * 6 / amax)`` (its
    ``generate_gparam``), from a per-tensor amax (float32); the block scales divide their E4M3
    codes by it."""
    a = torch.as_tensor(scale_amax).float()
    return torch.full_like(a, 6.0 * E4M3_MAX) / a


def vllm_block_scales(amax, num_bits, exponent_bits, scale_format, scale_amax=None):
    """:class:`BlockScaleValues` of blocks with amax ``amax`` (float32) as compressed-tensors
    stores them and vLLM applies them, where :func:`block_scales` differs::

        E8M0   s = 2^k, k = vllm_mx_exponent_of(amax)          (the nearest power of two)
        E4M3   G = vllm_nvfp4_global_scale(scale_amax),  c = e4m3(G * fp32(amax / elem_max)),
               s = fp32(c / G)  (a divisor: degenerate where c == 0, G is not finite or s == 0)

    vLLM's NVFP4 kernel computes ``c`` and ``1 / s`` with approximate reciprocals
    (``rcp.approx.ftz.f32``) that no exact rule reproduces; this is the exact rule they
    approximate, and compressed-tensors' own (``x / (c / G)``). ``global_scale`` holds G."""
    amax = amax.float()
    if scale_format is BlockScales.E8M0:
        k = vllm_mx_exponent_of(amax, num_bits, exponent_bits)
        s = torch.ldexp(torch.ones_like(amax, dtype=torch.float64), k.double()).float()
        s = torch.where(amax.isfinite(), s, torch.full_like(s, float("nan")))
        return BlockScaleValues(s, torch.zeros_like(amax, dtype=torch.bool), (k + 127).to(torch.uint8), None)
    if scale_format is not BlockScales.E4M3:
        raise ValueError(f"fakequant: vllm_block_scales computes E4M3 and E8M0 block scales, got {scale_format}")
    if scale_amax is None:
        raise ValueError("fakequant: E4M3 block scales need scale_amax (the per-tensor amax they are relative to)")
    elem_max = blockwise_element_max(num_bits, False, exponent_bits)
    big = vllm_nvfp4_global_scale(torch.as_tensor(scale_amax).to(amax.device))
    c = round_to_format(big * divide(amax, elem_max), 4, 3)
    s = c / big
    degenerate = (amax <= AMAX_EPSILON) | ~big.isfinite() | (c == 0) | (s == 0)
    return BlockScaleValues(s, degenerate, c, big)


def vllm_fake_quantize_blocks(x, block_size, num_bits, exponent_bits, scale_format=None, scale_amax=None):
    """(y, mask) of dynamic blocks along the last dimension with vLLM's (compressed-tensors')
    scales: E8M0 and E4M3 block scales from :func:`vllm_block_scales`, and per-token FP8
    (``scale_format`` None, ``block_size`` the row) with vLLM's floor on the scale,
    ``s = max(fp32(amax / 448), 1 / (448 * 512))`` (its ``dynamic_per_token_scaled_fp8_quant``,
    which divides by ``s``). Per element as :func:`fake_quantize_blockwise`: ``q =
    round_to_format(x / s)``, ``y = q * s``, degenerate blocks 0 (NaN stays NaN); mask: the
    element did not saturate."""
    ct = compute_dtype(x)
    shape = x.shape
    if x.numel() == 0:
        return x.clone(), torch.zeros(shape, dtype=torch.bool, device=x.device)
    rows, length, nblocks = _row_blocks(x, block_size)
    padded = torch.nn.functional.pad(rows, (0, nblocks * block_size - length))
    xb = padded.reshape(rows.shape[0], nblocks, block_size)
    amax = xb.abs().amax(-1, keepdim=True).float()
    if scale_format is None:
        if (num_bits, exponent_bits) != (8, 4):
            raise ValueError("fakequant: vLLM's one-level dynamic float blocks are FP8 E4M3 per token")
        s = torch.maximum(divide(amax, E4M3_MAX), torch.full_like(amax, VLLM_FP8_MIN_SCALE))
        degenerate = torch.zeros_like(amax, dtype=torch.bool)
    else:
        sa = None if scale_amax is None else torch.as_tensor(scale_amax).reshape(1, 1, 1)
        s, degenerate, _, _ = vllm_block_scales(amax, num_bits, exponent_bits, scale_format, sa)
    xc = xb.to(ct)
    q, inside = element_codes(xc / s.to(ct), num_bits, False, False, exponent_bits)
    y = torch.where(degenerate, torch.where(xc.isnan(), xc, torch.zeros_like(xc)), q * s.to(ct))
    mask = torch.where(degenerate, ~xc.isnan(), inside)

    def unblock(t):
        return t.reshape(rows.shape[0], nblocks * block_size)[:, :length].reshape(shape)

    return unblock(y).to(x.dtype), unblock(mask)
