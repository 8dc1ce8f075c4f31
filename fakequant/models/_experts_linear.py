"""``fakequant_moe::experts_linear``: one linear layer per expert over rows sorted by expert,
the grouped matmul of :mod:`fakequant.models.experts` under ``torch.compile``.

Row block ``e`` of ``x`` (``counts[e]`` rows, in expert order) times ``weight[e]``
transposed (``weight``: ``(experts, out, in)``, as ``F.linear`` takes it); rows past
``counts.sum()`` give zeros. The row counts depend on the routing, so the loop over the
experts runs inside an operator with a fixed output shape (``(rows, out)``), which
``torch.compile`` traces without data-dependent shapes (``fullgraph=True``). Its gradient
is the same operator on the transposed weights (``x``) and the per-expert products of
the output gradient and ``x`` (``weight``). Not a fake-quant operator: it lives outside the
``fakequant`` namespace and its operator table.
"""
from __future__ import annotations

from typing import Any, List, Tuple

import torch

__all__ = ["experts_linear"]


def _segments(counts: List[int]):
    """``(expert, first row, end row)`` of each expert with rows."""
    start = 0
    for e, n in enumerate(counts):
        if n:
            yield e, start, start + n
        start += n


@torch.library.custom_op("fakequant_moe::experts_linear", mutates_args=())
def experts_linear(x: torch.Tensor, weight: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """``out[rows of e] = x[rows of e] @ weight[e].T``; see the module."""
    if x.dim() != 2 or weight.dim() != 3 or x.shape[1] != weight.shape[2]:
        raise ValueError(f"experts_linear takes x (rows, in) and weight (experts, out, in), got "
                         f"{tuple(x.shape)} and {tuple(weight.shape)}")
    rows = counts.tolist()  # (the one device-to-host copy)
    if counts.shape != (weight.shape[0],) or sum(rows) > x.shape[0]:
        raise ValueError(f"counts must hold one row count per expert ({weight.shape[0]}), at most {x.shape[0]} "
                         f"in all, got {rows}")
    out = x.new_zeros(x.shape[0], weight.shape[1])
    for e, a, b in _segments(rows):
        torch.mm(x[a:b], weight[e].t(), out=out[a:b])
    return out


@experts_linear.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[0], weight.shape[1])


@torch.library.custom_op("fakequant_moe::experts_linear_weight_grad", mutates_args=())
def experts_linear_weight_grad(grad: torch.Tensor, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """``(experts, out, in)``: ``grad[rows of e].T @ x[rows of e]`` per expert, zeros for
    experts without rows."""
    out = x.new_zeros(counts.shape[0], grad.shape[1], x.shape[1])
    for e, a, b in _segments(counts.tolist()):
        torch.mm(grad[a:b].t(), x[a:b], out=out[e])
    return out


@experts_linear_weight_grad.register_fake
def _(grad: torch.Tensor, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    return x.new_empty(counts.shape[0], grad.shape[1], x.shape[1])


def _setup_context(ctx: Any, inputs: Tuple[torch.Tensor, torch.Tensor, torch.Tensor], output: torch.Tensor) -> None:
    ctx.save_for_backward(*inputs)


def _backward(ctx: Any, grad: torch.Tensor):
    x, weight, counts = ctx.saved_tensors
    grad_x = grad_w = None
    if ctx.needs_input_grad[0]:
        grad_x = experts_linear(grad, weight.transpose(1, 2), counts)
    if ctx.needs_input_grad[1]:
        grad_w = experts_linear_weight_grad(grad, x, counts)
    return grad_x, grad_w, None


experts_linear.register_autograd(_backward, setup_context=_setup_context)
