"""Absolute maximum of a tensor over some axes, numpy style."""
from __future__ import annotations

import numbers

from typing import Any, List, Optional, Sequence, Union

import torch

__all__ = ["reduce_amax"]


def _reduce_dims(axis: Any, ndim: int) -> List[int]:
    if axis is None:
        return list(range(ndim))
    axes = [axis] if isinstance(axis, numbers.Integral) and not isinstance(axis, bool) else axis
    if not isinstance(axes, (list, tuple)) or not all(
        isinstance(a, numbers.Integral) and not isinstance(a, bool) for a in axes
    ):
        raise TypeError(f"axis must be None, an int or a tuple of ints, got {axis!r}")
    if len(axes) > ndim:
        raise ValueError(f"cannot reduce {len(axes)} axes {tuple(axes)} of a tensor with {ndim} dimensions")
    dims = []
    for a in axes:
        if not -ndim <= a < max(ndim, 1):
            raise ValueError(f"axis {a} is out of range for a tensor with {ndim} dimensions")
        dims.append(int(a) % max(ndim, 1))
    if len(set(dims)) != len(dims):
        raise ValueError(f"axis {axis!r} names a dimension twice")
    return dims


def reduce_amax(
    input: torch.Tensor, axis: Optional[Union[int, Sequence[int]]] = None, keepdims: bool = True
) -> torch.Tensor:
    """``max(|input|)`` over ``axis`` (None: all axes; an int; or a tuple of ints).

    With ``keepdims`` the reduced axes stay with size 1; a result with a
    single element is returned 0-dimensional, as pytorch-quantization does
    (that is the shape of a per-tensor ``amax``). No gradient flows through it.
    """
    if not isinstance(input, torch.Tensor):
        raise TypeError(f"input must be a tensor, got {type(input).__name__}")
    with torch.no_grad():
        dims = _reduce_dims(axis, input.dim())
        if input.dim() == 0:
            return input.abs()
        if input.numel() == 0:
            raise ValueError(f"cannot reduce an empty tensor of shape {tuple(input.shape)}")
        if len(dims) == input.dim():
            # One pass over the input (min and max together), no |x| temporary.
            lo, hi = torch.aminmax(input)
            return torch.maximum(hi, -lo)
        out = input.abs().amax(dim=dims, keepdim=True)
        if out.numel() == 1:
            return out.reshape(())
        if not keepdims:
            out = out.squeeze(dims)
        return out
