"""Quantized linear layer."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from .. import tensor_quant
from . import _utils

__all__ = ["Linear", "QuantLinear"]


class QuantLinear(nn.Linear, _utils.QuantMixin):
    """Quantized ``nn.Linear``: ``F.linear(quant(x), quant(W), b)``.

    Same constructor as ``nn.Linear`` plus the keyword arguments
    ``quant_desc_input`` / ``quant_desc_weight`` (defaults: per-tensor input,
    per-row weight).
    """

    default_quant_desc_input = tensor_quant.QUANT_DESC_8BIT_PER_TENSOR
    default_quant_desc_weight = tensor_quant.QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW

    def __init__(self, in_features: int, out_features: int, bias: bool = True, **kwargs: Any) -> None:
        quant_desc_input, quant_desc_weight = _utils.take_quant_descs(type(self), kwargs)
        super().__init__(in_features, out_features, bias, **kwargs)
        self.init_quantizer(quant_desc_input, quant_desc_weight)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        quant_input = self._input_quantizer(input)
        quant_weight = self._weight_quantizer(self.weight)
        return F.linear(quant_input, quant_weight, bias=self.bias)


Linear = QuantLinear
