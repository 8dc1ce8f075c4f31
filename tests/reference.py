"""The tests' plain-PyTorch oracles.

The contract's rules that production also runs (the composites under torch.compile,
torch's floating-point zero point rule, the GGML rule, the exporters' scales and codes) are
fakequant.composite.rules, re-exported here; what is below exists only to check the
operators: the E2M1 grid and rounding spelled for the block tests, LSQ written so that
autograd gives its gradients, and entropy calibration one candidate at a time. (benchmarks/bench_calib.py
times the vectorised calibrator beside this loop.)"""
import numpy as np
import torch

from fakequant.composite.rules import *  # noqa: F401,F403
from fakequant.composite.rules import _broadcast_param, _integer_bound, compute_dtype, format_values, round_to_format

E2M1_VALUES = tuple(format_values(2, 1))  # codes 0..7


def round_e2m1(v):
    """float32 v rounded to FP4 E2M1 (saturating at +-6), ties to the even code; NaN stays NaN."""
    return round_to_format(v, 2, 1)


def round_to_float_format(v, exponent_bits):
    """float32 v rounded (saturating, ties to even) to the 4- or 8-bit block element with
    this many exponent bits: E2M1 (2), E4M3 (4) or E5M2 (5)."""
    return round_to_format(v, *{2: (2, 1), 4: (4, 3), 5: (5, 2)}[exponent_bits])


def entropy_amax(hist, edges, num_bits=8, unsigned=False, stride=1, start_bin=128):
    """pytorch-quantization's entropy calibration rule written out one candidate at a
    time (numpy arrays ``hist`` and ``edges``): what the vectorised
    HistogramCalibrator.compute_amax("entropy") is tested against and timed beside."""
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




def _scaled_grad(t, factor):
    """t's value exactly (t + 0), with its gradient multiplied by factor (LSQ's grad_scale)."""
    return t.detach() + (t * factor - (t * factor).detach())


def fake_quantize_lsq(x, scale, zero_point, axis, quant_min, quant_max, grad_factor):
    """LSQ/LSQ+ in plain PyTorch, with straight-through rounding, so that autograd of it
    gives the LSQ gradients; the value is fake_quantize_affine's. For a float64 x, with
    r = rint(x / s), inside = quant_min - zp <= r <= quant_max - zp::

      d x     = grad inside, 0 outside;
      d scale = grad_factor * sum(grad * (r - x / s) inside, (quant_min - zp) below, (quant_max - zp) above);
      d zp    = grad_factor * sum(-grad * s outside), for a floating zero_point that requires grad.

    scale and zero_point may require grad; zero_point must hold integers. Finite x only
    (x / s rounded straight-through is NaN at +-inf); NaN x gives NaN y.
    """
    ct = compute_dtype(x)
    s = _broadcast_param(scale, x, axis).to(x.device, torch.float32).to(ct)
    s = _scaled_grad(s, grad_factor)
    zp = _broadcast_param(zero_point, x, axis).to(x.device)
    zp64 = zp.detach().to(torch.float64)  # int32 values: exact
    # lo = quant_min - zp and hi = quant_max - zp as the kernels round them (inward, to
    # values of ct), carrying the gradient -1 for zp.
    dzp = _scaled_grad(zp.to(ct), grad_factor) - zp.detach().to(ct) if zp.is_floating_point() else 0.0
    lo = _integer_bound(quant_min - zp64, ct, up=True) - dzp
    hi = _integer_bound(quant_max - zp64, ct, up=False) - dzp
    v = x.to(ct) / s
    r = v + (torch.round(v) - v).detach()  # the value is round(v) exactly
    return ((torch.clamp(r, lo, hi) + 0.0) * s).to(x.dtype)  # +0.0 for q = -0.0
