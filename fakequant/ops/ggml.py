"""llama.cpp's Q8_0 and Q4_0 blocks as fake quantization (the GGUF presets' weights and inputs).

These follow llama.cpp's rule, not the library's numerics contract (docs/design.md): the
codes come from multiplying by the reciprocal of a float32 block scale and rounding halves
away from zero (Q8_0) or adding 8.5 and truncating (Q4_0), and the values from the scale
rounded to float16, as the GGUF file stores it. The operator ``fake_quantize_ggml``
(csrc/ops/ggml.cpp; its rule in csrc/include/fakequant/ggml.h, one pass with a one-bit mask)
computes what :func:`fakequant.composite.rules.fake_quantize_ggml` states in plain PyTorch, bit
for bit; the gradient is the straight-through one of every other operator (where the mask is
set). llama.cpp's (not ONNX's) is the target, so an ONNX export of it is refused.
"""
import torch

from ..composite import compiled, rules
from .._core import GGML_BLOCK_TYPES, check_int, check_tensor, refuse_untranslated
from ._common import _FLOAT_DTYPES, _check_meta, _new_mask, _ops, along_last_axis
from .blockwise import _blockwise_keeps_layout

__all__ = ["fake_quantize_ggml"]


# The C++ checks (csrc/include/fakequant/arg_checks.h, check_ggml_args), repeated for the
# wrapper and the fake kernel.
def _check_block_size(block_size: int) -> None:
    if block_size < 1:
        raise ValueError(f"fakequant: block_size must be >= 1, got {block_size}")


def _check_num_bits(num_bits: int) -> None:
    if num_bits not in GGML_BLOCK_TYPES:
        raise ValueError(f"fakequant: num_bits must be one of {sorted(GGML_BLOCK_TYPES)} "
                         f"({GGML_BLOCK_TYPES}), got {num_bits}")


@torch.library.register_fake("fakequant::fake_quantize_ggml")
def _(input, block_size=32, num_bits=8):
    refuse_untranslated("fake_quantize_ggml")
    _check_meta(input)
    _check_block_size(block_size)
    _check_num_bits(num_bits)
    y = torch.empty_like(input) if _blockwise_keeps_layout(input) else input.new_empty(input.shape)
    return y, _new_mask(y)


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
    _check_block_size(block_size)
    num_bits = check_int(num_bits, "num_bits")
    _check_num_bits(num_bits)
    axis = check_int(axis, "axis")
    if torch.onnx.is_in_onnx_export():  # (either exporter)
        raise RuntimeError("fakequant: llama.cpp's Q8_0/Q4_0 blocks (fake_quantize_ggml, the GGUF presets) have no "
                           "ONNX form; a GGUF model is exported with fakequant.serve.gguf.export_gguf")

    def rule(x: torch.Tensor) -> torch.Tensor:
        # The composite under torch.compile's "composite" path, and for floating dtypes the
        # operator does not take (float8: the rule computes in float32 all the same).
        if compiled.active(x) or x.dtype not in _FLOAT_DTYPES:
            return compiled.apply(rules.fake_quantize_ggml, x, block_size, num_bits)
        if compiled.fuses_backward(x):
            return compiled.apply_packed(lambda t: _ops.fake_quantize_ggml(t, block_size, num_bits), x)
        return _ops.fake_quantize_ggml(x, block_size, num_bits)[0]

    return along_last_axis(input, axis, rule)
