"""Quantized instance normalisation: the float module on the fake-quantized input."""
from torch import nn

from .quant_pooling import _QuantInputModule

__all__ = [
    "QuantInstanceNorm1d", "QuantInstanceNorm2d", "QuantInstanceNorm3d",
    "InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d",
]


class QuantInstanceNorm1d(_QuantInputModule, nn.InstanceNorm1d):
    """Quantized ``nn.InstanceNorm1d``."""


class QuantInstanceNorm2d(_QuantInputModule, nn.InstanceNorm2d):
    """Quantized ``nn.InstanceNorm2d``."""


class QuantInstanceNorm3d(_QuantInputModule, nn.InstanceNorm3d):
    """Quantized ``nn.InstanceNorm3d``."""


InstanceNorm1d = QuantInstanceNorm1d
InstanceNorm2d = QuantInstanceNorm2d
InstanceNorm3d = QuantInstanceNorm3d
