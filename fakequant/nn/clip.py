"""The ``Clip`` module: a clamp whose bounds can be learned (PACT)."""
import numbers

import torch
from torch import nn

from .._core import check_bool
from .functional import clip

__all__ = ["Clip"]


def _bound(value, name, learn):
    if isinstance(value, bool):
        raise TypeError(f"{name} must be a number or a tensor, got a bool")
    if isinstance(value, numbers.Real):
        return torch.tensor(float(value), dtype=torch.float32)
    if isinstance(value, torch.Tensor) or type(value).__module__ == "numpy":
        t = torch.as_tensor(value).detach().clone()
        if not t.is_floating_point():
            t = t.float()
        if learn:
            if t.numel() != 1:
                raise ValueError(f"a learnable {name} must hold one value, got shape {tuple(t.shape)}")
            t = t.reshape(())
        return t
    raise TypeError(f"{name} must be a number or a tensor, got {type(value).__name__}")


class Clip(nn.Module):
    """Clamps its input to ``[clip_value_min, clip_value_max]``.

    Args:
        clip_value_min: lower bound, a number or a tensor broadcastable to the input.
        clip_value_max: upper bound, a number or a tensor broadcastable to the input.
        learn_min: make ``clip_value_min`` a (scalar) ``nn.Parameter``. Default False.
        learn_max: make ``clip_value_max`` a (scalar) ``nn.Parameter``. Default False.

    Learnable bounds are parameters named ``clip_value_min`` / ``clip_value_max``
    (the state_dict keys of pytorch-quantization); fixed bounds are
    non-persistent buffers that follow ``.to()``.
    """

    def __init__(self, clip_value_min, clip_value_max, learn_min=False, learn_max=False):
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

    def forward(self, inputs):
        return clip(inputs, self.clip_value_min, self.clip_value_max)

    def extra_repr(self):
        def show(t):
            return f"{t.item():.4g}" if t.numel() == 1 else f"tensor{tuple(t.shape)}"

        return f"min={show(self.clip_value_min)}, max={show(self.clip_value_max)}"
