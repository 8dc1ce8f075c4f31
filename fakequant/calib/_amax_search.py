"""The amax searches of :class:`~fakequant.calib.HistogramCalibrator`, on one histogram
(int64 counts ``h`` of bins ``width`` wide, on the CPU, in float64): percentile, entropy
(KL divergence, as TensorRT) and MSE, vectorised over every candidate amax."""
from __future__ import annotations

import contextlib
import math
from typing import Iterator

import torch

from .. import _core, ops

__all__ = ["one_thread", "percentile_amax", "entropy_amax", "mse_amax"]

# Elements per block of the candidate x level (entropy) and candidate x bin (MSE)
# searches: bounds their temporaries for histograms that grew large.
_BLOCK = 1 << 18


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Runs the amax searches on the calling thread only. Their tensors are
    small (a few hundred thousand elements): a thread pool cannot speed them up,
    but waking it costs milliseconds per op when the machine is busy."""
    threads = torch.get_num_threads()
    if threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)



def _edge(k: int, width: float) -> float:
    # float32 value of the k-th bin edge (what a float32 linspace holds).
    return float(torch.tensor(k * width, dtype=torch.float32))


def percentile_amax(h: torch.Tensor, width: float, percentile: float) -> float:
    """The first bin edge where the cumulative fraction reaches ``percentile`` %
    (pytorch-quantization's rule: the lower edge of the bin that crosses it)."""
    cdf = torch.cumsum(_core.divide(h.double(), float(h.sum())), 0)
    idx = int(torch.searchsorted(cdf, torch.tensor([percentile / 100.0], dtype=torch.float64))[0])
    return _edge(idx, width)


def entropy_amax(h: torch.Tensor, width: float, num_bits: int, unsigned: bool, stride: int,
                  start_bin: int) -> float:
    """TensorRT-style entropy calibration: the amax (a bin edge ``i``) whose
    quantized histogram is closest in KL divergence to the reference one.

    For each candidate ``i`` the reference is ``h[:i]`` with the tail ``h[i:]``
    added to its last bin; the quantized one merges ``h[:i]`` into
    ``2^(num_bits - 1 + unsigned)`` levels (bin ``j`` to level ``j * levels // i``)
    and spreads each level's count evenly over its nonzero bins. As in
    pytorch-quantization, ``h[0]`` is replaced by ``h[1]`` first and the last
    of several minimal candidates wins.

    The divergences of all candidates come from prefix sums: per level,
    ``sum h_j log(h_j / mean)`` is ``sum h_j log h_j - S log(S / N)``, so the
    cost is O(candidates x levels) instead of O(candidates x bins).
    """
    levels = _core.amax_bound(num_bits, unsigned) + 1
    h = h.to(torch.int64).clone()
    n = h.numel()
    if n > 1:
        h[0] = h[1]
    total = float(h.sum())
    start = max(1, min(start_bin, n))
    cand = torch.arange(start, n + 1, stride, dtype=torch.int64)  # candidate i (amax = edge i)

    zero = torch.zeros(1, dtype=torch.int64)
    csum = torch.cat([zero, torch.cumsum(h, 0)])  # exact counts
    cnz = torch.cat([zero, torch.cumsum((h > 0).to(torch.int64), 0)])
    hf = h.double()
    hlogh = torch.where(h > 0, hf * torch.log(hf.clamp(min=1)), 0.0)
    chl = torch.cat([torch.zeros(1, dtype=torch.float64), torch.cumsum(hlogh, 0)])
    k = torch.arange(levels + 1, dtype=torch.int64)

    rows = max(1, _BLOCK // (levels + 1))
    kl = torch.cat([_entropy_block(c, h, csum, cnz, chl, k, levels, total) for c in torch.split(cand, rows)])
    best = cand.numel() - 1 - int(torch.argmin(torch.flip(kl, [0])))
    return _edge(int(cand[best]), width)


def _entropy_block(cand, h, csum, cnz, chl, k, levels, total):
    """KL divergences of the candidates ``cand`` (see :func:`entropy_amax`)."""
    # Level k of candidate i covers bins [ceil(k i / L), ceil((k + 1) i / L)).
    # (levels is a power of two: the division is a shift.)
    shift = levels.bit_length() - 1
    bounds = ((k.unsqueeze(0) * cand.unsqueeze(1) + (levels - 1)) >> shift).flatten()  # [R * (L + 1)]
    shape = (cand.numel(), levels + 1)

    def level_sums(prefix):
        return torch.diff(prefix.gather(0, bounds).view(shape), dim=1)

    s = level_sums(csum).double()
    nz = level_sums(cnz)
    has = nz > 0
    log_mean = torch.log(torch.where(has, s / nz.clamp(min=1), 1.0))
    within = torch.where(has, level_sums(chl) - s * log_mean, 0.0).sum(1)

    # The last bin i - 1 also receives the tail: take it out of `within`, add it apart.
    last = cand - 1
    h_last = h.gather(0, last)
    hl = h_last.double()
    level_last = torch.div(last << shift, cand, rounding_mode="floor")
    log_mean_last = log_mean.gather(1, level_last.unsqueeze(1)).squeeze(1)
    within = within - torch.where(h_last > 0, hl * (torch.log(hl.clamp(min=1)) - log_mean_last), 0.0)

    kept = csum[cand].double()  # counts below edge i: the quantized histogram's total
    tail = total - kept
    kl = within / total + (csum[last].double() / total) * torch.log(kept.clamp(min=1) / total)
    p_last = (hl + tail) / total
    q_last = torch.exp(log_mean_last) / kept.clamp(min=1)
    last_term = torch.where(p_last > 0, p_last * torch.log(p_last / q_last), 0.0)
    last_term = torch.where((h_last == 0) & (tail > 0), math.inf, last_term)
    return torch.where(kept > 0, kl + last_term, math.inf)


def mse_amax(h: torch.Tensor, width: float, num_bits: int, unsigned: bool, narrow_range: bool, stride: int,
              start_bin: int) -> float:
    """The bin centre that, used as amax, minimises the count-weighted squared
    quantization error of the bin centres (pytorch-quantization's MSE rule),
    quantized with the calibrated quantizer's range. Runs on the CPU."""
    n = h.numel()
    centers = ((torch.arange(n, dtype=torch.float64) + 0.5) * width).float()
    counts = h.double()
    start = min(start_bin, n - 1)
    cand = torch.arange(start, n, stride, dtype=torch.int64)
    rows = max(1, _BLOCK // n)
    errors = []
    for block in torch.split(cand, rows):
        amax = centers[block].unsqueeze(1)
        x = centers.unsqueeze(0).expand(block.numel(), n).contiguous()
        q = ops.fake_quantize_amax(x, amax, num_bits, unsigned, narrow_range)
        errors.append(((q - x).double().square() * counts).sum(1))
    err = torch.cat(errors)
    best = int(torch.argmin(err))
    return float(centers[int(cand[best])])
