"""The ``Clip`` module: a clamp whose bounds can be learned (PACT)."""
from __future__ import annotations

import numbers
from typing import TYPE_CHECKING, Any, Dict, List, Tuple, Union

import torch
from torch import nn

from .._core import check_bool
from .functional import clip

if TYPE_CHECKING:
    from typing import TypeGuard  # (Python >= 3.10; annotations only)

__all__ = ["Clip"]


def _bound(value: Any, name: str, learn: bool) -> torch.Tensor:
    if isinstance(value, bool):
        raise TypeError(f"{name} must be a number or a tensor, got a bool")
    if isinstance(value, numbers.Real):
        return torch.tensor(float(value), dtype=torch.float32)
    if learn and isinstance(value, torch.Tensor):
        # pytorch-quantization 2.2.1 refuses every tensor here (ValueError), one element or not
        raise ValueError(f"a learnable {name} must be scalar (hold one value) given as a number or a NumPy "
                         f"value, not a tensor; got a tensor of shape {tuple(value.shape)} (pass float(t))")
    if isinstance(value, torch.Tensor) or type(value).__module__ == "numpy":
        t = torch.as_tensor(value).detach().clone()
        if not t.is_floating_point():
            t = t.float()
        if learn:
            if t.numel() != 1:
                raise ValueError(f"a learnable {name} must be scalar (hold one value), got shape {tuple(t.shape)}")
            t = t.reshape(())
        return t
    raise TypeError(f"{name} must be a number or a tensor, got {type(value).__name__}")


def _plain(t: object) -> TypeGuard[torch.Tensor]:
    # a tensor or a Parameter, not a subclass (a DTensor keeps its shape as it is)
    return type(t) in (torch.Tensor, nn.Parameter)


class Clip(nn.Module):
    """Clamps its input to ``[clip_value_min, clip_value_max]``.

    Args:
        clip_value_min: lower bound, a number or a tensor broadcastable to the input.
        clip_value_max: upper bound, a number or a tensor broadcastable to the input.
        learn_min: make ``clip_value_min`` a (scalar) ``nn.Parameter``. Default False.
        learn_max: make ``clip_value_max`` a (scalar) ``nn.Parameter``. Default False.

    A learnable bound is given as a number or a one-element NumPy value; a tensor (even of
    one element) raises ValueError, as pytorch-quantization 2.2.1 does.

    Learnable bounds are parameters named ``clip_value_min`` / ``clip_value_max``
    (the state_dict keys of pytorch-quantization); fixed bounds are
    non-persistent buffers that follow ``.to()``. A learnable bound is 0-dimensional,
    or of shape ``(1,)`` after :meth:`learned_bounds_1d_` (FSDP2's ``fully_shard``
    shards no 0-dimensional parameter); a checkpoint of either shape loads into both.
    """

    # Parameters (learnable) or non-persistent buffers, registered by __init__.
    clip_value_min: torch.Tensor
    clip_value_max: torch.Tensor

    def __init__(
        self,
        clip_value_min: Union[float, torch.Tensor],
        clip_value_max: Union[float, torch.Tensor],
        learn_min: bool = False,
        learn_max: bool = False,
    ) -> None:
        super().__init__()
        for name, value, learn in (
            ("clip_value_min", clip_value_min, learn_min),
            ("clip_value_max", clip_value_max, learn_max),
        ):
            check_bool(learn, f"learn_{name[11:]}")
            t = _bound(value, name, learn)
            if learn:
                self.register_parameter(name, nn.Parameter(t))
            else:
                self.register_buffer(name, t, persistent=False)

    def bounds(self) -> Tuple[torch.Tensor, ...]:
        """``(clip_value_min, clip_value_max)`` as the forward applies them: a learnable
        bound of shape ``(1,)`` is read through a 0-dimensional view (gradients reach it)."""
        return tuple(self._as_applied(name) for name in ("clip_value_min", "clip_value_max"))

    def _as_applied(self, name: str) -> torch.Tensor:
        t = getattr(self, name)
        return t.reshape(()) if name in self._parameters and t.dim() == 1 else t

    def learned_bounds_1d_(self) -> int:
        """Holds every learnable bound as a parameter of shape ``(1,)`` (a new
        ``nn.Parameter``, same value and ``requires_grad``): FSDP2's ``fully_shard``
        rejects 0-dimensional parameters. The forward, its gradients and the exported
        graph's values are unchanged. Call it before building the optimizer, which
        holds the parameter objects. Returns how many bounds changed."""
        changed = 0
        for name, p in list(self._parameters.items()):
            if p is not None and p.dim() == 0:
                self.register_parameter(name, nn.Parameter(p.detach().reshape(1), requires_grad=p.requires_grad))
                changed += 1
        return changed

    def _load_from_state_dict(self, state_dict: Dict[str, Any], prefix: str, local_metadata: Dict[str, Any],
                              strict: bool, missing_keys: List[str], unexpected_keys: List[str],
                              error_msgs: List[str]) -> None:
        # A learnable bound is one value, saved 0-dimensional or as shape (1,):
        # either loads into either.
        for name, p in self._parameters.items():
            src = state_dict.get(prefix + name)
            if (p is not None and _plain(src) and _plain(p) and src.numel() == 1 and p.numel() == 1
                    and src.shape != p.shape):
                state_dict[prefix + name] = src.reshape(p.shape)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return clip(inputs, *self.bounds())

    def extra_repr(self) -> str:
        def show(t: torch.Tensor) -> str:
            return f"{t.item():.4g}" if t.numel() == 1 else f"tensor{tuple(t.shape)}"

        return f"min={show(self.clip_value_min)}, max={show(self.clip_value_max)}"
