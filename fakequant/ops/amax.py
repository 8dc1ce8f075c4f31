"""The amax family (csrc/ops/amax.cpp): pytorch-quantization's ``fake_tensor_quant`` and
``tensor_quant``, the scale ``amax / bound``."""
from typing import Literal, Tuple, Union, overload

import torch

from .._core import (
    AMAX_EPSILON,
    MAX_NUM_BITS,
    MIN_NUM_BITS,
    amax_bound,
    check_bool,
    check_integer_num_bits,
    check_tensor,
    divide_into,
    lower_symbolically,
    refuse_untranslated,
)
from ..composite import compiled
from ._common import TensorOrNumber, _AMAX, _check_meta, _first, _new_mask, _ops


@torch.library.register_fake("fakequant::fake_quantize_amax")
def _(input, amax, num_bits=8, unsigned=False, narrow_range=True, check_values=True):
    refuse_untranslated("fake_quantize_amax")
    _check_meta(input, amax=amax)
    y = torch.empty_like(input)
    return y, _new_mask(y)


@torch.library.register_fake("fakequant::quantize_amax")
def _(input, amax, num_bits=8, unsigned=False, narrow_range=True, check_values=True):
    refuse_untranslated("quantize_amax")
    _check_meta(input, amax=amax)
    y = torch.empty_like(input)
    return y, _new_mask(y)


class _FakeQuantizeAmaxPassThrough(torch.autograd.Function):
    # Pass-through STE (no clipping), as modelopt's pass_through_bwd.
    @staticmethod
    def forward(ctx, input, amax, num_bits, unsigned, narrow_range, check_values):
        return _ops.fake_quantize_amax(input, amax, num_bits, unsigned, narrow_range, check_values)[0]

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None, None, None, None


def _amax_args(
    input: torch.Tensor, amax: TensorOrNumber, num_bits: int, check_values: bool
) -> Tuple[torch.Tensor, torch.Tensor, int, bool]:
    """The amax family's arguments after the checks Python makes (the others are C++'s);
    arguments of the usual types skip the checkers."""
    if not (isinstance(input, torch.Tensor) and type(num_bits) is int and MIN_NUM_BITS <= num_bits <= MAX_NUM_BITS
            and (check_values is True or check_values is False)):
        input = check_tensor(input, "input")
        num_bits = check_integer_num_bits(num_bits)
        check_values = check_bool(check_values, "check_values")
    if not isinstance(amax, torch.Tensor):
        (amax,) = _AMAX(input, amax)
    return input, amax, num_bits, check_values


@overload
def fake_quantize_amax(
    input: torch.Tensor,
    amax: TensorOrNumber,
    num_bits: int = ...,
    unsigned: bool = ...,
    narrow_range: bool = ...,
    pass_through: bool = ...,
    *,
    return_mask: Literal[False] = ...,
    check_values: bool = ...,
) -> torch.Tensor: ...


@overload
def fake_quantize_amax(
    input: torch.Tensor,
    amax: TensorOrNumber,
    num_bits: int = ...,
    unsigned: bool = ...,
    narrow_range: bool = ...,
    pass_through: bool = ...,
    *,
    return_mask: Literal[True],
    check_values: bool = ...,
) -> Tuple[torch.Tensor, torch.Tensor]: ...


@overload
def fake_quantize_amax(
    input: torch.Tensor,
    amax: TensorOrNumber,
    num_bits: int = ...,
    unsigned: bool = ...,
    narrow_range: bool = ...,
    pass_through: bool = ...,
    *,
    return_mask: bool,
    check_values: bool = ...,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]: ...


def fake_quantize_amax(
    input: torch.Tensor,
    amax: TensorOrNumber,
    num_bits: int = 8,
    unsigned: bool = False,
    narrow_range: bool = True,
    pass_through: bool = False,
    *,
    return_mask: bool = False,
    check_values: bool = True,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """pytorch-quantization's ``fake_tensor_quant``: scale ``amax / bound``.

    ``amax`` is a number or a tensor broadcastable to ``input`` (per-channel
    amax keeps the channel axes with size > 1). Where ``amax <= 2^-24`` the
    output is 0. The gradient passes where ``|x| <= amax`` (or everywhere with
    ``pass_through=True``). ``return_mask=True`` returns ``(output, packed mask)``
    (the mask the backward uses; see :func:`unpack_mask`, :func:`mask_grad`).
    ``check_values=False``: ``amax`` was computed by fakequant from the input, not
    given: not checked, NaN/inf in it give NaN outputs (see the module docstring).
    """
    input, amax, num_bits, check_values = _amax_args(input, amax, num_bits, check_values)
    lowered = lower_symbolically("fake_quantize_amax", input, amax, num_bits, unsigned, narrow_range, check_values)
    if lowered is not None:
        return _first(lowered, return_mask)
    if pass_through:
        if return_mask:
            raise ValueError("fakequant: return_mask=True has no mask to return with pass_through=True")
        return _FakeQuantizeAmaxPassThrough.apply(input, amax, num_bits, unsigned, narrow_range, check_values)
    if not return_mask and compiled.active(input):
        _check_meta(input, amax=amax)
        return compiled.fake_quantize_amax(input, amax, num_bits, unsigned, narrow_range, check_values)
    if not return_mask and compiled.fuses_backward(input):
        return compiled.apply_packed(
            lambda t: _ops.fake_quantize_amax(t, amax, num_bits, unsigned, narrow_range, check_values), input)
    return _first(_ops.fake_quantize_amax(input, amax, num_bits, unsigned, narrow_range, check_values), return_mask)


@overload
def quantize_amax(
    input: torch.Tensor,
    amax: TensorOrNumber,
    num_bits: int = ...,
    unsigned: bool = ...,
    narrow_range: bool = ...,
    *,
    return_mask: Literal[False] = ...,
    check_values: bool = ...,
) -> Tuple[torch.Tensor, torch.Tensor]: ...


@overload
def quantize_amax(
    input: torch.Tensor,
    amax: TensorOrNumber,
    num_bits: int = ...,
    unsigned: bool = ...,
    narrow_range: bool = ...,
    *,
    return_mask: Literal[True],
    check_values: bool = ...,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...


@overload
def quantize_amax(
    input: torch.Tensor,
    amax: TensorOrNumber,
    num_bits: int = ...,
    unsigned: bool = ...,
    narrow_range: bool = ...,
    *,
    return_mask: bool,
    check_values: bool = ...,
) -> Union[Tuple[torch.Tensor, torch.Tensor], Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]: ...


def quantize_amax(
    input: torch.Tensor,
    amax: TensorOrNumber,
    num_bits: int = 8,
    unsigned: bool = False,
    narrow_range: bool = True,
    *,
    return_mask: bool = False,
    check_values: bool = True,
) -> Union[Tuple[torch.Tensor, torch.Tensor], Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """pytorch-quantization's ``tensor_quant``: the integer values (in input's
    dtype) and the inverse scale ``bound / amax`` they were multiplied by (1 where
    ``amax <= 2^-24``; pytorch-quantization calls it the scale), so that
    ``output / inverse_scale`` dequantizes; and the packed mask third with
    ``return_mask=True``. ``check_values`` as in :func:`fake_quantize_amax`."""
    input, amax, num_bits, check_values = _amax_args(input, amax, num_bits, check_values)
    lowered = lower_symbolically("quantize_amax", input, amax, num_bits, unsigned, narrow_range, check_values)
    output, mask = lowered if lowered is not None else _ops.quantize_amax(input, amax, num_bits, unsigned,
                                                                          narrow_range, check_values)
    # pytorch-quantization's RN(bound / amax), 1 where amax <= 2^-24 (bound / amax32 would be
    # amax32.reciprocal() * bound: two roundings)
    amax32 = amax.float()
    inverse_scale = torch.where(amax32 <= AMAX_EPSILON, 1.0, divide_into(amax_bound(num_bits, unsigned), amax32))
    return (output, inverse_scale, mask) if return_mask else (output, inverse_scale)
