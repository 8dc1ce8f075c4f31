"""The merge of histograms collected on several ranks (:meth:`HistogramCalibrator.sync
<fakequant.calib.HistogramCalibrator.sync>`): the common bin grid, and one rank's counts
laid on it. Tensors in, tensors out (int64 counts, float64 widths, on the CPU); the
collectives are the calibrator's."""
from __future__ import annotations

from typing import List, Tuple

import torch

__all__ = ["common_grid", "rebin"]


def common_grid(widths: List[torch.Tensor], used: List[torch.Tensor],
                channels: int) -> Tuple[torch.Tensor, torch.Tensor, int]:
    """``(width, used, bins)`` of the grid every rank's histogram is laid on: per channel the
    coarsest bin width any rank uses, with enough bins for the largest value any rank saw
    (``widths`` and ``used``: each rank's, [channels] each); ``bins`` is the largest ``used``."""
    width = torch.stack(widths).max(0).values  # float64 [channels]
    out = torch.ones(channels, dtype=torch.int64)
    for w, u in zip(widths, used):
        same = w == width
        ratio = torch.where(width > 0, w / torch.where(width > 0, width, 1.0), 0.0)
        need = torch.where(same, u, torch.ceil(u.double() * ratio).to(torch.int64))
        out = torch.maximum(out, torch.where(w > 0, need, 1))
    return width, out, int(out.max())


def rebin(hist: torch.Tensor, width: torch.Tensor, used: torch.Tensor, new_width: torch.Tensor,
           new_used: torch.Tensor, bins: int) -> torch.Tensor:
    """``hist`` ([channels, *] int64 counts of bins ``width`` wide) laid on bins
    ``new_width`` wide (>= ``width``), ``bins`` columns, in whole counts."""
    channels = hist.shape[0]
    out = torch.zeros(channels, bins, dtype=torch.int64)
    for c in range(channels):
        n, w, W = int(used[c]), float(width[c]), float(new_width[c])
        h = hist[c, :n]
        if w == W or w == 0.0:  # the same grid (or only zeros, all in bin 0)
            out[c, :n] = h
            continue
        # The cumulative count at the new edges j * W, interpolated linearly
        # inside the old bins, rounded to whole counts (monotone: no negative bin).
        m = int(new_used[c])
        csum = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(h, 0)])
        pos = torch.arange(m + 1, dtype=torch.float64) * (W / w)
        k = pos.floor().clamp(max=n).to(torch.int64)
        frac = pos - k.double()
        inside = torch.where(k < n, h.double()[k.clamp(max=n - 1)] * frac, 0.0)
        cum = torch.round(csum[k].double() + inside).to(torch.int64)
        cum[-1] = csum[-1]
        out[c, :m] = torch.diff(cum)
    return out
