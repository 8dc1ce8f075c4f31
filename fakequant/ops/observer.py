"""The fused moving-average observer and fake quantization (csrc/ops/observer.cpp), the drop-in
for ``torch.fused_moving_avg_obs_fake_quant``, and what TorchScript compiles of it and of the
affine operator."""
from typing import Optional

import torch

from .._core import check_bool, check_float, check_int, check_tensor, exporting, flag_on
from ..composite import compiled
from ._common import _check_meta, _new_mask, _ops, _raises_like_torch
from .affine import _affine, float_zero_point_rule
from .mask import mask_grad


# The op updates its buffers in place (running min/max, scale, zero point), and
# torch.library gives autograd formulas to functional ops only: the gradient
# (grad where the packed mask is set) is an autograd.Function around it, which
# torch.compile traces as well.


@torch.library.register_fake("fakequant::fused_moving_avg_obs_fake_quant")
def _(input, observer_on, fake_quant_on, running_min, running_max, scale, zero_point, averaging_const,
      quant_min, quant_max, ch_axis, per_row_fake_quant=False, symmetric_quant=False):
    _check_meta(input, observer_on=observer_on, fake_quant_on=fake_quant_on, running_min=running_min,
                running_max=running_max, scale=scale, zero_point=zero_point)
    y = torch.empty_like(input)
    return y, _new_mask(y)


class _FusedMovingAvgObsFakeQuant(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, *args):
        y, mask = _ops.fused_moving_avg_obs_fake_quant(input, *args)
        ctx.save_for_backward(mask)
        ctx.output_stride = y.stride()
        ctx.num_args = len(args)
        return y

    @staticmethod
    def backward(ctx, grad):
        (mask,) = ctx.saved_tensors
        if torch.compiler.is_compiling() and grad.device.type in compiled.FUSED_BACKWARD_DEVICE_TYPES:
            # (the selection in plain PyTorch, which Inductor fuses: fakequant.composite.compiled)
            return (compiled.masked_grad(grad, mask, ctx.output_stride),) + (None,) * ctx.num_args
        return (mask_grad(grad, mask, ctx.output_stride),) + (None,) * ctx.num_args


def fused_moving_avg_obs_fake_quant(
    input: torch.Tensor,
    observer_on: torch.Tensor,
    fake_quant_on: torch.Tensor,
    running_min: torch.Tensor,
    running_max: torch.Tensor,
    scale: torch.Tensor,
    zero_point: torch.Tensor,
    averaging_const: float,
    quant_min: int,
    quant_max: int,
    ch_axis: int,
    per_row_fake_quant: bool = False,
    symmetric_quant: bool = False,
) -> torch.Tensor:
    """Drop-in for ``torch.fused_moving_avg_obs_fake_quant`` (same signature): a moving-average
    min/max observer and fake quantization in one operator.

    Where ``observer_on`` (a one-element tensor) is nonzero, ``running_min``/``running_max``
    move toward this batch's min/max by ``averaging_const`` (taking the batch's while they are
    infinite); where ``fake_quant_on`` is nonzero, ``scale`` and ``zero_point`` are chosen from
    the running range (as torch's fused op chooses them, ``symmetric_quant`` its
    preserve-sparsity rule) and ``input`` is fake-quantized with them, else returned as is.
    Per tensor, or per channel of ``ch_axis`` with ``per_row_fake_quant`` (any axis; empty
    buffers are sized at the first call, as torch's are). The four buffers (float32, the zero
    point int32) are updated in place; the flags are read on the device, so nothing waits for
    it. The fake quantization follows fakequant's contract (``rint(x / scale)``), so it can
    differ from torch's by one step at exact ties. Differentiable in ``input``: the gradient
    passes where ``rint(x / scale) + zero_point`` lies in ``[quant_min, quant_max]``.

    ``torch.jit.script`` compiles it (a torch.ao ``FusedMovingAvgObsFakeQuantize`` whose
    ``torch.fused_moving_avg_obs_fake_quant`` is this function scripts):
    ``scripted_fused_moving_avg_obs_fake_quant``, the same outputs and buffers bit for bit.
    """
    if torch.jit.is_scripting():
        return scripted_fused_moving_avg_obs_fake_quant(
            input, observer_on, fake_quant_on, running_min, running_max, scale, zero_point, averaging_const,
            quant_min, quant_max, ch_axis, per_row_fake_quant, symmetric_quant)
    return _fused_moving_avg_obs_fake_quant(
        input, observer_on, fake_quant_on, running_min, running_max, scale, zero_point, averaging_const,
        quant_min, quant_max, ch_axis, per_row_fake_quant, symmetric_quant)


@torch.jit.unused
@_raises_like_torch
def _fused_moving_avg_obs_fake_quant(
    input: torch.Tensor,
    observer_on: torch.Tensor,
    fake_quant_on: torch.Tensor,
    running_min: torch.Tensor,
    running_max: torch.Tensor,
    scale: torch.Tensor,
    zero_point: torch.Tensor,
    averaging_const: float,
    quant_min: int,
    quant_max: int,
    ch_axis: int,
    per_row_fake_quant: bool,
    symmetric_quant: bool,
) -> torch.Tensor:
    """:func:`fused_moving_avg_obs_fake_quant` in eager code: the checks, then the operator."""
    input = check_tensor(input, "input")
    for name, t in (("observer_on", observer_on), ("fake_quant_on", fake_quant_on), ("running_min", running_min),
                    ("running_max", running_max), ("scale", scale), ("zero_point", zero_point)):
        check_tensor(t, name)
    averaging_const = check_float(averaging_const, "averaging_const")
    quant_min, quant_max = check_int(quant_min, "quant_min"), check_int(quant_max, "quant_max")
    ch_axis = check_int(ch_axis, "ch_axis")
    per_row_fake_quant = check_bool(per_row_fake_quant, "per_row_fake_quant")
    symmetric_quant = check_bool(symmetric_quant, "symmetric_quant")
    if exporting():
        # An exported graph is for inference: the observer neither observes nor updates
        # its buffers; the fake quantization with the current scale and zero point (where
        # fake_quant_on reads on: flag_on).
        if not flag_on(fake_quant_on):
            return input
        axis = ch_axis if per_row_fake_quant else None
        return _affine(input, scale, zero_point, axis, quant_min, quant_max, True)[0]
    if fake_quant_on is observer_on:  # one flag for both: torch.compile traces distinct inputs only
        fake_quant_on = fake_quant_on.clone()
    return _FusedMovingAvgObsFakeQuant.apply(
        input, observer_on, fake_quant_on, running_min, running_max, scale, zero_point, averaging_const,
        quant_min, quant_max, ch_axis, per_row_fake_quant, symmetric_quant)


# --- TorchScript: what torch.jit.script of fakequant.ao's modules compiles ---------------
# (torch.jit.script compiles these with the module; eager code calls the functions above)


def scripted_fake_quantize_affine(input: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor,
                                  axis: Optional[int], quant_min: int, quant_max: int) -> torch.Tensor:
    """The affine operator as TorchScript calls it (the C++ checks and autograd formula
    apply); a floating-point zero point per channel takes torch's rule for it, as
    :func:`fake_quantize_per_channel_affine`."""
    if axis is not None and zero_point.is_floating_point():
        axis = axis % max(input.dim(), 1)
        return float_zero_point_rule(input, scale, zero_point, axis, quant_min, quant_max)[0]
    return torch.ops.fakequant.fake_quantize_affine(input, scale, zero_point, axis, quant_min, quant_max, True)[0]


def scripted_fused_moving_avg_obs_fake_quant(
    input: torch.Tensor, observer_on: torch.Tensor, fake_quant_on: torch.Tensor, running_min: torch.Tensor,
    running_max: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor, averaging_const: float,
    quant_min: int, quant_max: int, ch_axis: int, per_row_fake_quant: bool, symmetric_quant: bool,
) -> torch.Tensor:
    """:func:`fused_moving_avg_obs_fake_quant` as TorchScript calls it: the fused operator
    observes and updates the buffers, then the affine operator (which has its gradient in
    TorchScript, unlike the fused one) fake-quantizes with the updated scale and zero point:
    the same output, by the same rule."""
    torch.ops.fakequant.fused_moving_avg_obs_fake_quant(
        input.detach(), observer_on, fake_quant_on, running_min, running_max, scale, zero_point, averaging_const,
        quant_min, quant_max, ch_axis, per_row_fake_quant, symmetric_quant)
    if bool(fake_quant_on.reshape(-1)[0] == 0):
        return input
    axis: Optional[int] = ch_axis if per_row_fake_quant else None
    return torch.ops.fakequant.fake_quantize_affine(input, scale, zero_point, axis, quant_min, quant_max, True)[0]
