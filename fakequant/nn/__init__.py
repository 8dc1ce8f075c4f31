"""Quantized modules (``from fakequant import nn as quant_nn``).

``quant_nn.Conv2d`` and the other short names are the ``Quant*`` classes, so
they drop into code written against ``torch.nn``.
"""
from .tensor_quantizer import TensorQuantizer
from .quantizer_list import QuantizerList
from .clip import Clip
from . import functional
from ._utils import QuantInputMixin, QuantMixin, pop_quant_desc_in_kwargs
from .quant_conv import (
    Conv1d, Conv2d, Conv3d, ConvTranspose1d, ConvTranspose2d, ConvTranspose3d,
    QuantConv1d, QuantConv2d, QuantConv3d, QuantConvTranspose1d, QuantConvTranspose2d, QuantConvTranspose3d,
)
from .quant_linear import Linear, QuantLinear
from .quant_conv1d_hf import QuantConv1D
from .quant_attention import MultiheadAttention, QuantMultiheadAttention
from .quant_pooling import (
    AdaptiveAvgPool1d, AdaptiveAvgPool2d, AdaptiveAvgPool3d, AvgPool1d, AvgPool2d, AvgPool3d,
    MaxPool1d, MaxPool2d, MaxPool3d,
    QuantAdaptiveAvgPool1d, QuantAdaptiveAvgPool2d, QuantAdaptiveAvgPool3d, QuantAvgPool1d, QuantAvgPool2d,
    QuantAvgPool3d, QuantMaxPool1d, QuantMaxPool2d, QuantMaxPool3d,
)
from .quant_rnn import LSTM, LSTMCell, QuantLSTM, QuantLSTMCell
from .quant_instancenorm import (
    InstanceNorm1d, InstanceNorm2d, InstanceNorm3d, QuantInstanceNorm1d, QuantInstanceNorm2d, QuantInstanceNorm3d,
)
from . import modules  # noqa: F401,E402  (pytorch-quantization's import paths)

__all__ = [
    "TensorQuantizer", "QuantizerList", "Clip", "QuantMixin", "QuantInputMixin", "pop_quant_desc_in_kwargs",
    "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d",
    "QuantConv1d", "QuantConv2d", "QuantConv3d", "QuantConvTranspose1d", "QuantConvTranspose2d",
    "QuantConvTranspose3d", "Linear", "QuantLinear", "QuantConv1D", "MultiheadAttention", "QuantMultiheadAttention",
    "MaxPool1d", "MaxPool2d", "MaxPool3d", "AvgPool1d", "AvgPool2d", "AvgPool3d",
    "AdaptiveAvgPool1d", "AdaptiveAvgPool2d", "AdaptiveAvgPool3d",
    "QuantMaxPool1d", "QuantMaxPool2d", "QuantMaxPool3d", "QuantAvgPool1d", "QuantAvgPool2d", "QuantAvgPool3d",
    "QuantAdaptiveAvgPool1d", "QuantAdaptiveAvgPool2d", "QuantAdaptiveAvgPool3d",
    "LSTM", "LSTMCell", "QuantLSTM", "QuantLSTMCell",
    "InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d",
    "QuantInstanceNorm1d", "QuantInstanceNorm2d", "QuantInstanceNorm3d",
]
