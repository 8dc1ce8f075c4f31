"""The torch.distributed plumbing of calibration: every rank must end with the same amax.

Calibrators collect on each rank's shard of the data; before their amax is
computed, :meth:`sync` of each calibrator merges what every rank collected
(a MAX all-reduce of the running amax, a SUM all-reduce of histograms laid on
a common grid). All ranks must call it, in the same order, for the same
calibrators: it is a collective.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, List, Optional

import torch

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = ["is_distributed", "all_gather_object", "all_reduce", "collective_device"]


def _dist():
    import torch.distributed as dist

    return dist


def is_distributed(group: Optional[ProcessGroup] = None) -> bool:
    """True when torch.distributed is initialised and ``group`` has more than one rank."""
    dist = _dist()
    return dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1


def collective_device(group: Optional[ProcessGroup] = None, like: Optional[torch.Tensor] = None) -> torch.device:
    """The device a tensor must be on for ``group``'s backend: CUDA (the current
    device) for NCCL, the CPU for gloo and MPI; else ``like``'s device."""
    backend = str(_dist().get_backend(group)).lower()
    if "gloo" in backend or "mpi" in backend:
        return torch.device("cpu")
    if "nccl" in backend:
        return torch.device("cuda", torch.cuda.current_device())
    return like.device if like is not None else torch.device("cpu")


def all_gather_object(obj: Any, group: Optional[ProcessGroup] = None) -> List[Any]:
    """Every rank's ``obj`` (picklable), in rank order."""
    dist = _dist()
    out: List[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


def all_reduce(tensor: torch.Tensor, op: str, group: Optional[ProcessGroup] = None) -> torch.Tensor:
    """``tensor`` reduced over ``group`` with ``op`` (``"max"`` or ``"sum"``), on
    ``tensor``'s device (moved to the backend's device and back as needed)."""
    dist = _dist()
    device = collective_device(group, tensor)
    work = tensor.to(device).contiguous()
    if work is tensor:
        work = tensor.clone()
    dist.all_reduce(work, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM, group=group)
    return work.to(tensor.device)
