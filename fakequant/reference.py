"""Plain-PyTorch reference of fakequant's numerics contract (README, DESIGN.md): slow,
obviously right, and what the tests and `python -m fakequant info` compare the operators to.

    s  = scale (float32)           amax family: s = fp32(amax) / bound
    xq = rint(fp32(x) / s) + zp    IEEE division, ties to even; xq - zp exact
    y  = dtype_of_x((clamp(xq, qmin, qmax) - zp) * s)

float16/bfloat16 inputs compute in float32, float64 inputs in float64.
"""
import torch

AMAX_EPSILON = 2.0**-24


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
    y = (torch.minimum(torch.maximum(r, lo), hi) * s).to(x.dtype)  # NaN stays NaN
    mask = (r >= lo) & (r <= hi)
    return y, mask


def amax_range(num_bits, unsigned, narrow_range):
    bound = 2 ** (num_bits - 1 + int(unsigned)) - 1
    qmin = 0 if unsigned else (-bound if narrow_range else -bound - 1)
    return bound, qmin


def _amax_common(x, amax, num_bits, unsigned, narrow_range):
    ct = compute_dtype(x)
    bound, qmin = amax_range(num_bits, unsigned, narrow_range)
    a32 = torch.as_tensor(amax).to(x.device, torch.float32)
    zero = a32 <= AMAX_EPSILON
    s = torch.where(zero, torch.ones_like(a32), a32 / bound).to(ct)
    r = torch.round(x.to(ct) / s)
    q = torch.clamp(r, qmin, bound)
    q = torch.where(zero, r.clamp(0, 0), q)  # amax ~ 0: everything to 0, NaN stays NaN
    mask = x.to(ct).abs() <= a32.to(ct)
    return q, s, mask


def fake_quantize_amax(x, amax, num_bits=8, unsigned=False, narrow_range=True):
    """(y, mask) of the amax family; mask marks |x| <= amax."""
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
    step = (mx - mn) / (2**num_bits - 1)
    first = torch.round(mn / step)
    r = torch.round(x.to(ct) / step.to(ct))
    q = torch.minimum(torch.maximum(r, first.to(ct)), (first + 2**num_bits - 1).to(ct))
    y = (q * step.to(ct)).to(x.dtype)
    xc = x.to(ct)
    mask = (xc >= mn.to(ct)) & (xc <= mx.to(ct))
    return y, mask


def entropy_amax(hist, edges, num_bits=8, unsigned=False, stride=1, start_bin=128):
    """pytorch-quantization's entropy calibration rule written out one candidate at a
    time (numpy arrays ``hist`` and ``edges``): what the vectorised
    HistogramCalibrator.compute_amax("entropy") is tested against and timed beside."""
    import numpy as np  # a test/benchmark dependency, not a runtime one

    bins = hist.astype(np.int64).copy()
    bins[0] = bins[1]
    levels = 1 << (num_bits - 1 + int(unsigned))
    best, best_i = None, None
    for i in range(start_bin, len(bins) + 1, stride):
        level = (np.arange(i) * levels) // i
        nonzero = bins[:i] > 0
        sums = np.bincount(level[nonzero], weights=bins[:i][nonzero], minlength=levels)
        counts = np.bincount(level[nonzero], minlength=levels)
        q = np.where(nonzero, sums[level] / np.maximum(counts[level], 1), 0.0)
        p = bins[:i].astype(np.float64)
        p[-1] += bins[i:].sum()
        p, q = p / p.sum(), q / q.sum()
        with np.errstate(divide="ignore", invalid="ignore"):
            kl = np.where(p > 0, np.where(q > 0, p * np.log(p / q), np.inf), 0.0).sum()
        if best is None or kl <= best:  # the last minimum wins
            best, best_i = kl, i
    return edges[best_i]
