"""fakequant: fake quantization for quantization-aware training."""
from ._extension import BUILT_FOR_CUDA, BUILT_FOR_TORCH, CUDA_ARCH_LIST
from .ops import (
    amax_bound,
    fake_quant,
    fake_quant_grad,
    fake_quantize_affine,
    fake_quantize_amax,
    fake_quantize_min_max,
    fake_quantize_per_channel_affine,
    fake_quantize_per_tensor_affine,
    mask_backward,
    quantize_amax,
    unpack_mask,
)

__version__ = "0.1.0"
