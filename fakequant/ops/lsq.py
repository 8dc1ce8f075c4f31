"""Learned step size quantization (csrc/ops/lsq.cpp), and the drop-ins for torch's learnable
fake quantization built on it."""
import math
from typing import Optional

import torch

from .._core import check_float, check_int, check_tensor, lower_symbolically, refuse_untranslated
from ._common import TensorOrNumber, _SCALE, _ZERO_POINT, _as_tensor, _check_meta, _ops, _raises_like_torch


# Learned step size quantization (LSQ, Esser et al. 2020) and LSQ+ (Bhalgat et
# al. 2020, a learned zero point). The forward is fake_quantize_affine's output;
# the backward needs the input (not a one-bit mask), so input, scale and
# zero_point are saved. With r = rint(x / s) and inside = quant_min <= r + zp <= quant_max:
#   d input      = grad where inside, else 0;
#   d scale      = grad_factor * sum(grad * (r - x / s) inside, (quant_min - zp) below,
#                                   (quant_max - zp) above);
#   d zero_point = grad_factor * sum(grad * -s outside, 0 inside),
# per tensor or per channel. A NaN in input makes its channel's scale and zero-point
# gradients NaN (and passes no input gradient). fake_quantize_lsq_backward has no
# autograd formula: no double backward through LSQ.


@torch.library.register_fake("fakequant::fake_quantize_lsq")
def _(input, scale, zero_point, axis, quant_min, quant_max, grad_factor=1.0):
    refuse_untranslated("fake_quantize_lsq")
    _check_meta(input, scale=scale, zero_point=zero_point)
    return torch.empty_like(input)


@torch.library.register_fake("fakequant::fake_quantize_lsq_backward")
def _(grad, input, scale, zero_point, axis, quant_min, quant_max, grad_factor):
    _check_meta(input, scale=scale, zero_point=zero_point, grad=grad)
    _check_meta(grad, "grad")
    if grad.shape != input.shape:
        raise ValueError(f"fakequant: grad must have input's shape {tuple(input.shape)}, got {tuple(grad.shape)}")
    if grad.dtype != input.dtype:
        raise TypeError(f"fakequant: grad must have input's dtype {input.dtype}, got {grad.dtype}")
    grad_scale = torch.empty(scale.shape, dtype=torch.float32, device=scale.device)
    grad_zero_point = torch.empty(zero_point.shape, dtype=torch.float32, device=zero_point.device)
    return torch.empty_like(input), grad_scale, grad_zero_point


def fake_quantize_lsq(
    input: torch.Tensor,
    scale: TensorOrNumber,
    zero_point: TensorOrNumber = 0,
    axis: Optional[int] = None,
    quant_min: int = -128,
    quant_max: int = 127,
    grad_factor: Optional[float] = None,
) -> torch.Tensor:
    """Fake quantization with a learned step size (LSQ) and, with a floating-point
    ``zero_point`` tensor, a learned zero point (LSQ+).

    The output is :func:`fake_quantize_affine`'s. ``scale`` is a number or a float
    tensor of one element (``axis=None``) or ``input.size(axis)`` elements; it gets the
    LSQ gradient. ``zero_point`` is an integer (tensor or number; fixed) or a float
    tensor (learned): a float zero point is rounded to the nearest integer and clamped
    into ``[quant_min, quant_max]`` with a straight-through estimator (its gradient
    passes unchanged). ``grad_factor`` scales both parameter gradients; ``None`` is
    LSQ's ``1 / sqrt(n * quant_max)`` with ``n`` the number of elements per scale
    value (``quant_max`` taken as at least 1). That default depends on the input's size,
    so ``torch.compile(dynamic=True)`` compiles once per size unless ``grad_factor`` is
    given.
    """
    input = check_tensor(input, "input")
    (scale,) = _SCALE(input, scale)
    axis = check_int(axis, "axis", optional=True)
    quant_min, quant_max = check_int(quant_min, "quant_min"), check_int(quant_max, "quant_max")
    if isinstance(zero_point, torch.Tensor) and zero_point.is_floating_point():
        # Value: the rounded, clamped zero point exactly (r + 0); gradient: identity.
        rounded = zero_point.detach().round().clamp(quant_min, quant_max)
        zero_point = rounded + (zero_point - zero_point.detach())
    elif isinstance(zero_point, torch.Tensor):
        zero_point = _as_tensor(zero_point, input, torch.int32, "zero_point")
    else:  # a number: one zero point for every channel of scale
        zero_point = _ZERO_POINT(input, zero_point)[0].expand(scale.shape)
    if grad_factor is None:
        n = input.numel()
        if axis is not None and -input.dim() <= axis < input.dim() and input.size(axis) > 0:
            n //= input.size(axis)
        # (under torch.compile with dynamic shapes n may be symbolic: no float() of it here)
        grad_factor = 1.0 / math.sqrt(max(n, 1) * max(quant_max, 1))
    else:
        grad_factor = check_float(grad_factor, "grad_factor")
    lowered = lower_symbolically("fake_quantize_lsq", input, scale, zero_point, axis, quant_min, quant_max,
                                 grad_factor)
    if lowered is not None:
        return lowered
    return _ops.fake_quantize_lsq(input, scale, zero_point, axis, quant_min, quant_max, grad_factor)


def _learnable_params(scale: torch.Tensor, zero_point: torch.Tensor) -> None:
    # torch's learnable ops take float tensors for both (the zero point is learned).
    for name, t in (("scale", scale), ("zero_point", zero_point)):
        check_tensor(t, name)
        if not t.is_floating_point():
            raise TypeError(f"fakequant: {name} must be a floating-point tensor, got {t.dtype}")


@_raises_like_torch
def _fake_quantize_learnable_per_tensor_affine(
    input: torch.Tensor,
    scale: torch.Tensor,
    zero_point: torch.Tensor,
    quant_min: int,
    quant_max: int,
    grad_factor: float = 1.0,
) -> torch.Tensor:
    """Drop-in for ``torch._fake_quantize_learnable_per_tensor_affine`` (same signature):
    LSQ+ with a learned scale and zero point (one-element float tensors), the parameter
    gradients times ``grad_factor``. :func:`fake_quantize_lsq` underneath, so float16 and
    bfloat16 inputs work too; the zero point rounds half to even and clamps into the
    range, its gradient passing straight through that rounding."""
    _learnable_params(scale, zero_point)
    if scale.numel() != 1 or zero_point.numel() != 1:
        raise ValueError(
            "fakequant: scale and zero_point must have one element each, got "
            f"{scale.numel()} and {zero_point.numel()}"
        )
    return fake_quantize_lsq(input, scale.reshape(()), zero_point.reshape(()), None, quant_min, quant_max,
                             grad_factor)


@_raises_like_torch
def _fake_quantize_learnable_per_channel_affine(
    input: torch.Tensor,
    scale: torch.Tensor,
    zero_point: torch.Tensor,
    axis: int,
    quant_min: int,
    quant_max: int,
    grad_factor: float = 1.0,
) -> torch.Tensor:
    """Drop-in for ``torch._fake_quantize_learnable_per_channel_affine`` (same signature):
    as :func:`_fake_quantize_learnable_per_tensor_affine`, one scale and zero point per
    index of ``axis``."""
    _learnable_params(scale, zero_point)
    return fake_quantize_lsq(input, scale, zero_point, check_int(axis, "axis"), quant_min, quant_max,
                             grad_factor)
