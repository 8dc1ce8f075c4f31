"""vLLM's activation rules as fake quantization (``quantize_model(target="vllm")``).

The rules are written once, in plain PyTorch (``fakequant.composite.rules``: ``vllm_round_int8_rows``,
``vllm_round_fp8_reciprocal``, ``vllm_fake_quantize_blocks``); this module gives them the
straight-through gradient of every other operator (the rule's mask: the gradient of x passes
where the element did not saturate). There is no C++ kernel: they differ from the library's
contract (multiplying by a rounded reciprocal, a floor on the scale, scales rounded to the
nearest power of two, a dividing global scale), and vLLM, not ONNX, is their target, so an ONNX
export of them is refused.
"""
from typing import Any, Callable, Optional, Tuple

import torch

from ..composite import rules
from ._common import along_last_axis

__all__ = ["round_int8_rows", "round_fp8_reciprocal", "fake_quantize_blocks"]


class _StraightThrough(torch.autograd.Function):
    """``rule(x, *args)``'s output; the gradient of x where its mask is set, else 0."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, rule: Callable[..., Tuple[torch.Tensor, torch.Tensor]],
                *args: Any) -> torch.Tensor:
        y, mask = rule(x, *args)
        ctx.save_for_backward(mask)
        ctx.nargs = len(args)
        return y

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:
        (mask,) = ctx.saved_tensors
        out = torch.where(mask, grad, torch.zeros((), dtype=grad.dtype, device=grad.device))
        return (out, None) + (None,) * ctx.nargs


def _refuse_onnx() -> None:
    if torch.onnx.is_in_onnx_export():
        raise RuntimeError("fakequant: vLLM's activation rules (quantize_model(target='vllm')) have no ONNX form; "
                           "such a model is served from fakequant.export_checkpoint's compressed-tensors checkpoint")


def round_int8_rows(input: torch.Tensor, axis: int = -1) -> torch.Tensor:
    """Per-token int8 as vLLM's kernel computes it (:func:`fakequant.composite.rules.vllm_round_int8_rows`),
    one scale per row along ``axis``."""
    _refuse_onnx()
    return along_last_axis(input, axis, lambda x: _StraightThrough.apply(x, rules.vllm_round_int8_rows))


def round_fp8_reciprocal(input: torch.Tensor, amax: torch.Tensor) -> torch.Tensor:
    """Per-tensor FP8 E4M3 as vLLM's kernel computes it (:func:`fakequant.composite.rules.vllm_round_fp8_reciprocal`)."""
    _refuse_onnx()
    return _StraightThrough.apply(input, rules.vllm_round_fp8_reciprocal, amax.detach())


def fake_quantize_blocks(input: torch.Tensor, block_size: int, num_bits: int, exponent_bits: int,
                         scale_format: Any = None, scale_amax: Optional[torch.Tensor] = None,
                         axis: int = -1) -> torch.Tensor:
    """Dynamic blocks along ``axis`` with vLLM's (compressed-tensors') scales
    (:func:`fakequant.composite.rules.vllm_fake_quantize_blocks`)."""
    _refuse_onnx()
    sa = None if scale_amax is None else torch.as_tensor(scale_amax).detach()
    return along_last_axis(input, axis, lambda x: _StraightThrough.apply(
        x, rules.vllm_fake_quantize_blocks, block_size, num_bits, exponent_bits, scale_format, sa))
