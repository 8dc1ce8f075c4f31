"""pytorch-quantization's ``fake_affine_tensor_quant``: the affine family (csrc/ops/affine.cpp)
with scale and zero point derived from a ``[min_range, max_range]`` interval."""
from typing import Literal, Tuple, Union, overload

import torch

from .._core import check_integer_num_bits, check_tensor, lower_symbolically, refuse_untranslated
from ..composite import compiled
from ._common import TensorOrNumber, _MIN_MAX, _check_meta, _first, _new_mask, _ops


@torch.library.register_fake("fakequant::fake_quantize_min_max")
def _(input, min_range, max_range, num_bits=8):
    refuse_untranslated("fake_quantize_min_max")
    _check_meta(input, min_range=min_range, max_range=max_range)
    y = torch.empty_like(input)
    return y, _new_mask(y)


@overload
def fake_quantize_min_max(
    input: torch.Tensor,
    min_range: TensorOrNumber,
    max_range: TensorOrNumber,
    num_bits: int = ...,
    *,
    return_mask: Literal[False] = ...,
) -> torch.Tensor: ...


@overload
def fake_quantize_min_max(
    input: torch.Tensor,
    min_range: TensorOrNumber,
    max_range: TensorOrNumber,
    num_bits: int = ...,
    *,
    return_mask: Literal[True],
) -> Tuple[torch.Tensor, torch.Tensor]: ...


@overload
def fake_quantize_min_max(
    input: torch.Tensor,
    min_range: TensorOrNumber,
    max_range: TensorOrNumber,
    num_bits: int = ...,
    *,
    return_mask: bool,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]: ...


def fake_quantize_min_max(
    input: torch.Tensor,
    min_range: TensorOrNumber,
    max_range: TensorOrNumber,
    num_bits: int = 8,
    *,
    return_mask: bool = False,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """pytorch-quantization's ``fake_affine_tensor_quant``: an asymmetric range
    ``[min_range, max_range]`` on ``2^num_bits`` levels. The gradient passes
    where ``min_range <= x <= max_range``. ``return_mask=True`` returns ``(output, packed mask)``."""
    input = check_tensor(input, "input")
    min_range, max_range = _MIN_MAX(input, min_range, max_range)
    num_bits = check_integer_num_bits(num_bits)
    lowered = lower_symbolically("fake_quantize_min_max", input, min_range, max_range, num_bits)
    if lowered is not None:
        return _first(lowered, return_mask)
    if not return_mask and compiled.active(input):
        _check_meta(input, min_range=min_range, max_range=max_range)
        return compiled.fake_quantize_min_max(input, min_range, max_range, num_bits)
    if not return_mask and compiled.fuses_backward(input):
        return compiled.apply_packed(lambda t: _ops.fake_quantize_min_max(t, min_range, max_range, num_bits), input)
    return _first(_ops.fake_quantize_min_max(input, min_range, max_range, num_bits), return_mask)
