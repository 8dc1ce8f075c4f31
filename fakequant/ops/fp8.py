"""FP8 (and FP6) fake quantization, the amax family's floating-point grid (csrc/ops/amax.cpp)."""
from typing import Literal, Tuple, Union, overload

import torch

from .._core import FP8_FORMATS, check_bool, check_fp8_format, check_tensor, lower_symbolically, refuse_untranslated
from ..composite import compiled
from ._common import TensorOrNumber, _AMAX, _check_meta, _first, _new_mask, _ops


def fp8_max(exponent_bits: int = 4, mantissa_bits: int = 3) -> float:
    """The largest finite value of an FP8 or FP6 format: 448.0 for E4M3 (4, 3), 57344.0 for
    E5M2 (5, 2), 28.0 for E3M2 (3, 2), 7.5 for E2M3 (2, 3)."""
    return FP8_FORMATS[check_fp8_format(exponent_bits, mantissa_bits)]


@torch.library.register_fake("fakequant::fake_quantize_fp8")
def _(input, amax, exponent_bits=4, mantissa_bits=3, check_values=True):
    refuse_untranslated("fake_quantize_fp8")
    _check_meta(input, amax=amax)
    check_fp8_format(exponent_bits, mantissa_bits)
    y = torch.empty_like(input)
    return y, _new_mask(y)


@overload
def fake_quantize_fp8(
    input: torch.Tensor,
    amax: TensorOrNumber,
    exponent_bits: int = ...,
    mantissa_bits: int = ...,
    *,
    return_mask: Literal[False] = ...,
    check_values: bool = ...,
) -> torch.Tensor: ...


@overload
def fake_quantize_fp8(
    input: torch.Tensor,
    amax: TensorOrNumber,
    exponent_bits: int = ...,
    mantissa_bits: int = ...,
    *,
    return_mask: Literal[True],
    check_values: bool = ...,
) -> Tuple[torch.Tensor, torch.Tensor]: ...


@overload
def fake_quantize_fp8(
    input: torch.Tensor,
    amax: TensorOrNumber,
    exponent_bits: int = ...,
    mantissa_bits: int = ...,
    *,
    return_mask: bool,
    check_values: bool = ...,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]: ...


def fake_quantize_fp8(
    input: torch.Tensor,
    amax: TensorOrNumber,
    exponent_bits: int = 4,
    mantissa_bits: int = 3,
    *,
    return_mask: bool = False,
    check_values: bool = True,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """FP8 fake quantization: E4M3 (``exponent_bits=4, mantissa_bits=3``, max 448)
    or E5M2 (5, 2; max 57344) with scale ``s = amax / max``:
    ``fp8(clamp(x / s, -max, max)) * s``, rounded to nearest even as torch's
    float8 casts round (bit-identical to ``.to(torch.float8_e4m3fn)``). The FP6
    formats of the OCP microscaling specification work the same way: E3M2 (3, 2;
    max 28) and E2M3 (2, 3; max 7.5).

    ``amax`` is a number or a tensor broadcastable to ``input``, as in
    :func:`fake_quantize_amax`; where ``amax <= 2^-24`` the output is 0. The
    gradient passes where ``|x| <= amax``. ``return_mask=True`` returns ``(output, packed mask)``.
    ``check_values`` as in :func:`fake_quantize_amax`.
    """
    input = check_tensor(input, "input")
    (amax,) = _AMAX(input, amax)
    exponent_bits, mantissa_bits = check_fp8_format(exponent_bits, mantissa_bits)
    check_values = check_bool(check_values, "check_values")
    lowered = lower_symbolically("fake_quantize_fp8", input, amax, exponent_bits, mantissa_bits, check_values)
    if lowered is not None:
        return _first(lowered, return_mask)
    if not return_mask and compiled.active(input):
        _check_meta(input, amax=amax)
        return compiled.fake_quantize_fp8(input, amax, exponent_bits, mantissa_bits, check_values)
    if not return_mask and compiled.fuses_backward(input):
        return compiled.apply_packed(
            lambda t: _ops.fake_quantize_fp8(t, amax, exponent_bits, mantissa_bits, check_values), input)
    return _first(_ops.fake_quantize_fp8(input, amax, exponent_bits, mantissa_bits, check_values), return_mask)
