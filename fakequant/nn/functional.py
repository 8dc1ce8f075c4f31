"""Functional helpers of the quantized modules."""
from __future__ import annotations

from typing import Any, Optional, Tuple, Union

import torch

from .._core import ValueAndRuntimeError, dynamo_exporting

__all__ = ["ClipFunction", "clip"]


class ClipFunction(torch.autograd.Function):
    """``clip(input, clip_value_min, clip_value_max)``: ``input`` clamped to
    ``[clip_value_min, clip_value_max]`` (tensors broadcast to ``input``).

    Gradients follow PACT (https://arxiv.org/abs/1805.06085), as TensorFlow's
    ``clip_by_value``: ``input`` gets the gradient strictly inside the range;
    a learnable (scalar) bound gets the sum of the gradient where the input
    reached it. Only two boolean masks are saved, not the input.
    """

    @staticmethod
    def forward(ctx: Any, input: torch.Tensor, clip_value_min: torch.Tensor,
                clip_value_max: torch.Tensor) -> torch.Tensor:
        lo = clip_value_min.to(input.dtype)
        hi = clip_value_max.to(input.dtype)
        below = input <= lo
        above = input >= hi
        ctx.save_for_backward(below, above)
        ctx.min_dtype = clip_value_min.dtype
        ctx.max_dtype = clip_value_max.dtype
        ctx.bound_shapes = (clip_value_min.shape, clip_value_max.shape)
        return torch.minimum(torch.maximum(input, lo), hi)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:
        below, above = ctx.saved_tensors
        grad_input: Optional[torch.Tensor] = None
        grad_min: Optional[torch.Tensor] = None
        grad_max: Optional[torch.Tensor] = None
        if ctx.needs_input_grad[0]:
            grad_input = grad_output.masked_fill(below | above, 0)
        # Sum in float32 at least, so that float16 gradients do not overflow.
        acc = torch.promote_types(grad_output.dtype, torch.float32)
        for i, name in ((1, "clip_value_min"), (2, "clip_value_max")):
            shape = ctx.bound_shapes[i - 1]
            if ctx.needs_input_grad[i] and shape.numel() != 1:
                # (the gradient of a bound is one sum; pytorch-quantization's words and type, and
                # the RuntimeError autograd raised before for the gradient's shape)
                raise ValueAndRuntimeError(f"{name} requires grad: a learnable bound can only be scalar, got "
                                           f"shape {tuple(shape)}")
        if ctx.needs_input_grad[1]:
            grad_min = torch.where(below, grad_output, 0).sum(dtype=acc).to(ctx.min_dtype)
        if ctx.needs_input_grad[2]:
            grad_max = torch.where(above, grad_output, 0).sum(dtype=acc).to(ctx.max_dtype)
        return grad_input, grad_min, grad_max


def _as_bound(value: Union[float, torch.Tensor], like: torch.Tensor, name: str) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value if value.device == like.device else value.to(like.device)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a tensor or a number, got {type(value).__name__}")
    return torch.tensor(float(value), dtype=torch.float32, device=like.device)


def clip(
    input: torch.Tensor, clip_value_min: Union[float, torch.Tensor], clip_value_max: Union[float, torch.Tensor]
) -> torch.Tensor:
    """Clamps ``input`` to ``[clip_value_min, clip_value_max]`` with PACT gradients
    for the bounds (see :class:`ClipFunction`). Bounds may be numbers or tensors."""
    lo = _as_bound(clip_value_min, input, "clip_value_min")
    hi = _as_bound(clip_value_max, input, "clip_value_max")
    if lo.dim() == 0 and hi.dim() == 0 and dynamo_exporting() and hasattr(torch.onnx, "ops"):
        # One Clip node for the dynamo exporter: its optimizer rewrites Max/Min with constant
        # bounds into a Clip on new initializers named after the input, and drops the second
        # pair where two quantizers clip one tensor (an invalid graph).
        return torch.onnx.ops.symbolic("Clip", (input, lo.to(input.dtype), hi.to(input.dtype)),
                                       dtype=input.dtype, shape=input.shape)
    return ClipFunction.apply(input, lo, hi)
