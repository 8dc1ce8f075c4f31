"""The tensor quantization functions and their ``torch.autograd.Function`` classes.

The pytorch-quantization-shaped front of :mod:`fakequant.ops`. Every function here calls
the operators in :mod:`fakequant.ops`, so the numerics are the ones documented
there (``scale = amax / bound``, ``rint(x / scale)``, as ONNX QuantizeLinear);
where pytorch-quantization multiplies by ``bound / amax`` instead, results can
differ by one step at exact ties.
"""
from __future__ import annotations

import numbers
import warnings
from typing import Any, Optional, Tuple, Union

import torch

from .. import ops

__all__ = [
    "TensorQuantFunction",
    "FakeTensorQuantFunction",
    "FakeAffineTensorQuantFunction",
    "LegacyFakeTensorQuantFunction",
    "ScaledE4M3Function",
    "tensor_quant",
    "fake_tensor_quant",
    "fake_affine_tensor_quant",
    "legacy_fake_tensor_quant",
    "scaled_e4m3",
]

# --- functions ---------------------------------------------------------------

Amax = Union[torch.Tensor, float]


def _amax_like(amax: Amax, inputs: torch.Tensor) -> torch.Tensor:
    if not isinstance(inputs, torch.Tensor):
        raise TypeError(f"inputs must be a tensor, got {type(inputs).__name__}")
    if isinstance(amax, torch.Tensor):
        if amax.device == inputs.device:
            return amax
        if amax.device.type == "meta":  # (no data to move)
            raise ValueError(f"amax is on {amax.device} but inputs are on {inputs.device}")
        return amax.to(inputs.device)
    if isinstance(amax, bool) or not isinstance(amax, numbers.Real):
        raise TypeError(f"amax must be a tensor or a number, got {type(amax).__name__}")
    return torch.tensor(float(amax), dtype=torch.float32, device=inputs.device)


def fake_tensor_quant(
    inputs: torch.Tensor, amax: Amax, num_bits: int = 8, unsigned: bool = False, narrow_range: bool = True
) -> torch.Tensor:
    """Fake-quantizes ``inputs`` to ``num_bits`` with range ``[-amax, amax]``.

    ``amax`` is a number or a tensor broadcastable to ``inputs`` (its shape
    sets the granularity: ``(C, 1, 1, 1)`` is per output channel of a conv
    weight). The gradient passes where ``|inputs| <= amax`` (straight-through
    estimator with clipping); only a 1-bit mask is kept for the backward.
    """
    return ops.fake_quantize_amax(inputs, _amax_like(amax, inputs), num_bits, unsigned, narrow_range)


def legacy_fake_tensor_quant(
    inputs: torch.Tensor, amax: Amax, num_bits: int = 8, unsigned: bool = False, narrow_range: bool = True
) -> torch.Tensor:
    """pytorch-quantization's pure-PyTorch fake quantization, kept for its name:
    here it is the same operator as :func:`fake_tensor_quant`."""
    return fake_tensor_quant(inputs, amax, num_bits, unsigned, narrow_range)


def tensor_quant(
    inputs: torch.Tensor, amax: Amax, num_bits: int = 8, unsigned: bool = False, narrow_range: bool = True
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Quantizes ``inputs``: returns ``(outputs, scale)`` with integer-valued
    ``outputs`` (in ``inputs``' dtype) and pytorch-quantization's ``scale = bound / amax``
    (1 where amax is 0; the inverse of fakequant's scale ``amax / bound``) in ``inputs``'
    dtype, so that ``outputs / scale`` dequantizes.
    Differentiable in ``inputs`` (straight-through with clipping)."""
    outputs, inverse_scale = ops.quantize_amax(inputs, _amax_like(amax, inputs), num_bits, unsigned, narrow_range)
    return outputs, inverse_scale_in_input_dtype(inverse_scale, inputs, amax)


def inverse_scale_in_input_dtype(inverse_scale: torch.Tensor, inputs: torch.Tensor, amax: Amax) -> torch.Tensor:
    """``bound / amax`` (:func:`tensor_quant`'s and ``TensorQuantizer.scale``'s, pytorch-quantization's
    ``scale``) in ``inputs``' dtype; a ValueError where it overflows float16."""
    if inputs.dtype == torch.half and inverse_scale.device.type == "cpu" and bool((inverse_scale > 65504).any()):
        raise ValueError(f"scale is too large for FP16: the scale bound / amax overflows float16 for amax={amax}")
    return inverse_scale.to(inputs.dtype)


def scale_in_input_dtype(scale: torch.Tensor, inputs: torch.Tensor, amax: Amax) -> torch.Tensor:
    """Deprecated: :func:`inverse_scale_in_input_dtype` (in fakequant's names a scale is ``amax / bound``)."""
    warnings.warn("fakequant.tensor_quant.scale_in_input_dtype is now inverse_scale_in_input_dtype (in fakequant's "
                  "names a scale is amax / bound; this one is bound / amax)", DeprecationWarning, stacklevel=2)
    return inverse_scale_in_input_dtype(scale, inputs, amax)


def fake_affine_tensor_quant(
    inputs: torch.Tensor, min_range: Amax, max_range: Amax, num_bits: int = 8
) -> torch.Tensor:
    """Asymmetric fake quantization of ``inputs`` to ``2^num_bits`` levels over
    ``[min_range, max_range]``; the gradient passes inside the range."""
    return ops.fake_quantize_min_max(inputs, min_range, max_range, num_bits)


def _fp8_amax(amax: Optional[Amax], inputs: torch.Tensor, E: int, M: int) -> torch.Tensor:
    # amax None: scale 1, i.e. amax is the format's largest value.
    if amax is None:
        if not isinstance(inputs, torch.Tensor):
            raise TypeError(f"inputs must be a tensor, got {type(inputs).__name__}")
        return torch.tensor(ops.fp8_max(E, M), dtype=torch.float32, device=inputs.device)
    return _amax_like(amax, inputs)


def scaled_e4m3(inputs: torch.Tensor, amax: Optional[Amax] = None, E: int = 4, M: int = 3) -> torch.Tensor:
    """FP8 fake quantization of ``inputs`` with scale ``amax / 448``: the values of
    ``x / scale`` are saturated to [-448, 448] and rounded to FP8 E4M3 (to nearest
    even, as ``.to(torch.float8_e4m3fn)``), then multiplied back by the scale.

    ``amax`` is a number or a tensor broadcastable to ``inputs``; ``None`` means
    scale 1 (plain E4M3 rounding). ``E=5, M=2`` selects E5M2 (max 57344). Where
    ``amax <= 2^-24`` the output is 0. The gradient passes where ``|inputs| <= amax``
    (straight-through estimator with clipping); only a 1-bit mask is kept.
    """
    return ops.fake_quantize_fp8(inputs, _fp8_amax(amax, inputs, E, M), E, M)


# --- torch.autograd.Function classes -------------------------------------------
#
# pytorch-quantization exposes its functions as Function classes, and scripts call
# ``FakeTensorQuantFunction.apply(...)``. Here each is a thin Function over the
# same operator as the function of its name: the forward runs the operator and
# keeps the 1-bit mask it returns, the backward is the operator's own mask
# backward (fakequant.ops.mask_grad). Nothing is computed a second way.


def _output_and_mask(ctx: Any, result: Tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    y, mask = result
    ctx.save_for_backward(mask)
    ctx.output_stride = y.stride()
    return y


def _mask_grad(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
    (mask,) = ctx.saved_tensors
    return ops.mask_grad(grad, mask, ctx.output_stride)


class FakeTensorQuantFunction(torch.autograd.Function):
    """``apply(inputs, amax, num_bits=8, unsigned=False, narrow_range=True)``: :func:`fake_tensor_quant`."""

    @staticmethod
    def forward(
        ctx: Any, inputs: torch.Tensor, amax: Amax, num_bits: int = 8, unsigned: bool = False,
        narrow_range: bool = True,
    ) -> torch.Tensor:
        return _output_and_mask(ctx, ops.fake_quantize_amax(
            inputs, _amax_like(amax, inputs), num_bits, unsigned, narrow_range, return_mask=True))

    @staticmethod
    def backward(ctx: Any, grad_outputs: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:
        return _mask_grad(ctx, grad_outputs), None, None, None, None


class LegacyFakeTensorQuantFunction(FakeTensorQuantFunction):
    """``apply``: :func:`legacy_fake_tensor_quant` (the same operator)."""


class TensorQuantFunction(torch.autograd.Function):
    """``apply(inputs, amax, num_bits=8, unsigned=False, narrow_range=True)``: :func:`tensor_quant`."""

    @staticmethod
    def forward(
        ctx: Any, inputs: torch.Tensor, amax: Amax, num_bits: int = 8, unsigned: bool = False,
        narrow_range: bool = True,
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        amax = _amax_like(amax, inputs)
        outputs, inverse_scale, mask = ops.quantize_amax(inputs, amax, num_bits, unsigned, narrow_range,
                                                         return_mask=True)
        outputs = _output_and_mask(ctx, (outputs, mask))
        ctx.mark_non_differentiable(inverse_scale)
        return outputs, inverse_scale_in_input_dtype(inverse_scale, inputs, amax)

    @staticmethod
    def backward(
        ctx: Any, grad_outputs: torch.Tensor, grad_scale: Optional[torch.Tensor]
    ) -> Tuple[Optional[torch.Tensor], ...]:
        return _mask_grad(ctx, grad_outputs), None, None, None, None


class FakeAffineTensorQuantFunction(torch.autograd.Function):
    """``apply(inputs, min_range, max_range, num_bits=8)``: :func:`fake_affine_tensor_quant`."""

    @staticmethod
    def forward(ctx: Any, inputs: torch.Tensor, min_range: Amax, max_range: Amax, num_bits: int = 8) -> torch.Tensor:
        return _output_and_mask(ctx, ops.fake_quantize_min_max(inputs, min_range, max_range, num_bits,
                                                              return_mask=True))

    @staticmethod
    def backward(ctx: Any, grad_outputs: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:
        return _mask_grad(ctx, grad_outputs), None, None, None


class ScaledE4M3Function(torch.autograd.Function):
    """``apply(inputs, amax=None, E=4, M=3)``: :func:`scaled_e4m3`."""

    @staticmethod
    def forward(ctx: Any, inputs: torch.Tensor, amax: Optional[Amax] = None, E: int = 4, M: int = 3) -> torch.Tensor:
        return _output_and_mask(ctx, ops.fake_quantize_fp8(inputs, _fp8_amax(amax, inputs, E, M), E, M,
                                                          return_mask=True))

    @staticmethod
    def backward(ctx: Any, grad_outputs: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:
        return _mask_grad(ctx, grad_outputs), None, None, None
