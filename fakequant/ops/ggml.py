"""llama.cpp's Q8_0 and Q4_0 blocks as fake quantization (the GGUF presets' weights and inputs).

These follow llama.cpp's rule, not the library's numerics contract (docs/design.md): the
codes come from multiplying by the reciprocal of a float32 block scale and rounding halves
away from zero (Q8_0) or adding 8.5 and truncating (Q4_0), and the values from the scale
rounded to float16, as the GGUF file stores it. The rule is written once, in plain PyTorch
(:func:`fakequant.composite.rules.fake_quantize_ggml`); this function checks the arguments and
gives it the straight-through gradient of every other operator (the mask of the rule, kept
as a bool tensor). There is no C++ kernel:
the rule is a handful of elementwise passes, and llama.cpp's (not ONNX's) is the target, so an
ONNX export of it is refused.
"""
import torch

from ..composite import rules
from .._core import GGML_BLOCK_TYPES, check_int, check_tensor
from ._common import along_last_axis

__all__ = ["fake_quantize_ggml"]


class _GGMLBlocks(torch.autograd.Function):
    """The rule's output; the gradient of x where its mask is set, else 0."""

    @staticmethod
    def forward(ctx, x, block_size, num_bits):
        y, mask = rules.fake_quantize_ggml(x, block_size, num_bits)
        ctx.save_for_backward(mask)
        return y

    @staticmethod
    def backward(ctx, grad):
        (mask,) = ctx.saved_tensors
        return torch.where(mask, grad, torch.zeros((), dtype=grad.dtype, device=grad.device)), None, None


def fake_quantize_ggml(input: torch.Tensor, block_size: int = 32, num_bits: int = 8, axis: int = -1) -> torch.Tensor:
    """Fake quantization to llama.cpp's blocks: ``num_bits=8`` is Q8_0 (codes -127..127), ``4``
    is Q4_0 (codes -8..7), blocks of ``block_size`` consecutive elements along ``axis`` (32 in
    GGUF files; a row's last block may be shorter), one float16 scale each. The output equals
    ``gguf.quants.dequantize(gguf.quants.quantize(x, type), type)`` bit for bit (the sign of zero
    included) for float32 ``x`` whose rows are multiples of 32; other dtypes compute in float32
    and round the result once to their own. The rule: :func:`fakequant.composite.rules.fake_quantize_ggml`.

    The gradient passes where the element did not saturate (only Q4_0 saturates: elements of
    the sign opposite to the block's largest one, beyond 7.5 steps) and the output is finite.
    """
    input = check_tensor(input, "input")
    if not input.is_floating_point():
        raise TypeError(f"fakequant: input must be a floating-point tensor, got {input.dtype}")
    block_size = check_int(block_size, "block_size")
    if block_size < 1:
        raise ValueError(f"fakequant: block_size must be >= 1, got {block_size}")
    num_bits = check_int(num_bits, "num_bits")
    if num_bits not in GGML_BLOCK_TYPES:
        raise ValueError(f"fakequant: num_bits must be one of {sorted(GGML_BLOCK_TYPES)} "
                         f"({GGML_BLOCK_TYPES}), got {num_bits}")
    axis = check_int(axis, "axis")
    if torch.onnx.is_in_onnx_export():  # (either exporter; the rule costs far more than this check)
        raise RuntimeError("fakequant: llama.cpp's Q8_0/Q4_0 blocks (fake_quantize_ggml, the GGUF presets) have no "
                           "ONNX form; a GGUF model is exported with fakequant.serve.gguf.export_gguf")
    return along_last_axis(input, axis, lambda x: _GGMLBlocks.apply(x, block_size, num_bits))
