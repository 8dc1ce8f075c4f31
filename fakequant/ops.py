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
The amax-family functions take ``check_values=False`` for an amax that fakequant
computed itself from the input (a quantizer's dynamic amax): it is not user
input, so it is never checked, and a NaN or infinite one (from NaN or inf in the
input) gives NaN outputs and a zero mask, on every device.
On CUDA, pass scale/zero_point/amax as device tensors: a Python number becomes
a host-to-device copy on every call (and cannot be captured in a CUDA graph).
"""
import functools
import math
import numbers
from typing import Any, Callable, Dict, Literal, Optional, Sequence, Tuple, TypeVar, Union, cast, overload

import torch

from ._core import (
    AMAX_EPSILON,
    BLOCK_FLOAT_FORMATS,
    FP8_FORMATS,
    MAX_NUM_BITS,
    MIN_NUM_BITS,
    amax_bound,
    check_bool,
    check_float,
    check_fp8_format,
    check_int,
    check_integer_num_bits,
    check_tensor,
    exporting,
    flag_on,
    lower_symbolically,
    refuse_untranslated,
)
from . import _composite, reference
from ._core.errors import TypeAndRuntimeError, ValueAndRuntimeError

__all__ = [
    "fake_quantize_affine",
    "fake_quantize_per_tensor_affine",
    "fake_quantize_per_channel_affine",
    "fake_quantize_per_tensor_affine_cachemask",
    "fake_quantize_per_channel_affine_cachemask",
    "_fake_quantize_learnable_per_tensor_affine",
    "_fake_quantize_learnable_per_channel_affine",
    "fake_quant",
    "fake_quant_grad",
    "fake_quantize_amax",
    "quantize_amax",
    "fake_quantize_min_max",
    "fake_quantize_fp8",
    "fp8_max",
    "mask_backward",
    "mask_grad",
    "unpack_mask",
    "amax_bound",
    "fake_quantize_blockwise",
    "fake_quantize_lsq",
    "fused_moving_avg_obs_fake_quant",
]

_ops = torch.ops.fakequant
TensorOrNumber = Union[torch.Tensor, float, int]


def _as_tensor(value: TensorOrNumber, like: torch.Tensor, dtype: torch.dtype, name: str) -> torch.Tensor:
    """A tensor as is, or a Python number as a new tensor on like's device."""
    if isinstance(value, torch.Tensor):
        return value
    kind = type(value)
    if kind is not float and kind is not int and (kind is bool or not isinstance(value, numbers.Real)):
        raise TypeError(f"fakequant: {name} must be a tensor or a number, got {type(value).__name__}")
    if not dtype.is_floating_point:  # zero points: integers within int32
        if not (math.isfinite(value) and value == int(value) and -(2**31) <= value < 2**31):
            raise ValueError(f"fakequant: {name} must be an integer in the int32 range, got {value!r}")
        value = int(value)
    return torch.tensor(value, dtype=dtype, device=like.device)


class _Params:
    """An operator's parameters (scale and zero point, amax, ...) as the tensors it takes:
    tensors as they are, Python numbers made tensors once per (values, device) rather than
    on every call (a tensor each, and on CUDA a host-to-device copy that a CUDA graph
    cannot capture). The operators only read them. Each cache is emptied when it reaches
    MAX_CACHED entries."""

    MAX_CACHED = 1024

    def __init__(self, *params: Tuple[str, torch.dtype]) -> None:
        self.params = params  # (name, dtype) each
        self.cache: Dict[Tuple[Any, ...], Tuple[torch.Tensor, ...]] = {}

    def __call__(self, like: torch.Tensor, *values: TensorOrNumber) -> Tuple[torch.Tensor, ...]:
        key = None
        # Not when traced, fake or under a dispatch mode: a tensor of that world instead.
        if type(like) is torch.Tensor and not torch.compiler.is_compiling() and not torch._C._len_torch_dispatch_stack():
            for v in values:
                if type(v) is not float and type(v) is not int:
                    break
            else:
                # (0.0 and -0.0 are one key: the rules treat them alike for every parameter)
                key = values + (like.device,)
                cached = self.cache.get(key)
                if cached is not None:
                    return cached
        if key is None:
            return self._make(like, values)
        # Normal tensors even under inference_mode: LSQ saves its scale for backward,
        # which an inference tensor cannot be.
        with torch.inference_mode(False):
            made = self._make(like, values)
        if len(self.cache) >= self.MAX_CACHED:
            self.cache.clear()
        self.cache[key] = made
        return made

    def _make(self, like: torch.Tensor, values: Tuple[TensorOrNumber, ...]) -> Tuple[torch.Tensor, ...]:
        return tuple(_as_tensor(v, like, dtype, name) for v, (name, dtype) in zip(values, self.params))


_F = TypeVar("_F", bound=Callable[..., Any])


def _raises_like_torch(fn: _F) -> _F:
    """For the replacements of torch's functions: a bad argument raises an exception that
    is both fakequant's type and torch's (RuntimeError), so ``except RuntimeError`` in code
    written for torch still catches it (ValueAndRuntimeError, TypeAndRuntimeError)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except RuntimeError:
            raise
        except ValueError as e:
            raise ValueAndRuntimeError(*e.args) from e
        except TypeError as e:
            raise TypeAndRuntimeError(*e.args) from e

    return cast(_F, wrapper)  # (the same signature: functools.wraps)


_SCALE_ZERO_POINT = _Params(("scale", torch.float32), ("zero_point", torch.int32))
_SCALE = _Params(("scale", torch.float32))
_ZERO_POINT = _Params(("zero_point", torch.int32))
_AMAX = _Params(("amax", torch.float32))
_SCALE_AMAX = _Params(("scale_amax", torch.float32))
_MIN_MAX = _Params(("min_range", torch.float32), ("max_range", torch.float32))


# --- fake kernels: shapes, dtypes and strides without computing -------------
# They run under torch.compile/export tracing, and for tensors on the meta
# device, where the C++ checks do not: the cheap metadata checks are repeated.

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def _check_meta(input: torch.Tensor, input_name: str = "input", /, **params: torch.Tensor) -> None:
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
    refuse_untranslated("fake_quantize_affine")
    _check_meta(input, scale=scale, zero_point=zero_point)
    y = torch.empty_like(input)
    return y, _new_mask(y, pack_mask)


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


@torch.library.register_fake("fakequant::fake_quantize_min_max")
def _(input, min_range, max_range, num_bits=8):
    refuse_untranslated("fake_quantize_min_max")
    _check_meta(input, min_range=min_range, max_range=max_range)
    y = torch.empty_like(input)
    return y, _new_mask(y)


@torch.library.register_fake("fakequant::mask_backward")
def _(grad, mask, mask_strides=None):
    _check_meta(grad, "grad", mask=mask)
    if mask_strides is None:
        return torch.empty_like(grad)
    return torch.empty_strided(grad.shape, mask_strides, dtype=grad.dtype, device=grad.device)


# --- autograd ------------------------------------------------------------------
# The formulas are C++ (csrc/ops/autograd.cpp, under the Autograd key): the
# gradient of every op returning (output, mask) is mask_backward(grad, mask,
# output.stride()), mask_backward's own is itself, and LSQ's is
# fake_quantize_lsq_backward's.


def mask_grad(grad: torch.Tensor, mask: torch.Tensor, output_stride: Sequence[int]) -> torch.Tensor:
    """The backward of an operator: ``grad`` where its ``mask`` is set, else 0, laid
    out with ``output_stride``, the stride of the operator's output, whose memory
    order a packed mask follows."""
    return _ops.mask_backward(grad, mask, list(output_stride))


# --- public functions --------------------------------------------------------


def _first(
    result: Tuple[torch.Tensor, torch.Tensor], return_mask: bool
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """An operator's ``(output, mask)``, or its output alone."""
    return result if return_mask else result[0]


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
    if pack_mask and _composite.active():  # the callers with pack_mask=True take the output only
        _check_meta(input, scale=scale, zero_point=zero_point)
        return _composite.fake_quantize_affine(input, scale, zero_point, axis, quant_min, quant_max), None
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
    (:func:`fakequant.reference.fake_quantize_affine_float_zero_point`); an ONNX export
    writes that arithmetic (no QDQ pair holds a fractional zero point).
    """
    if isinstance(zero_point, torch.Tensor) and zero_point.is_floating_point():
        return _float_zero_point(input, scale, zero_point, axis, quant_min, quant_max, False)
    # (an int, as torch's op takes: None would be per tensor in _affine)
    return _affine(input, scale, zero_point, check_int(axis, "axis"), quant_min, quant_max, True)[0]


def float_zero_point_rule(input: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor, axis: int,
                          quant_min: int, quant_max: int, gradient: bool = True) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(y, bool mask)`` of torch's rule for a floating-point zero point
    (:func:`fakequant.reference.fake_quantize_affine_float_zero_point`; ``axis`` >= 0), the
    gradient passing where the mask is set. Plain PyTorch (it serves torch.ao's float-qparams
    embeddings, which save the bool mask), so that TorchScript compiles it too.
    ``gradient=False`` (an export): the values alone."""
    y, mask = reference.fake_quantize_affine_float_zero_point(input, scale, zero_point, axis, quant_min, quant_max)
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
    index of ``axis``."""
    if isinstance(zero_point, torch.Tensor) and zero_point.is_floating_point():
        return _float_zero_point(input, scale, zero_point, axis, quant_min, quant_max, True)
    input = check_tensor(input, "input")
    scale = _as_tensor(check_tensor(scale, "scale"), input, torch.float32, "scale")
    zero_point = _as_tensor(check_tensor(zero_point, "zero_point"), input, torch.int32, "zero_point")
    axis = check_int(axis, "axis")
    quant_min, quant_max = check_int(quant_min, "quant_min"), check_int(quant_max, "quant_max")
    return _affine(input, scale, zero_point, axis, quant_min, quant_max, False)


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
    if not return_mask and _composite.active():
        _check_meta(input, amax=amax)
        return _composite.fake_quantize_amax(input, amax, num_bits, unsigned, narrow_range, check_values)
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
    dtype) and the scale ``bound / amax`` they were multiplied by (1 where
    ``amax <= 2^-24``), so that ``output / scale`` dequantizes; and the packed
    mask third with ``return_mask=True``. ``check_values`` as in
    :func:`fake_quantize_amax`."""
    input, amax, num_bits, check_values = _amax_args(input, amax, num_bits, check_values)
    lowered = lower_symbolically("quantize_amax", input, amax, num_bits, unsigned, narrow_range, check_values)
    output, mask = lowered if lowered is not None else _ops.quantize_amax(input, amax, num_bits, unsigned,
                                                                          narrow_range, check_values)
    amax32 = amax.float()
    bound = float(amax_bound(num_bits, unsigned))
    scale = torch.where(amax32 <= AMAX_EPSILON, torch.ones_like(amax32), bound / amax32)
    return (output, scale, mask) if return_mask else (output, scale)


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
    if not return_mask and _composite.active():
        _check_meta(input, min_range=min_range, max_range=max_range)
        return _composite.fake_quantize_min_max(input, min_range, max_range, num_bits)
    return _first(_ops.fake_quantize_min_max(input, min_range, max_range, num_bits), return_mask)


# === FP8: fake_quantize_fp8 (owner: the FP8 work; edit only inside this section) ===

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
    if not return_mask and _composite.active():
        _check_meta(input, amax=amax)
        return _composite.fake_quantize_fp8(input, amax, exponent_bits, mantissa_bits, check_values)
    return _first(_ops.fake_quantize_fp8(input, amax, exponent_bits, mantissa_bits, check_values), return_mask)


# === end FP8 ===


# === block-wise: fake_quantize_blockwise (edit only inside this section) ===

def _check_blockwise_args(
    block_size: int,
    num_bits: int,
    unsigned: bool,
    exponent_bits: int,
    scale_amax: Optional[torch.Tensor],
    e8m0_scale: bool = False,
) -> None:
    # The C++ checks (csrc/include/fakequant/arg_checks.h), repeated for the fake kernel.
    if block_size < 1:
        raise ValueError(f"fakequant: block_size must be >= 1, got {block_size}")
    if exponent_bits == 0:
        check_integer_num_bits(num_bits)
    else:
        if (num_bits, exponent_bits) not in BLOCK_FLOAT_FORMATS:
            raise ValueError(
                "fakequant: (num_bits, exponent_bits) must be (4, 2) for E2M1, (6, 3) for E3M2, (6, 2) for "
                "E2M3, (8, 4) for E4M3 or (8, 5) for E5M2 (or exponent_bits 0 for integers), got "
                f"({num_bits}, {exponent_bits})"
            )
        if unsigned:
            raise ValueError(
                f"fakequant: unsigned must be False for floating-point elements (exponent_bits {exponent_bits})"
            )
    if e8m0_scale and scale_amax is not None:
        raise ValueError("fakequant: scale_amax (E4M3 block scales) cannot be combined with e8m0_scale=True")
    if e8m0_scale and unsigned:
        raise ValueError("fakequant: unsigned must be False with e8m0_scale=True (microscaling elements are signed)")
    if scale_amax is not None:
        if not scale_amax.dtype.is_floating_point:
            raise TypeError(f"fakequant: scale_amax must be a floating-point tensor, got {scale_amax.dtype}")
        if scale_amax.numel() != 1:
            raise ValueError(
                f"fakequant: scale_amax must have one element, got {scale_amax.numel()} "
                f"(shape {list(scale_amax.shape)})"
            )


def _blockwise_keeps_layout(input: torch.Tensor) -> bool:
    """Whether the block-wise output keeps input's strides (csrc/blockwise_args.h): the
    tensor is non-overlapping and dense and its rows (the last dimension) are runs of
    memory. Otherwise the kernels work on a contiguous copy and the output is contiguous."""
    if input.dim() > 0 and input.size(-1) > 1 and input.stride(-1) != 1:
        return False
    # is_non_overlapping_and_dense: the dimensions of size > 1, by stride, pack densely.
    dims = sorted((input.stride(d), input.size(d)) for d in range(input.dim()) if input.size(d) > 1)
    expected = 1
    for stride, size in dims:
        if stride != expected:
            return False
        expected *= size
    return True


@torch.library.register_fake("fakequant::fake_quantize_blockwise")
def _(input, block_size, num_bits=8, unsigned=False, narrow_range=True, exponent_bits=0, scale_amax=None,
      check_values=True, e8m0_scale=False, centered=False):
    refuse_untranslated("fake_quantize_blockwise")
    _check_meta(input, **({} if scale_amax is None else {"scale_amax": scale_amax}))
    _check_blockwise_args(block_size, num_bits, unsigned, exponent_bits, scale_amax, e8m0_scale)
    y = torch.empty_like(input) if _blockwise_keeps_layout(input) else input.new_empty(input.shape)
    return y, _new_mask(y)


def fake_quantize_blockwise(
    input: torch.Tensor,
    block_size: int,
    num_bits: int = 8,
    unsigned: bool = False,
    narrow_range: bool = True,
    exponent_bits: int = 0,
    scale_amax: Optional[TensorOrNumber] = None,
    axis: int = -1,
    *,
    check_values: bool = True,
    e8m0_scale: bool = False,
    centered: bool = False,
) -> torch.Tensor:
    """Block-wise dynamic fake quantization: blocks of ``block_size`` consecutive
    elements along ``axis`` (the last block of each row may be shorter), each
    with its own scale ``amax / elem_max``, ``amax = max |x|`` over the block.

    Elements are integers (``exponent_bits=0``: ``num_bits``, ``unsigned`` and
    ``narrow_range`` as in :func:`fake_quantize_amax`) or small floats:
    ``(num_bits, exponent_bits)`` = (4, 2) for E2M1 (max 6), (6, 3) for E3M2 (28),
    (6, 2) for E2M3 (7.5), (8, 4) for E4M3 (448), (8, 5) for E5M2 (57344).

    ``e8m0_scale=True``: the OCP microscaling (MX) scales, powers of two
    ``2^(floor(log2(amax)) - emax)`` with ``emax`` the element format's largest
    exponent (E2M1 2, E3M2 4, E2M3 2, E4M3 8, E5M2 15; ``num_bits - 2`` for
    integers, so that 8-bit integers are MXINT8's ``k * 2^-6``), the exponent clamped
    to [-127, 127]. The floor (the specification's rule) can put a block's largest
    elements above the format's max; they saturate and their mask bit is 0. Such
    blocks have no degenerate case: an all-zero block gives zeros, a tiny one keeps
    its values. MXFP8 is ``block_size=32, num_bits=8, exponent_bits=4, e8m0_scale=True``,
    MXFP4 ``32, 4, 2``, MXINT8 ``32, 8, 0``.

    ``centered=True``: each block is quantized about its centre ``b = max / 2 + min / 2``
    (float32): ``y = q(x - b) + b``, with the block's amax that of ``x - b`` (asymmetric
    quantization as Model Optimizer's dynamic ``"max_min"`` bias computes it; with
    ``block_size`` the row length, per-token asymmetric activations). A block whose
    ``x - b`` is degenerate gives ``b``. With ``scale_amax`` (one element, >= 0) the
    block scales are themselves rounded to E4M3 against the per-tensor scale
    ``scale_amax / (elem_max * 448)``: NVFP4 is ``block_size=16, num_bits=4,
    exponent_bits=2, scale_amax=x.abs().amax()``. Blocks with amax <= 2^-24 (or
    a zero scale) give 0. A block holding NaN gives NaN; one holding +-inf has
    an infinite one-level scale, which makes its outputs NaN.

    The gradient passes where rounding did not saturate (the straight-through
    estimator with clipping): ``rint(x / scale)`` inside the integer range, or
    ``|x / scale|`` at most the float format's max plus half its top step. (So a
    block's own maximum always keeps its gradient, even where ``amax / scale``
    rounds just above the bound in float32.) Other axes than the last are moved last (a copy
    when that makes the rows strided) and back. ``check_values=False``: ``scale_amax`` was
    computed by fakequant from the input (see :func:`fake_quantize_amax`).
    """
    input = check_tensor(input, "input")
    block_size = check_int(block_size, "block_size")
    num_bits = check_integer_num_bits(num_bits)
    exponent_bits = check_int(exponent_bits, "exponent_bits")
    axis = check_int(axis, "axis")
    check_values = check_bool(check_values, "check_values")
    e8m0_scale = check_bool(e8m0_scale, "e8m0_scale")
    centered = check_bool(centered, "centered")
    if scale_amax is not None:
        (scale_amax,) = _SCALE_AMAX(input, scale_amax)
    nd = max(input.dim(), 1)
    if not -nd <= axis < nd:
        raise IndexError(f"fakequant: axis {axis} is out of range for input with {input.dim()} dimensions")
    axis %= nd
    moved = input.dim() > 1 and axis != input.dim() - 1
    x = input.movedim(axis, -1) if moved else input
    lowered = lower_symbolically("fake_quantize_blockwise", x, block_size, num_bits, unsigned, narrow_range,
                                 exponent_bits, scale_amax, check_values, e8m0_scale, centered)
    if lowered is not None:
        y = lowered[0]
    elif _composite.active():
        _check_meta(x, **({} if scale_amax is None else {"scale_amax": scale_amax}))
        _check_blockwise_args(block_size, num_bits, unsigned, exponent_bits, scale_amax, e8m0_scale)
        y = _composite.fake_quantize_blockwise(x, block_size, num_bits, unsigned, narrow_range, exponent_bits,
                                               scale_amax, check_values, e8m0_scale, centered)
    else:
        y = _ops.fake_quantize_blockwise(x, block_size, num_bits, unsigned, narrow_range, exponent_bits, scale_amax,
                                         check_values, e8m0_scale, centered)[0]
    return y.movedim(-1, axis) if moved else y


# === end block-wise ===


# === LSQ: fake_quantize_lsq, fake_quantize_lsq_backward (edit only inside this section) ===

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


# === end LSQ ===


# === fused observer: fused_moving_avg_obs_fake_quant ===

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
        return (mask_grad(grad, mask, ctx.output_stride),) + (None,) * ctx.num_args


@_raises_like_torch
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
    """
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


# === end fused observer ===
