"""A Linear weight quantizer read as the scales and codes a checkpoint stores, shared by the
formats that store codes and scales: its amax (static, learned or the weight's) per tensor,
per output channel or per group of input features, and the codes of its output divided by
the scales (the rule's codes, ``fakequant.composite.rules.element_codes``), the scales asked of the
rule from amax to scales (``fakequant.composite.rules.block_scales``): one level (:func:`one_level`)
or NVFP4's two (:func:`nvfp4`, by the rule of the quantizer's ``target``)."""
from __future__ import annotations

from typing import Any, NamedTuple, Optional, Tuple

import torch

from ..composite import rules
from .._core import BlockScales
from ._base import ServingFormat

__all__ = ["check_common", "codes_of", "expand", "group_amax", "last_axis_block", "nvfp4", "NVFP4Scales", "one_level",
           "per_row_or_tensor_amax", "static_amax", "tensor_amax_of_blocks"]


def check_common(fmt: ServingFormat, where: str, q: Any) -> None:
    """Refuses the parts of a quantizer no format stores: unsigned ranges, a pre_quant_scale,
    asymmetric blocks."""
    if q.unsigned:
        raise fmt.refuse(where, "an unsigned range: the format's integers and floats are signed")
    if q.pre_quant_scale is not None:
        raise fmt.refuse(where, "a pre_quant_scale (the format has no per-channel input scaling)")
    if q.centered:
        raise fmt.refuse(where, "asymmetric ('max_min' bias) blocks: the format's zero points round another way")


def static_amax(q: Any) -> Optional[torch.Tensor]:
    """The quantizer's amax when it is fixed (calibrated, set, or learned: the larger
    magnitude of its clip bounds), else None (computed per input)."""
    if q.learn_amax:
        low, high = (b.detach().float().cpu().reshape(()) for b in q.clip.bounds())
        return torch.maximum(-low, high)
    amax = q.amax
    return None if amax is None or q.dynamic else amax.detach().float().cpu()


def tensor_amax_of_blocks(q: Any) -> Optional[torch.Tensor]:
    """The per-tensor amax that E4M3 block scales are relative to (``BlockScales.E4M3``), when
    calibrated or set (dynamic blocks read it too); None when each input gives its own."""
    amax = q.amax
    return None if amax is None or amax.numel() != 1 else amax.detach().float().cpu().reshape(())


def last_axis_block(q: Any, ndim: int) -> Optional[Tuple[bool, Optional[int]]]:
    """``(True, size)`` when the quantizer's blocks run along the last axis only (size None:
    the whole axis); None when it has no blocks; ``(False, None)`` for other layouts."""
    blocks = q.block_sizes
    if blocks is None:
        return None
    if len(blocks) != 1:
        return False, None
    (axis, size), = blocks.items()
    return (axis in (-1, ndim - 1)), size


def per_row_or_tensor_amax(fmt: ServingFormat, where: str, q: Any, w: torch.Tensor) -> Tuple[torch.Tensor, str]:
    """amax of a per-tensor (shape (1,)) or per-output-channel (shape (out, 1)) weight quantizer,
    and which of the two (``"tensor"``, ``"channel"``)."""
    axis = q.axis
    static = static_amax(q)
    if axis is None:
        amax = static if static is not None else w.abs().amax()
        if amax.numel() != 1:
            raise fmt.refuse(where, f"an amax of shape {tuple(amax.shape)} with axis=None")
        return amax.reshape(1), "tensor"
    if axis in (0, -2):
        amax = static if static is not None else w.abs().amax(dim=1)
        if amax.numel() != w.shape[0]:
            raise fmt.refuse(where, f"an amax of shape {tuple(amax.shape)} for {w.shape[0]} output channels")
        return amax.reshape(-1, 1), "channel"
    raise fmt.refuse(where, f"axis={axis!r}: the format's scales are per tensor, per output channel (axis 0) "
                            "or per group of input features")


def group_amax(fmt: ServingFormat, where: str, q: Any, w: torch.Tensor, size: int) -> torch.Tensor:
    """amax per group of ``size`` input features, shape (out, in / size)."""
    out_f, in_f = w.shape
    if in_f % size:
        raise fmt.refuse(where, f"blocks of {size} along {in_f} input features (the format's groups divide the "
                                "input features exactly)")
    static = static_amax(q)
    if static is not None and static.numel() == out_f * (in_f // size):
        return static.reshape(out_f, in_f // size)
    if static is not None and not (q.scale_format is BlockScales.E4M3 and static.numel() == 1):
        raise fmt.refuse(where, f"a static block amax of shape {tuple(static.shape)}")
    return w.reshape(out_f, in_f // size, size).abs().amax(dim=-1)


def expand(scale: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """A (1,), (out, 1) or (out, groups) scale broadcast over the weight's elements."""
    if scale.dim() == 2 and scale.shape[1] not in (1, w.shape[1]):
        return scale.repeat_interleave(w.shape[1] // scale.shape[1], dim=1)
    return scale


def codes_of(q: Any, y: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The rule's codes of ``y``, the quantizer's output in float32, divided by ``scale`` (y / s is
    within an ulp of a code; where s is 0, a degenerate block, the code is y's, keeping its sign)."""
    num_bits, exponent_bits = rules.block_element(q.num_bits)
    s = expand(scale, y)
    divided = torch.where(s == 0, y, y / torch.where(s == 0, torch.ones_like(s), s))
    return rules.element_codes(divided, num_bits, False, q.narrow_range, exponent_bits)[0]


def one_level(fmt: ServingFormat, where: str, q: Any, w: torch.Tensor, y: torch.Tensor, size: Optional[int]
              ) -> Tuple[torch.Tensor, torch.Tensor, str]:
    """(scales, codes, ``"tensor"``, ``"channel"`` or ``"group"``) of a weight quantizer with one
    level of scales, s = fp32(amax) / bound (int: 2^(b-1) - 1, E4M3: 448; amax <= 2^-24 gives 0),
    per tensor or output channel (``size`` None) or per group of ``size`` input features; ``y``:
    the quantizer's output on the float32 weight ``w``."""
    if size is None:
        amax, strategy = per_row_or_tensor_amax(fmt, where, q, w)
    else:
        amax, strategy = group_amax(fmt, where, q, w, size), "group"
    num_bits, exponent_bits = rules.block_element(q.num_bits)
    scale = rules.block_scales(amax, num_bits, False, exponent_bits).scale
    return scale, codes_of(q, y, scale), strategy


class NVFP4Scales(NamedTuple):
    """NVFP4 weights read as a checkpoint stores them (:func:`nvfp4`)."""

    #: the E2M1 codes (float32 values)
    codes: torch.Tensor
    #: the E4M3 block scales (float8_e4m3fn; 0 in a degenerate block)
    block_codes: torch.Tensor
    #: the float32 per-tensor scale: g, which multiplies the block codes (the library's rule,
    #: ``target="onnx"``), or G, which divides them (vLLM's, ``target="vllm"``): ``divides`` says which
    global_scale: torch.Tensor
    divides: bool


def nvfp4(fmt: ServingFormat, where: str, q: Any, w: torch.Tensor, y: torch.Tensor, size: int) -> NVFP4Scales:
    """The codes and scales of NVFP4 weights from the rule the quantizer trained with (its
    ``target``), relative to ``scale_amax``: the calibrated per-tensor amax, else the weight's.
    ``target="onnx"`` (``rules.block_scales``): s = e4m3(fp32(amax / 6) / g) * g with g =
    fp32(scale_amax) / (6 * 448); ``target="vllm"`` (``rules.vllm_block_scales``):
    s = fp32(e4m3(G * fp32(amax / 6)) / G) with G = fp32(6 * 448 / scale_amax)."""
    amax = group_amax(fmt, where, q, w, size)
    scale_amax = tensor_amax_of_blocks(q)
    scale_amax = w.abs().amax() if scale_amax is None else scale_amax
    num_bits, exponent_bits = rules.block_element(q.num_bits)
    divides = q.target == "vllm"
    if divides:
        values = rules.vllm_block_scales(amax, num_bits, exponent_bits, BlockScales.E4M3, scale_amax)
    else:
        values = rules.block_scales(amax, num_bits, False, exponent_bits, BlockScales.E4M3, scale_amax)
    scale, degenerate, block_codes, global_scale = values
    assert global_scale is not None  # (two levels)
    codes = codes_of(q, y, torch.where(degenerate, torch.zeros_like(scale), scale))
    block_codes = torch.where(degenerate, torch.zeros_like(block_codes), block_codes).to(torch.float8_e4m3fn)
    return NVFP4Scales(codes, block_codes, global_scale.reshape(()), divides)
