"""Typed wrappers of the ``torch.ops.fakequant`` operators, with their fake
(meta) kernels and autograd formulas. This is the only module that touches
``torch.ops.fakequant``; everything else in fakequant calls these functions.

Every operator follows one contract (see the README): with ``s`` the float32
scale, ``xq = rint(x / s) + zp`` (IEEE division, ties to even),
``y = (clamp(xq, quant_min, quant_max) - zp) * s`` computed in float32 (float64
for float64 inputs) and rounded once to the input's dtype. The backward is the
straight-through estimator with clipping: the gradient passes where the
forward's mask is set and is 0 elsewhere. The mask is saved at one bit per
element.

Invalid parameter values (scale <= 0, amax < 0, ...) raise ValueError for CPU
tensors. Checking them on CUDA tensors needs a device synchronisation, so there
they are checked only with the environment variable FAKEQUANT_CHECK_VALUES=1
(read at the first CUDA call); otherwise an invalid value gives NaN outputs.
On CUDA, pass scale/zero_point/amax as device tensors: a Python number becomes
a host-to-device copy on every call (and cannot be captured in a CUDA graph).
"""
import math
import numbers
from typing import Optional, Sequence, Tuple, Union

import torch

from . import _extension  # noqa: F401  (loads the library)

__all__ = [
    "fake_quantize_affine",
    "fake_quantize_per_tensor_affine",
    "fake_quantize_per_channel_affine",
    "fake_quant",
    "fake_quant_grad",
    "fake_quantize_amax",
    "quantize_amax",
    "fake_quantize_min_max",
    "mask_backward",
    "unpack_mask",
    "amax_bound",
]

_ops = torch.ops.fakequant
TensorOrNumber = Union[torch.Tensor, float, int]


def _check_tensor(value, name: str) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"fakequant: {name} must be a torch.Tensor, got {type(value).__name__}")
    return value


def _check_int(value, name: str, optional: bool = False):
    if optional and value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"fakequant: {name} must be an int, got {value!r}")
    return int(value)


def _as_tensor(value: TensorOrNumber, like: torch.Tensor, dtype: torch.dtype, name: str) -> torch.Tensor:
    """A tensor as is, or a Python number as a tensor on like's device."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"fakequant: {name} must be a tensor or a number, got {type(value).__name__}")
    if not dtype.is_floating_point:  # zero points: integers within int32
        if not (math.isfinite(value) and value == int(value) and -(2**31) <= value < 2**31):
            raise ValueError(f"fakequant: {name} must be an integer in the int32 range, got {value!r}")
        value = int(value)
    return torch.tensor(value, dtype=dtype, device=like.device)


def amax_bound(num_bits: int, unsigned: bool = False) -> int:
    """The largest integer of the amax family's range: 2^(num_bits - 1 + unsigned) - 1."""
    return 2 ** (num_bits - 1 + int(unsigned)) - 1


# --- fake kernels: shapes, dtypes and strides without computing -------------
# They run under torch.compile/export tracing, and for tensors on the meta
# device, where the C++ checks do not: the cheap metadata checks are repeated.

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def _check_meta(input: torch.Tensor, input_name: str = "input", **params: torch.Tensor) -> None:
    if input.dtype not in _FLOAT_DTYPES:
        raise TypeError(
            f"fakequant: {input_name} must be float32, float16, bfloat16 or float64, got {input.dtype}"
        )
    for name, t in params.items():
        if t.device != input.device:
            raise ValueError(
                f"fakequant: {name} is on {t.device} but {input_name} is on {input.device}; "
                "both must be on the same device"
            )


def _new_mask(y: torch.Tensor, packed: bool = True) -> torch.Tensor:
    if packed:
        return y.new_empty(((y.numel() + 7) // 8,), dtype=torch.uint8)
    return torch.empty_like(y, dtype=torch.bool)


@torch.library.register_fake("fakequant::fake_quantize_affine")
def _(input, scale, zero_point, axis, quant_min, quant_max, pack_mask=True):
    _check_meta(input, scale=scale, zero_point=zero_point)
    y = torch.empty_like(input)
    return y, _new_mask(y, pack_mask)


@torch.library.register_fake("fakequant::fake_quantize_amax")
def _(input, amax, num_bits=8, unsigned=False, narrow_range=True):
    _check_meta(input, amax=amax)
    y = torch.empty_like(input)
    return y, _new_mask(y)


@torch.library.register_fake("fakequant::quantize_amax")
def _(input, amax, num_bits=8, unsigned=False, narrow_range=True):
    _check_meta(input, amax=amax)
    y = torch.empty_like(input)
    return y, _new_mask(y)


@torch.library.register_fake("fakequant::fake_quantize_min_max")
def _(input, min_range, max_range, num_bits=8):
    _check_meta(input, min_range=min_range, max_range=max_range)
    y = torch.empty_like(input)
    return y, _new_mask(y)


@torch.library.register_fake("fakequant::mask_backward")
def _(grad, mask):
    _check_meta(grad, "grad", mask=mask)
    return torch.empty_like(grad)


# --- autograd: grad * mask, with the mask saved by the forward ---------------


def _with_output_strides(grad: torch.Tensor, stride: Sequence[int]) -> torch.Tensor:
    # A packed mask follows the forward output's memory order; an incoming
    # gradient laid out otherwise (expanded from a sum, say) is laid out anew.
    if tuple(grad.stride()) == tuple(stride):
        return grad
    return torch.empty_strided(grad.shape, stride, dtype=grad.dtype, device=grad.device).copy_(grad)


def _save_mask(ctx, inputs, output):
    y, mask = output
    # The mask output has no gradient: do not allocate zeros for it (the
    # backward takes None for either output).
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(mask)
    ctx.output_stride = y.stride()
    ctx.num_inputs = len(inputs)


def _backward_through_mask(ctx, grad_output, grad_mask):
    (mask,) = ctx.saved_tensors
    grad_input = None
    if grad_output is not None:
        if mask.dtype == torch.uint8:
            grad_output = _with_output_strides(grad_output, ctx.output_stride)
        grad_input = _ops.mask_backward(grad_output, mask)
    return (grad_input,) + (None,) * (ctx.num_inputs - 1)


for _name in ("fake_quantize_affine", "fake_quantize_amax", "quantize_amax", "fake_quantize_min_max"):
    torch.library.register_autograd(
        f"fakequant::{_name}", _backward_through_mask, setup_context=_save_mask
    )


def _save_mask_of_backward(ctx, inputs, output):
    ctx.save_for_backward(inputs[1])


def _backward_of_mask_backward(ctx, grad):
    (mask,) = ctx.saved_tensors
    return _ops.mask_backward(grad, mask), None


torch.library.register_autograd(
    "fakequant::mask_backward", _backward_of_mask_backward, setup_context=_save_mask_of_backward
)


# --- public functions --------------------------------------------------------


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
    input = _check_tensor(input, "input")
    scale = _as_tensor(scale, input, torch.float32, "scale")
    zero_point = _as_tensor(zero_point, input, torch.int32, "zero_point")
    axis = _check_int(axis, "axis", optional=True)
    quant_min, quant_max = _check_int(quant_min, "quant_min"), _check_int(quant_max, "quant_max")
    return _ops.fake_quantize_affine(input, scale, zero_point, axis, quant_min, quant_max)[0]


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
    return fake_quantize_affine(input, scale, zero_point, None, quant_min, quant_max)


def fake_quantize_per_channel_affine(
    input: torch.Tensor,
    scale: torch.Tensor,
    zero_point: torch.Tensor,
    axis: int,
    quant_min: int,
    quant_max: int,
) -> torch.Tensor:
    """Drop-in for ``torch.fake_quantize_per_channel_affine`` (same signature).

    Zero points must be integers (torch also takes fractional float zero
    points, which no integer QDQ graph can represent).
    """
    return fake_quantize_affine(input, scale, zero_point, axis, quant_min, quant_max)


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
    x = _check_tensor(x, "x")
    scale = _as_tensor(scale, x, torch.float32, "scale")
    zero_point = _as_tensor(zero_point, x, torch.int32, "zero_point")
    quant_min, quant_max = _check_int(quant_min, "quant_min"), _check_int(quant_max, "quant_max")
    return _ops.fake_quantize_affine(x, scale, zero_point, None, quant_min, quant_max, False)


def fake_quant_grad(dy: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """ONNX Runtime's ``FakeQuantGrad``: ``dy`` where ``mask``, else 0."""
    return _ops.mask_backward(dy, mask)


def mask_backward(grad: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``grad`` where ``mask`` else 0; ``mask`` is a bool tensor shaped like
    ``grad`` or a packed mask as returned by the ``torch.ops.fakequant`` ops."""
    return _ops.mask_backward(grad, mask)


def unpack_mask(mask: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
    """The bool mask, shaped and laid out like ``output``, of a packed mask that
    an operator returned with ``output``."""
    n = output.numel()
    shifts = torch.arange(8, device=mask.device, dtype=torch.uint8)
    bits = ((mask.unsqueeze(-1) >> shifts) & 1).flatten()[:n].bool()
    unpacked = torch.empty_like(output, dtype=torch.bool)
    # Bit i belongs to element i in memory order, which is output's (dense) layout.
    unpacked.as_strided((n,), (1,)).copy_(bits)
    return unpacked


class _FakeQuantizeAmaxPassThrough(torch.autograd.Function):
    # Pass-through STE (no clipping), as modelopt's pass_through_bwd.
    @staticmethod
    def forward(ctx, input, amax, num_bits, unsigned, narrow_range):
        return _ops.fake_quantize_amax(input, amax, num_bits, unsigned, narrow_range)[0]

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None, None, None


def fake_quantize_amax(
    input: torch.Tensor,
    amax: TensorOrNumber,
    num_bits: int = 8,
    unsigned: bool = False,
    narrow_range: bool = True,
    pass_through: bool = False,
) -> torch.Tensor:
    """pytorch-quantization's ``fake_tensor_quant``: scale ``amax / bound``.

    ``amax`` is a number or a tensor broadcastable to ``input`` (per-channel
    amax keeps the channel axes with size > 1). Where ``amax <= 2^-24`` the
    output is 0. The gradient passes where ``|x| <= amax`` (or everywhere with
    ``pass_through=True``).
    """
    input = _check_tensor(input, "input")
    amax = _as_tensor(amax, input, torch.float32, "amax")
    num_bits = _check_int(num_bits, "num_bits")
    if pass_through:
        return _FakeQuantizeAmaxPassThrough.apply(input, amax, num_bits, unsigned, narrow_range)
    return _ops.fake_quantize_amax(input, amax, num_bits, unsigned, narrow_range)[0]


def quantize_amax(
    input: torch.Tensor,
    amax: TensorOrNumber,
    num_bits: int = 8,
    unsigned: bool = False,
    narrow_range: bool = True,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """pytorch-quantization's ``tensor_quant``: the integer values (in input's
    dtype) and the scale ``bound / amax`` they were multiplied by (1 where
    ``amax <= 2^-24``), so that ``output / scale`` dequantizes."""
    input = _check_tensor(input, "input")
    amax = _as_tensor(amax, input, torch.float32, "amax")
    num_bits = _check_int(num_bits, "num_bits")
    output = _ops.quantize_amax(input, amax, num_bits, unsigned, narrow_range)[0]
    amax32 = amax.float()
    bound = float(amax_bound(num_bits, unsigned))
    scale = torch.where(amax32 <= 2.0**-24, torch.ones_like(amax32), bound / amax32)
    return output, scale


def fake_quantize_min_max(
    input: torch.Tensor,
    min_range: TensorOrNumber,
    max_range: TensorOrNumber,
    num_bits: int = 8,
) -> torch.Tensor:
    """pytorch-quantization's ``fake_affine_tensor_quant``: an asymmetric range
    ``[min_range, max_range]`` on ``2^num_bits`` levels. The gradient passes
    where ``min_range <= x <= max_range``."""
    input = _check_tensor(input, "input")
    min_range = _as_tensor(min_range, input, torch.float32, "min_range")
    max_range = _as_tensor(max_range, input, torch.float32, "max_range")
    num_bits = _check_int(num_bits, "num_bits")
    return _ops.fake_quantize_min_max(input, min_range, max_range, num_bits)[0]
