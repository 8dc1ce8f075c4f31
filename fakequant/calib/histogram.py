"""Histogram calibrator: collect ``|x|`` histograms, then pick amax by entropy,
MSE or percentile.

Histograms live on the collected tensor's device with int64 counts (exact at
any count; pytorch-quantization's float32 counts stop at 2^24), per tensor or
per channel (``axis``). The amax searches run on the CPU in float64 and are
vectorised over all candidate amax values, so the entropy search is
O(candidates x quantization levels) tensor arithmetic instead of
pytorch-quantization's O(bins^2) Python loop.
"""
from __future__ import annotations

import functools
import math
import numbers
import warnings
from typing import TYPE_CHECKING, Any, Callable, List, Optional, Sequence, Tuple, TypeVar, Union

import torch

from .. import _core
from . import _amax_search, _distributed, _histogram_merge
from .calibrator import _Calibrator, normalize_kept_axes

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = ["HistogramCalibrator"]

# Elements histogrammed per step (bounds the index temporaries; 2^20 keeps them in cache).
_CHUNK = 1 << 20
METHODS = ("entropy", "mse", "percentile", "max")

_F = TypeVar("_F", bound=Callable[..., Any])


def _on_host(method: _F) -> _F:
    """``method`` with the CPU as torch's default device: the bin layout, the maxima and the
    amax searches live on the CPU (the counts on the collected tensors' device, named where
    they are made) whatever default device the caller chose (``torch.set_default_device``)."""
    @functools.wraps(method)
    def run(*args: Any, **kwargs: Any) -> Any:
        with torch.device("cpu"):
            return method(*args, **kwargs)
    return run  # type: ignore[return-value]


def _check_positive_int(value: Any, name: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return int(value)


class HistogramCalibrator(_Calibrator):
    """Collects histograms of ``|x|``; :meth:`compute_amax` picks amax from them.

    Args:
        num_bits, axis, unsigned: see :class:`~fakequant.calib.calibrator._Calibrator`.
            With ``axis`` there is one histogram per channel (per index of the kept axes).
        num_bins: bins of the first histogram, spanning ``[0, max|x|]``. Default 2048.
            Later tensors with a larger maximum add bins of the same width.
        grow_method: deprecated in pytorch-quantization; ignored with a warning.
        skip_zeros: leave exact zeros out of the histogram. Default False.
        torch_hist: accepted for compatibility (histograms are always collected
            with torch on the tensor's device).
        narrow_range: the range the MSE search quantizes with, as the quantizer's
            (``[-bound, bound]`` if True, else ``[-bound - 1, bound]``). Default True
            (pytorch-quantization's); a :class:`~fakequant.nn.TensorQuantizer` passes its own.
    """

    def __init__(
        self,
        num_bits: Union[int, Tuple[int, int]] = 8,
        axis: Optional[Union[int, Sequence[int]]] = None,
        unsigned: bool = False,
        num_bins: int = 2048,
        grow_method: Optional[str] = None,
        skip_zeros: bool = False,
        torch_hist: bool = True,
        *,
        narrow_range: bool = True,
    ) -> None:
        super().__init__(num_bits, axis, unsigned)
        self._narrow_range = _core.check_bool(narrow_range, "narrow_range")
        self._num_bins = _check_positive_int(num_bins, "num_bins", 2)
        if grow_method is not None:
            warnings.warn(f"HistogramCalibrator: grow_method is deprecated and ignored, got {grow_method!r}",
                          DeprecationWarning, stacklevel=2)
        self._skip_zeros = _core.check_bool(skip_zeros, "skip_zeros")
        self._torch_hist = torch_hist
        self.reset()

    # -- state -----------------------------------------------------------------
    def reset(self) -> None:
        """Forgets the collected histograms."""
        # (all None until the first tensor is collected, then all set)
        self._hist: Optional[torch.Tensor] = None  # int64 [channels, bins] on the collected tensors' device
        self._width: Optional[torch.Tensor] = None  # float64 [channels] (CPU): bin width, 0 until a nonzero value is seen
        self._used: Optional[torch.Tensor] = None  # int64 [channels] (CPU): bins in use per channel
        self._max: Optional[torch.Tensor] = None  # float64 [channels] (CPU): largest |x| seen
        self._amax_shape: Optional[Sequence[int]] = None  # shape of the amax compute_amax returns
        self._channel_shape: Optional[Tuple[int, ...]] = None
        self._ndim: Optional[int] = None
        self._local: Optional[Tuple[Any, ...]] = None  # this rank's own state while the fields above hold a sync()'s merge

    @property
    def num_bins(self) -> int:
        return self._num_bins

    @property
    def skip_zeros(self) -> bool:
        return self._skip_zeros

    @property
    def narrow_range(self) -> bool:
        return self._narrow_range

    @narrow_range.setter
    def narrow_range(self, value: bool) -> None:
        self._narrow_range = _core.check_bool(value, "narrow_range")

    @_on_host
    def _edges(self, c: int) -> torch.Tensor:
        assert self._used is not None and self._width is not None  # (something was collected)
        n = int(self._used[c])
        return (torch.arange(n + 1, dtype=torch.float64) * float(self._width[c])).float()

    @property
    def _calib_hist(self) -> Optional[torch.Tensor]:
        """The histogram counts (1-D per tensor, [channels, bins] per channel)."""
        if self._hist is None:
            return None
        if self._hist.shape[0] == 1:
            assert self._used is not None  # (set with _hist)
            return self._hist[0, : int(self._used[0])]
        return self._hist

    @property
    def _calib_bin_edges(self) -> Optional[Union[torch.Tensor, List[torch.Tensor]]]:
        """The bin edges (float32, CPU) per tensor; a list of them per channel."""
        if self._hist is None:
            return None
        edges = [self._edges(c) for c in range(self._hist.shape[0])]
        return edges[0] if len(edges) == 1 else edges

    # -- collection ------------------------------------------------------------
    def _as_channels(self, x: torch.Tensor) -> Tuple[torch.Tensor, Tuple[int, ...], Sequence[int]]:
        """``x`` as [channels, values], the channel shape, and the shape of its amax."""
        kept = normalize_kept_axes(self._axis, x.dim())
        if not kept:
            return x.reshape(1, -1), (), ()
        others = [d for d in range(x.dim()) if d not in kept]
        channel_shape = tuple(x.shape[d] for d in kept)
        xc = x.permute(list(kept) + others).reshape(math.prod(channel_shape), -1)
        amax_shape = [x.shape[d] if d in kept else 1 for d in range(x.dim())]
        return xc, channel_shape, amax_shape

    def collect(self, x: torch.Tensor) -> None:
        """Adds ``|x|`` to the histogram(s)."""
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"HistogramCalibrator.collect expects a tensor, got {type(x).__name__}")
        with torch.no_grad():
            self._collect(x.detach())

    @_on_host
    def _collect(self, x: torch.Tensor) -> None:
        if getattr(self, "_local", None) is not None:  # collecting after a sync(): from this rank's own data
            self._restore_local()
        xc, channel_shape, amax_shape = self._as_channels(x)
        if self._hist is not None and channel_shape and (channel_shape != self._channel_shape
                                                         or x.dim() != self._ndim):
            raise ValueError(
                f"HistogramCalibrator: channels changed from {self._channel_shape} to {channel_shape} "
                f"(a tensor of shape {tuple(x.shape)} with axis={self._axis})"
            )
        if xc.shape[1] == 0:
            return
        a = xc.abs()
        if not a.is_floating_point():
            a = a.float()
        elif a.dtype in (torch.float16, torch.bfloat16):
            a = a.float()
        # The one device synchronisation: the maxima decide the bin layout.
        batch_max = a.amax(dim=1).double().cpu()
        if not bool(torch.isfinite(batch_max).all()):
            raise ValueError("HistogramCalibrator.collect: the tensor holds inf or NaN values")

        channels = xc.shape[0]
        if self._hist is None:
            self._hist = torch.zeros(channels, 1, dtype=torch.int64, device=x.device)
            self._width = torch.zeros(channels, dtype=torch.float64)
            self._used = torch.ones(channels, dtype=torch.int64)
            self._max = torch.zeros(channels, dtype=torch.float64)
            self._channel_shape, self._ndim = channel_shape, x.dim()
            self._amax_shape = amax_shape
        assert self._width is not None and self._used is not None and self._max is not None  # (set with _hist)
        self._max = torch.maximum(self._max, batch_max)

        fresh = (self._width == 0) & (batch_max > 0)
        self._width = torch.where(fresh, _core.divide(batch_max, self._num_bins), self._width)
        self._used = torch.where(fresh, torch.full_like(self._used, self._num_bins), self._used)
        grown = ~fresh & (self._width > 0) & (batch_max > self._used * self._width)
        if bool(grown.any()):
            need = torch.ceil(batch_max / torch.where(grown, self._width, 1.0)).to(torch.int64)
            self._used = torch.where(grown, torch.maximum(need, self._used), self._used)
        bins = int(self._used.max())
        if bins > self._hist.shape[1]:
            pad = torch.zeros(channels, bins - self._hist.shape[1], dtype=torch.int64, device=self._hist.device)
            self._hist = torch.cat([self._hist, pad], dim=1)

        # One rule on every device and setting (docs/design.md, "One value on every device"): the
        # bin of x is floor(x * (1 / width)) in float32, counted by bincount (torch.histc has no
        # deterministic CUDA kernel: with it, deterministic algorithms would need another rule).
        self._count(a)

    def _count(self, a: torch.Tensor) -> None:
        assert self._hist is not None and self._used is not None and self._width is not None  # (_collect set them)
        channels, bins = self._hist.shape
        device = a.device
        width = self._width.to(device=device, dtype=torch.float32)
        # Channels that have only seen zeros have width 0: everything goes to bin 0.
        inv_width = torch.where(width > 0, 1.0 / width, 0.0).unsqueeze(1)
        last = (self._used - 1).to(device).unsqueeze(1)
        offset = (torch.arange(channels, device=device) * bins).unsqueeze(1)
        dump = channels * bins  # index of skipped zeros, dropped below
        counts = torch.zeros(channels * bins + 1, dtype=torch.int64, device=device)
        index = torch.int32 if dump < 2**31 else torch.int64  # (int32: a third faster)
        last, offset = last.to(index), offset.to(index)
        step = max(1, _CHUNK // channels)
        for start in range(0, a.shape[1], step):
            part = a[:, start:start + step]
            # floor(x / width) as x * (1 / width), both rounded to float32: a value within a
            # rounding error of an edge may land in the neighbouring bin, on every device alike.
            idx = (part * inv_width).floor_().to(index)
            idx = torch.minimum(idx, last).add_(offset)
            if self._skip_zeros:
                idx = torch.where(part == 0, dump, idx)
            counts += torch.bincount(idx.flatten(), minlength=dump + 1)
        self._hist += counts[:dump].view(channels, bins)

    # -- torch.distributed -----------------------------------------------------
    _STATE = ("_hist", "_width", "_used", "_max", "_amax_shape", "_channel_shape", "_ndim")

    def _restore_local(self) -> None:
        assert self._local is not None  # (the callers checked)
        for name, value in zip(self._STATE, self._local):
            setattr(self, name, value)
        self._local = None

    @_on_host
    def sync(self, group: Optional[ProcessGroup] = None) -> None:
        """Merges the histograms of every rank of ``group`` (default: the world)
        of torch.distributed, so that :meth:`compute_amax` gives every rank the
        same amax: the amax of all the data the ranks collected.

        The ranks agree on a common bin layout per channel: the coarsest bin
        width any rank uses (the width the rank with the largest first batch
        chose), with enough bins for the largest value any rank saw. Each rank
        lays its histogram on that grid (exactly when its width is the common
        one; otherwise spreading each bin's count over the bins it overlaps, in
        whole counts, keeping the total) and the counts are summed (int64,
        exact). A collective: every rank calls it, ranks that collected nothing
        too. Does nothing when torch.distributed is not initialised or the
        group has one rank. Calling it again merges this rank's own data again
        (not the merge), and collecting afterwards continues from this rank's
        own data.
        """
        if not _distributed.is_distributed(group):
            return
        if getattr(self, "_local", None) is not None:  # (calibrators pickled before sync() existed have none)
            self._restore_local()
        mine = None
        if self._hist is not None:
            assert self._width is not None and self._used is not None and self._max is not None  # (set with _hist)
            mine = (self._channel_shape, self._amax_shape, self._ndim, self._hist.shape[0],
                    self._width.clone(), self._used.clone(), self._max.clone())
        metas = _distributed.all_gather_object(mine, group)
        known = [m for m in metas if m is not None]
        if not known:
            return
        channel_shape, amax_shape, ndim, channels = known[0][:4]
        for m in known[1:]:
            if m[0] != channel_shape or m[3] != channels or (channel_shape and m[2] != ndim):
                raise ValueError("HistogramCalibrator.sync: the ranks collected different channels: "
                                 f"{[None if m is None else m[0] for m in metas]}")

        # The common grid, computed by every rank from the same gathered numbers.
        width, used, bins = _histogram_merge.common_grid([m[4] for m in known], [m[5] for m in known], channels)
        gmax = torch.stack([m[6] for m in known]).max(0).values

        if self._hist is not None:
            assert self._width is not None and self._used is not None  # (set with _hist)
            local = _histogram_merge.rebin(self._hist.cpu(), self._width, self._used, width, used, bins)
            device = self._hist.device
        else:
            local = torch.zeros(channels, bins, dtype=torch.int64)
            device = _distributed.collective_device(group)
        merged = _distributed.all_reduce(local.to(device), "sum", group)

        self._local = tuple(getattr(self, name) for name in self._STATE)
        self._hist, self._width, self._used, self._max = merged, width, used, gmax
        self._amax_shape, self._channel_shape, self._ndim = amax_shape, channel_shape, ndim

    _rebin = staticmethod(_histogram_merge.rebin)

    # -- amax ------------------------------------------------------------------
    @_on_host
    def compute_amax(
        self, method: str, *, stride: int = 1, start_bin: int = 128, percentile: float = 99.99
    ) -> Optional[torch.Tensor]:
        """The amax chosen from the collected histogram(s).

        Args:
            method: ``"entropy"`` (minimise the KL divergence between the
                histogram and its quantized version, as TensorRT), ``"mse"``
                (minimise the quantization MSE of the bin centres),
                ``"percentile"`` (clip that fraction of the values) or ``"max"``
                (the largest value seen).

        Keyword Args:
            stride: step between candidate amax bins (entropy, mse). Default 1.
            start_bin: first candidate bin (entropy, mse). Default 128.
            percentile: in [0, 100]. Default 99.99.

        Returns:
            A float32 tensor on the collected tensors' device: 0-dimensional per
            tensor, shaped like ``MaxCalibrator``'s amax per channel; or None if
            nothing was collected.

        Under torch.distributed call :meth:`sync` first (``fakequant.calibrate``
        and ``fakequant.utils.compute_amax`` do) so that every rank gets the same amax.
        """
        if method not in METHODS:
            raise ValueError(f"method must be one of {list(METHODS)}, got {method!r}")
        stride = _check_positive_int(stride, "stride")
        start_bin = _check_positive_int(start_bin, "start_bin", 0)
        if isinstance(percentile, bool) or not isinstance(percentile, numbers.Real) or not 0 <= percentile <= 100:
            raise ValueError(f"percentile must be a number in the range [0, 100], got {percentile!r}")
        if method in ("entropy", "mse") and not isinstance(self._num_bits, int):
            raise NotImplementedError(
                f"compute_amax({method!r}) needs integer num_bits, got {self._num_bits!r} (FP8 is not available yet)"
            )
        if self._hist is None:
            return None

        hist = self._hist.cpu()
        with _amax_search.one_thread():
            out = self._search(hist, method, stride, start_bin, percentile)
        amax = torch.tensor(out, dtype=torch.float32)
        amax = amax.reshape(()) if not self._channel_shape else amax.reshape(self._amax_shape)
        return amax.to(self._hist.device)

    def _search(self, hist: torch.Tensor, method: str, stride: int, start_bin: int, percentile: float) -> List[float]:
        assert self._used is not None and self._width is not None and self._max is not None  # (set with _hist)
        out: List[float] = []
        for c in range(hist.shape[0]):
            n = int(self._used[c])
            width = float(self._width[c])
            h = hist[c, :n]
            if width == 0.0:  # this channel has only seen zeros
                out.append(0.0)
                continue
            if method == "max":
                out.append(float(self._max[c]))
            elif method == "percentile":
                out.append(_amax_search.percentile_amax(h, width, percentile))
            elif method == "entropy":
                assert isinstance(self._num_bits, int)  # (compute_amax refuses float formats here)
                out.append(_amax_search.entropy_amax(h, width, self._num_bits, self._unsigned, stride, start_bin))
            else:
                assert isinstance(self._num_bits, int)  # (compute_amax refuses float formats here)
                out.append(_amax_search.mse_amax(h, width, self._num_bits, self._unsigned, self._narrow_range, stride,
                                     start_bin))
        return out

    def __str__(self) -> str:
        if self._hist is None:
            return "HistogramCalibrator(calib_bin_edges=None)"
        assert self._used is not None and self._max is not None  # (set with _hist)
        return (f"HistogramCalibrator(channels={self._hist.shape[0]}, bins={int(self._used.max())}, "
                f"max={float(self._max.max()):.4g})")

    def __repr__(self) -> str:
        return (f"HistogramCalibrator({super().__repr__()} num_bins={self._num_bins} "
                f"skip_zeros={self._skip_zeros} collected={self._hist is not None})")
