"""Typed wrappers of the ``torch.ops.fakequant`` operators, with their fake
(meta) kernels and autograd formulas, one module per operator family as csrc/ops/ has
one host file per family. This package is the only code that touches
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
from .._core import amax_bound
# (the parameter caches and the helpers that other modules and tests reach as fakequant.ops.<name>)
from ._common import _AMAX, _MIN_MAX, _SCALE, _SCALE_AMAX, _SCALE_ZERO_POINT, _ZERO_POINT, TensorOrNumber, _Params
from .affine import (
    fake_quant,
    fake_quantize_affine,
    fake_quantize_per_channel_affine,
    fake_quantize_per_channel_affine_cachemask,
    fake_quantize_per_tensor_affine,
    fake_quantize_per_tensor_affine_cachemask,
    float_zero_point_rule,
)
from .amax import fake_quantize_amax, quantize_amax
from .blockwise import fake_quantize_blockwise
from .fp8 import fake_quantize_fp8, fp8_max
from .ggml import fake_quantize_ggml
from .lsq import (
    _fake_quantize_learnable_per_channel_affine,
    _fake_quantize_learnable_per_tensor_affine,
    fake_quantize_lsq,
)
from .mask import fake_quant_grad, mask_backward, mask_grad, unpack_mask
from .min_max import fake_quantize_min_max
from .observer import (
    fused_moving_avg_obs_fake_quant,
    scripted_fake_quantize_affine,
    scripted_fused_moving_avg_obs_fake_quant,
)

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
    "fake_quantize_ggml",
    "fake_quantize_lsq",
    "fused_moving_avg_obs_fake_quant",
]
