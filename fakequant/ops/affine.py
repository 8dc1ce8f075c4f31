"""The affine family (csrc/ops/affine.cpp): scale and zero point given, per tensor or per
channel; the drop-ins for torch's ``fake_quantize_per_*_affine`` (and ``_cachemask``), torch's
rule for a floating-point zero point, and ONNX Runtime's ``FakeQuant``."""
from typing import Literal, Optional, Tuple, overload

import torch

from .._core import check_int, check_tensor, exporting, lower_symbolically, refuse_untranslated
from ..composite import compiled, rules
from .._core.errors import ValueAndRuntimeError
from ._common import (
    TensorOrNumber,
    _SCALE_ZERO_POINT,
    _as_tensor,
    _check_meta,
    _new_mask,
    _ops,
    _raises_like_torch,
)


@torch.library.register_fake("fakequant::fake_quantize_affine")
def _(input, scale, zero_point, axis, quant_min, quant_max, pack_mask=True):
    refuse_untranslated("fake_quantize_affine")
    _check_meta(input, scale=scale, zero_point=zero_point)
    y = torch.empty_like(input)
    return y, _new_mask(y, pack_mask)


def fake_quantize_affine(
    input: torch.Tensor,
    scale: TensorOrNumber,
    zero_point: TensorOrNumber,
    axis: Optional[int] = None,
    quant_min: int = -128,
    quant_max: int = 127,
) -> torch.Tensor:
    """Affine fake quantization, per-tensor (``axis=None``) or per-channel along ``axis``.

    ``scale`` and ``zero_point`` hold one element, or ``input.size(axis)``;
    zero points are integers (int tensors or integral floats) in
    ``[quant_min, quant_max]``. Differentiable in ``input``.
    """
    return _affine(input, scale, zero_point, axis, quant_min, quant_max, True)[0]


@overload
def _affine(
    input: torch.Tensor,
    scale: TensorOrNumber,
    zero_point: TensorOrNumber,
    axis: Optional[int],
    quant_min: int,
    quant_max: int,
    pack_mask: Literal[True],
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]: ...


@overload
def _affine(
    input: torch.Tensor,
    scale: TensorOrNumber,
    zero_point: TensorOrNumber,
    axis: Optional[int],
    quant_min: int,
    quant_max: int,
    pack_mask: Literal[False],
) -> Tuple[torch.Tensor, torch.Tensor]: ...


def _affine(
    input: torch.Tensor,
    scale: TensorOrNumber,
    zero_point: TensorOrNumber,
    axis: Optional[int],
    quant_min: int,
    quant_max: int,
    pack_mask: bool,
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """fake_quantize_affine's operator after the checks Python makes (the others are
    C++'s). They run on every call: arguments of the usual types skip the checkers."""
    if not (isinstance(input, torch.Tensor) and type(quant_min) is int and type(quant_max) is int
            and (axis is None or type(axis) is int)):
        input = check_tensor(input, "input")
        axis = check_int(axis, "axis", optional=True)
        quant_min, quant_max = check_int(quant_min, "quant_min"), check_int(quant_max, "quant_max")
    if not (isinstance(scale, torch.Tensor) and isinstance(zero_point, torch.Tensor)):
        scale, zero_point = _SCALE_ZERO_POINT(input, scale, zero_point)
    lowered = lower_symbolically("fake_quantize_affine", input, scale, zero_point, axis, quant_min, quant_max,
                                 pack_mask)
    if lowered is not None:  # (a plain torch.onnx.export: the ONNX nodes)
        return lowered
    if pack_mask and compiled.active(input):  # the callers with pack_mask=True take the output only
        _check_meta(input, scale=scale, zero_point=zero_point)
        return compiled.fake_quantize_affine(input, scale, zero_point, axis, quant_min, quant_max), None
    if pack_mask and compiled.fuses_backward(input):
        return compiled.apply_packed(
            lambda t: _ops.fake_quantize_affine(t, scale, zero_point, axis, quant_min, quant_max, True), input), None
    return _ops.fake_quantize_affine(input, scale, zero_point, axis, quant_min, quant_max, pack_mask)


@_raises_like_torch
def fake_quantize_per_tensor_affine(
    input: torch.Tensor,
    scale: TensorOrNumber,
    zero_point: TensorOrNumber,
    quant_min: int,
    quant_max: int,
) -> torch.Tensor:
    """Drop-in for ``torch.fake_quantize_per_tensor_affine`` (same signature).

    Follows fakequant's contract (``rint(x / scale)``, as ONNX QuantizeLinear),
    so it can differ from torch's (which multiplies by ``1 / scale``) by one
    step where ``x / scale`` is within rounding of a tie.
    """
    return _affine(input, scale, zero_point, None, quant_min, quant_max, True)[0]


# The scale dtypes torch's per-channel functions take (their check: "Scale must be Float or
# BFloat16"; float16 and float64 raise RuntimeError). fakequant.fake_quantize_affine takes any.
_TORCH_PER_CHANNEL_SCALE_DTYPES = (torch.float32, torch.bfloat16)


def _check_torch_per_channel_scale(scale: TensorOrNumber) -> None:
    if isinstance(scale, torch.Tensor) and scale.dtype not in _TORCH_PER_CHANNEL_SCALE_DTYPES:
        raise TypeError(f"fakequant: scale must be a float32 or bfloat16 tensor, as torch's per-channel fake "
                        f"quantization takes, got {scale.dtype} (torch: Scale must be Float or BFloat16); "
                        "fakequant.fake_quantize_affine takes any floating-point scale")


@_raises_like_torch
def fake_quantize_per_channel_affine(
    input: torch.Tensor,
    scale: torch.Tensor,
    zero_point: torch.Tensor,
    axis: int,
    quant_min: int,
    quant_max: int,
) -> torch.Tensor:
    """Drop-in for ``torch.fake_quantize_per_channel_affine`` (same signature).

    An integer ``zero_point`` tensor follows fakequant's contract. A floating-point one
    follows torch's rule for that case, as torch does whatever its values (torch.ao's
    float qparams, zero points with fractions such as 127.336): the zero point is added
    before rounding, ``(clamp(rint(x / s + zp), quant_min, quant_max) - zp) * s``
    (:func:`fakequant.composite.rules.fake_quantize_affine_float_zero_point`); an ONNX export
    writes that arithmetic (no QDQ pair holds a fractional zero point).

    ``scale`` is float32 or bfloat16, as torch's takes (TypeError and RuntimeError otherwise).
    """
    _check_torch_per_channel_scale(scale)
    if isinstance(zero_point, torch.Tensor) and zero_point.is_floating_point():
        return _float_zero_point(input, scale, zero_point, axis, quant_min, quant_max, False)
    # (an int, as torch's op takes: None would be per tensor in _affine)
    return _affine(input, scale, zero_point, check_int(axis, "axis"), quant_min, quant_max, True)[0]


def float_zero_point_rule(input: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor, axis: int,
                          quant_min: int, quant_max: int, gradient: bool = True) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(y, bool mask)`` of torch's rule for a floating-point zero point
    (:func:`fakequant.composite.rules.fake_quantize_affine_float_zero_point`; ``axis`` >= 0), the
    gradient passing where the mask is set. Plain PyTorch (it serves torch.ao's float-qparams
    embeddings, which save the bool mask), so that TorchScript compiles it too.
    ``gradient=False`` (an export): the values alone."""
    y, mask = rules.fake_quantize_affine_float_zero_point(input, scale, zero_point, axis, quant_min, quant_max)
    if gradient and input.requires_grad:
        # value: y (input - input is +0 where the mask is set); gradient: the mask's
        y = y + torch.where(mask, input - input.detach(), torch.zeros_like(input))
    return y, mask


def _float_zero_point(input, scale, zero_point, axis, quant_min, quant_max, return_mask):
    """torch's per-channel rule for a floating-point zero point: checks, then the rule
    (inside an autograd function; as the plain arithmetic while an exporter traces)."""
    input = check_tensor(input, "input")
    scale = check_tensor(scale, "scale")
    axis = check_int(axis, "axis")
    quant_min, quant_max = check_int(quant_min, "quant_min"), check_int(quant_max, "quant_max")
    _check_meta(input, scale=scale, zero_point=zero_point)
    if not -input.dim() <= axis < max(input.dim(), 1):
        raise IndexError(f"fakequant: axis {axis} is out of range for input with {input.dim()} dimensions")
    axis %= max(input.dim(), 1)
    channels = input.size(axis) if input.dim() else 1
    for name, t in (("scale", scale), ("zero_point", zero_point)):
        if t.numel() != channels:
            raise ValueAndRuntimeError(f"fakequant: {name} must have {channels} elements (input.size({axis})), "
                                       f"got {t.numel()}")
    if quant_min > quant_max:
        raise ValueAndRuntimeError(f"fakequant: quant_min ({quant_min}) must be <= quant_max ({quant_max})")
    if scale.device.type == "cpu" and not torch.compiler.is_compiling() and not exporting():
        # (values are read on the host for CPU tensors only: no device synchronisation)
        s32 = scale.detach().float()
        if not bool(((s32 > 0) & s32.isfinite()).all()):
            raise ValueAndRuntimeError(f"fakequant: scale must be positive and finite, got {scale.tolist()}")
        if not bool(zero_point.detach().isfinite().all()):
            raise ValueAndRuntimeError(f"fakequant: zero_point must be finite, got {zero_point.tolist()}")
    y, mask = float_zero_point_rule(input, scale, zero_point, axis, quant_min, quant_max, not exporting())
    return (y, mask) if return_mask else y


@_raises_like_torch
def fake_quantize_per_tensor_affine_cachemask(
    input: torch.Tensor,
    scale: TensorOrNumber,
    zero_point: TensorOrNumber,
    quant_min: int,
    quant_max: int,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Drop-in for ``torch.fake_quantize_per_tensor_affine_cachemask``: ``(output, mask)``,
    the mask a bool tensor shaped like ``output`` (True where ``rint(x / scale) + zero_point``
    lies in ``[quant_min, quant_max]``). ``output`` is differentiable in ``input`` (gradient
    where the mask is set); scale and zero point may be numbers or one-element tensors."""
    return _affine(input, scale, zero_point, None, quant_min, quant_max, False)


@_raises_like_torch
def fake_quantize_per_channel_affine_cachemask(
    input: torch.Tensor,
    scale: torch.Tensor,
    zero_point: torch.Tensor,
    axis: int,
    quant_min: int,
    quant_max: int,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Drop-in for ``torch.fake_quantize_per_channel_affine_cachemask``: ``(output, bool mask)``
    as :func:`fake_quantize_per_tensor_affine_cachemask`, one scale and zero point per
    index of ``axis`` (``scale`` float32 or bfloat16, as torch's takes)."""
    _check_torch_per_channel_scale(scale)
    if isinstance(zero_point, torch.Tensor) and zero_point.is_floating_point():
        return _float_zero_point(input, scale, zero_point, axis, quant_min, quant_max, True)
    input = check_tensor(input, "input")
    scale = _as_tensor(check_tensor(scale, "scale"), input, torch.float32, "scale")
    zero_point = _as_tensor(check_tensor(zero_point, "zero_point"), input, torch.int32, "zero_point")
    axis = check_int(axis, "axis")
    quant_min, quant_max = check_int(quant_min, "quant_min"), check_int(quant_max, "quant_max")
    return _affine(input, scale, zero_point, axis, quant_min, quant_max, False)


def fake_quant(
    x: torch.Tensor,
    scale: TensorOrNumber,
    zero_point: TensorOrNumber,
    quant_min: int,
    quant_max: int,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """ONNX Runtime's training ``FakeQuant`` contract: ``(y, mask)`` with a bool
    mask shaped like ``y`` (True where ``rint(x / scale) + zero_point`` lies in
    range). Pair with :func:`fake_quant_grad`."""
    return _affine(check_tensor(x, "x"), scale, zero_point, None, quant_min, quant_max, False)
