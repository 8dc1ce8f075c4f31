"""The amax a :class:`~fakequant.nn.TensorQuantizer` computes from its input, and the block
view of an input: functions of the quantizer's :class:`~fakequant.tensor_quant.QuantSpec`."""
from __future__ import annotations

from typing import List, Tuple

import torch

from .. import _core
from ..calib.reduce_amax import reduce_amax
from ..tensor_quant import QuantSpec

__all__ = ["tensor_amax", "axis_amax", "broadcastable", "blocked_view", "block_amax"]


def tensor_amax(inputs: torch.Tensor) -> torch.Tensor:
    """max |inputs| over the whole tensor, 0-dimensional (one pass, no |x| temporary)."""
    if torch.onnx.is_in_onnx_export():
        # (the dynamo exporter cannot translate the aminmax reduce_amax uses,
        # nor an amax without dims)
        return inputs.detach().abs().amax(dim=tuple(range(inputs.dim())))
    return reduce_amax(inputs, axis=None)


def axis_amax(spec: QuantSpec, inputs: torch.Tensor) -> torch.Tensor:
    """max |inputs| per tensor, or per index of the spec's ``axis`` (kept, size 1 elsewhere)."""
    if spec.axis is None:
        return tensor_amax(inputs)
    kept = _core.resolve_axes(spec.axis, inputs.dim(), "quantizer axis")
    reduce_dims = tuple(d for d in range(inputs.dim()) if d not in kept)
    return reduce_amax(inputs, axis=reduce_dims, keepdims=True) if reduce_dims else inputs.abs()


def broadcastable(spec: QuantSpec, amax: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
    """``amax`` shaped to broadcast to ``inputs``: a per-channel amax stored flat (shape
    ``(C,)``) is laid along the spec's axis."""
    if amax.dim() == 1 and amax.numel() > 1 and isinstance(spec.axis, int) and inputs.dim() > 1:
        shape = [1] * inputs.dim()
        shape[spec.axis % inputs.dim()] = amax.numel()
        return amax.reshape(shape)
    return amax


def blocked_view(spec: QuantSpec, inputs: torch.Tensor) -> Tuple[torch.Tensor, List[int]]:
    """``inputs`` reshaped so that each block of the spec's ``block_sizes`` is a trailing
    run of one axis, with the positions of the within-block axes."""
    assert spec.block_sizes is not None  # (only block quantizers get here)
    shape: List[int] = []
    inner: List[int] = []
    nd = inputs.dim()
    axes = _core.resolve_axes(tuple(spec.block_sizes), nd, "block_sizes axis")
    blocks = dict(zip(axes, spec.block_sizes.values()))
    for d, n in enumerate(inputs.shape):
        if d not in blocks:
            shape.append(n)
            continue
        block = blocks[d]
        size = (n or 1) if block is None else block  # (an empty axis is one empty block)
        if n % size:
            raise ValueError(f"block_sizes[{d}] = {size} does not divide the input's size {n} along axis {d}")
        shape += [n // size, size]
        inner.append(len(shape) - 1)
    return inputs.reshape(shape), inner


def block_amax(blocked: torch.Tensor, inner: List[int]) -> torch.Tensor:
    """max |x| of each block of ``blocked`` (a :func:`blocked_view`), detached."""
    return reduce_amax(blocked, axis=tuple(inner), keepdims=True).detach().reshape(
        [1 if d in inner else n for d, n in enumerate(blocked.shape)])
