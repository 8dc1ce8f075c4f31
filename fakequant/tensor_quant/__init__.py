"""Quantization descriptors and tensor quantization functions.

The pytorch-quantization-shaped front of :mod:`fakequant.ops`: a
:class:`ScaledQuantDescriptor` (alias :data:`QuantDescriptor`, in ``descriptor.py``) says
how a tensor is quantized, and the functions (``functions.py``) quantize it.
:class:`QuantSpec` (``spec.py``) is what a quantizer computes of a descriptor.
"""
from .descriptor import (
    CALIB_METHODS,
    FP_FORMATS,
    MAX_NUM_BITS,
    MIN_NUM_BITS,
    QUANT_DESC_8BIT_CONV1D_WEIGHT_PER_CHANNEL,
    QUANT_DESC_8BIT_CONV2D_WEIGHT_PER_CHANNEL,
    QUANT_DESC_8BIT_CONV3D_WEIGHT_PER_CHANNEL,
    QUANT_DESC_8BIT_CONVTRANSPOSE1D_WEIGHT_PER_CHANNEL,
    QUANT_DESC_8BIT_CONVTRANSPOSE2D_WEIGHT_PER_CHANNEL,
    QUANT_DESC_8BIT_CONVTRANSPOSE3D_WEIGHT_PER_CHANNEL,
    QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW,
    QUANT_DESC_8BIT_PER_TENSOR,
    QUANT_DESC_UNSIGNED_8BIT_PER_TENSOR,
    QuantDescriptor,
    ScaledQuantDescriptor,
)
from .functions import (
    Amax,
    FakeAffineTensorQuantFunction,
    FakeTensorQuantFunction,
    LegacyFakeTensorQuantFunction,
    ScaledE4M3Function,
    TensorQuantFunction,
    fake_affine_tensor_quant,
    fake_tensor_quant,
    inverse_scale_in_input_dtype,
    legacy_fake_tensor_quant,
    scale_in_input_dtype,
    scaled_e4m3,
    tensor_quant,
)
from .spec import QuantSpec
from . import descriptor, functions

# (pickles name the class where users import it from)
ScaledQuantDescriptor.__module__ = __name__
QuantSpec.__module__ = __name__

__all__ = [*descriptor.__all__, *functions.__all__]
