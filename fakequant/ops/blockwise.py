"""Block-wise dynamic fake quantization (csrc/ops/blockwise.cpp): integer and small-float
elements, microscaling (E8M0) and NVFP4 (E4M3) block scales."""
from typing import Optional

import torch

from .._core import (
    BLOCK_FLOAT_FORMATS,
    check_bool,
    check_int,
    check_integer_num_bits,
    check_tensor,
    lower_symbolically,
    refuse_untranslated,
)
from ..composite import compiled
from ._common import TensorOrNumber, _SCALE_AMAX, _check_meta, _new_mask, _ops, along_last_axis


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
    """Whether the block-wise output keeps input's strides (csrc/include/fakequant/arg_checks.h): the
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

    def rule(x: torch.Tensor) -> torch.Tensor:
        lowered = lower_symbolically("fake_quantize_blockwise", x, block_size, num_bits, unsigned, narrow_range,
                                     exponent_bits, scale_amax, check_values, e8m0_scale, centered)
        if lowered is not None:
            return lowered[0]
        if compiled.active(x):
            _check_meta(x, **({} if scale_amax is None else {"scale_amax": scale_amax}))
            _check_blockwise_args(block_size, num_bits, unsigned, exponent_bits, scale_amax, e8m0_scale)
            return compiled.fake_quantize_blockwise(x, block_size, num_bits, unsigned, narrow_range, exponent_bits,
                                                      scale_amax, check_values, e8m0_scale, centered)
        if compiled.fuses_backward(x):
            return compiled.apply_packed(
                lambda t: _ops.fake_quantize_blockwise(t, block_size, num_bits, unsigned, narrow_range, exponent_bits,
                                                       scale_amax, check_values, e8m0_scale, centered), x)
        return _ops.fake_quantize_blockwise(x, block_size, num_bits, unsigned, narrow_range, exponent_bits,
                                            scale_amax, check_values, e8m0_scale, centered)[0]

    return along_last_axis(input, axis, rule)
