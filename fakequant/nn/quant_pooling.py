"""Quantized pooling: the float pooling of the fake-quantized input."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from . import _utils

if TYPE_CHECKING:
    # The torch.nn module the mixin below is mixed into (a base class for the type
    # checker only: at run time it derives from object).
    _ModuleBase = nn.Module
else:
    _ModuleBase = object

__all__ = [
    "MaxPool1d", "QuantMaxPool1d", "MaxPool2d", "QuantMaxPool2d", "MaxPool3d", "QuantMaxPool3d",
    "AvgPool1d", "QuantAvgPool1d", "AvgPool2d", "QuantAvgPool2d", "AvgPool3d", "QuantAvgPool3d",
    "AdaptiveAvgPool1d", "QuantAdaptiveAvgPool1d", "AdaptiveAvgPool2d", "QuantAdaptiveAvgPool2d",
    "AdaptiveAvgPool3d", "QuantAdaptiveAvgPool3d",
]


class _QuantInputModule(_utils.QuantInputMixin, _ModuleBase):
    """Quantizes the input, then runs the float module (the next base class)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        quant_desc_input = _utils.take_quant_descs(type(self), kwargs, input_only=True)
        super().__init__(*args, **kwargs)
        self.init_quantizer(quant_desc_input)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return super().forward(self._input_quantizer(input))


class QuantMaxPool1d(_QuantInputModule, nn.MaxPool1d):
    """Quantized ``nn.MaxPool1d``."""


class QuantMaxPool2d(_QuantInputModule, nn.MaxPool2d):
    """Quantized ``nn.MaxPool2d``."""


class QuantMaxPool3d(_QuantInputModule, nn.MaxPool3d):
    """Quantized ``nn.MaxPool3d``."""


class QuantAvgPool1d(_QuantInputModule, nn.AvgPool1d):
    """Quantized ``nn.AvgPool1d``."""


class QuantAvgPool2d(_QuantInputModule, nn.AvgPool2d):
    """Quantized ``nn.AvgPool2d``."""


class QuantAvgPool3d(_QuantInputModule, nn.AvgPool3d):
    """Quantized ``nn.AvgPool3d``."""


class QuantAdaptiveAvgPool1d(_QuantInputModule, nn.AdaptiveAvgPool1d):
    """Quantized ``nn.AdaptiveAvgPool1d``."""


class QuantAdaptiveAvgPool2d(_QuantInputModule, nn.AdaptiveAvgPool2d):
    """Quantized ``nn.AdaptiveAvgPool2d``."""


class QuantAdaptiveAvgPool3d(_QuantInputModule, nn.AdaptiveAvgPool3d):
    """Quantized ``nn.AdaptiveAvgPool3d``."""


MaxPool1d = QuantMaxPool1d
MaxPool2d = QuantMaxPool2d
MaxPool3d = QuantMaxPool3d
AvgPool1d = QuantAvgPool1d
AvgPool2d = QuantAvgPool2d
AvgPool3d = QuantAvgPool3d
AdaptiveAvgPool1d = QuantAdaptiveAvgPool1d
AdaptiveAvgPool2d = QuantAdaptiveAvgPool2d
AdaptiveAvgPool3d = QuantAdaptiveAvgPool3d
