"""Max calibrator: the absolute maximum over everything collected."""
from __future__ import annotations

from typing import TYPE_CHECKING, List, Optional, Sequence, Tuple, Union

import torch

from .._core import ValueAndRuntimeError, check_bool
from . import _distributed
from .calibrator import _Calibrator, normalize_kept_axes

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = ["MaxCalibrator"]


class MaxCalibrator(_Calibrator):
    """Tracks ``max(|x|)`` over all collected tensors, per tensor or per ``axis``.

    Args:
        num_bits, axis, unsigned: see :class:`~fakequant.calib.calibrator._Calibrator`.
        track_amax: keep every collected tensor's own amax in :attr:`amaxs`.

    The amax has the collected tensor's rank with size 1 on reduced axes
    (``(C, 1, 1, 1)`` for ``axis=0`` on a conv weight), or is 0-dimensional
    per tensor, and lives on the collected tensors' device. Collecting does
    not synchronise with the device (unless ``track_amax``).
    """

    def __init__(
        self,
        num_bits: Union[int, Tuple[int, int]] = 8,
        axis: Optional[Union[int, Sequence[int]]] = None,
        unsigned: bool = False,
        track_amax: bool = False,
    ) -> None:
        super().__init__(num_bits, axis, unsigned)
        self._track_amax = check_bool(track_amax, "track_amax")
        self._amaxs: Optional[List[torch.Tensor]] = [] if track_amax else None
        self._calib_amax: Optional[torch.Tensor] = None

    @property
    def amaxs(self) -> Optional[List[torch.Tensor]]:
        """The amax of each collected tensor (CPU tensors), if ``track_amax``."""
        return self._amaxs

    def collect(self, x: torch.Tensor, kept_axes: Optional[Union[int, Sequence[int]]] = None) -> None:
        """Updates the running amax with tensor ``x``.

        Args:
            kept_axes: the axes of ``x`` that keep their own amax, for this tensor
                (a block quantizer's view of its input has one per block); default:
                the calibrator's ``axis``.

        Raises:
            ValueAndRuntimeError: (a ValueError and a RuntimeError, as pytorch-quantization
                raised) if ``x`` gives another amax shape than the tensors collected before.
        """
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"MaxCalibrator.collect expects a tensor, got {type(x).__name__}")
        with torch.no_grad():
            x = x.detach()
            kept = normalize_kept_axes(self._axis if kept_axes is None else kept_axes, x.dim())
            reduce_dims = [d for d in range(x.dim()) if d not in kept]
            if not reduce_dims:
                local = x.abs()
            elif len(reduce_dims) == x.dim():
                lo, hi = torch.aminmax(x)
                local = torch.maximum(hi, -lo)
            else:
                local = x.abs().amax(dim=reduce_dims, keepdim=True)
            # float32 whatever the input: the amax the operators take (and a stable
            # accumulator across float16 / bfloat16 / float32 batches).
            local = local.float()
            if local.numel() == 1:
                local = local.reshape(())
            if self._calib_amax is None:
                self._calib_amax = local.clone()
            else:
                if local.shape != self._calib_amax.shape:
                    # (pytorch-quantization raised RuntimeError, "amax shape changed!")
                    raise ValueAndRuntimeError(
                        f"MaxCalibrator: amax shape changed! From {tuple(self._calib_amax.shape)} to "
                        f"{tuple(local.shape)} (a tensor of shape {tuple(x.shape)} with axis={self._axis})"
                    )
                if local.device != self._calib_amax.device:
                    local = local.to(self._calib_amax.device)
                torch.maximum(self._calib_amax, local, out=self._calib_amax)
            if self._track_amax:
                assert self._amaxs is not None  # (a list with track_amax)
                self._amaxs.append(local.cpu())

    def reset(self) -> None:
        """Forgets the collected amax."""
        self._calib_amax = None
        if self._track_amax:
            self._amaxs = []

    def sync(self, group: Optional[ProcessGroup] = None) -> None:
        """Makes the amax the max over every rank of ``group`` (default: the
        world) of torch.distributed: an all-reduce with MAX, so every rank ends
        with the same amax, ranks that collected nothing too. A collective:
        every rank calls it. Does nothing when torch.distributed is not
        initialised or the group has one rank. Raises ValueError (on every
        rank) if the ranks collected amax of different shapes.
        """
        if not _distributed.is_distributed(group):
            return
        local = self._calib_amax
        shapes = _distributed.all_gather_object(None if local is None else tuple(local.shape), group)
        known = [s for s in shapes if s is not None]
        if not known:
            return
        if any(s != known[0] for s in known):
            raise ValueError(f"MaxCalibrator.sync: the ranks collected amax of different shapes: {shapes}")
        if local is None:
            # 0 is neutral for the max of amax values (all >= 0).
            device = _distributed.collective_device(group)
            local = torch.zeros(known[0], dtype=torch.float32, device=device)
        self._calib_amax = _distributed.all_reduce(local, "max", group)

    def compute_amax(self) -> Optional[torch.Tensor]:
        """The amax of everything collected, or None if nothing was. Under
        torch.distributed call :meth:`sync` first (``fakequant.calibrate`` and
        ``fakequant.utils.compute_amax`` do) so that every rank gets the same amax."""
        return self._calib_amax

    def __str__(self) -> str:
        return f"MaxCalibrator(track_amax={self._track_amax})"

    def __repr__(self) -> str:
        return f"MaxCalibrator({super().__repr__()} calib_amax={self._calib_amax} track_amax={self._track_amax})"
