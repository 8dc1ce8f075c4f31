"""Quantized Hugging Face ``Conv1D`` (GPT-2's linear layer).

``transformers.pytorch_utils.Conv1D`` is a linear layer that stores its weight
transposed, ``(in_features, out_features)``, and computes ``y = x @ W + b``. Its
quantized class quantizes the weight *as a Linear's*: the weight quantizer sees
``W.t()``, ``(out_features, in_features)``, so every weight descriptor means what
it means for :class:`~fakequant.nn.QuantLinear` (``axis=0`` is per output channel,
i.e. axis 1 of the stored weight; blocks along ``-1`` run over the input
features). This module imports nothing from transformers:
:func:`fakequant.quantize_model` converts ``Conv1D`` layers into it when
transformers is loaded.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .. import tensor_quant
from . import _utils

__all__ = ["QuantConv1D"]


class QuantConv1D(nn.Module, _utils.QuantMixin):
    """Quantized ``transformers.pytorch_utils.Conv1D``:
    ``addmm(b, quant(x), quant(W.t()).t())``, with ``weight`` ``(nx, nf)`` and
    ``bias`` ``(nf,)`` as the float layer (state dicts load unchanged).

    Args:
        nf: output features. nx: input features (the float layer's argument order).
        quant_desc_input, quant_desc_weight: keyword-only descriptors (defaults:
            per-tensor input, per-output-channel weight).
    """

    default_quant_desc_input = tensor_quant.QUANT_DESC_8BIT_PER_TENSOR
    default_quant_desc_weight = tensor_quant.QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW

    def __init__(self, nf: int, nx: int, **kwargs: Any) -> None:
        quant_desc_input, quant_desc_weight = _utils.pop_quant_desc_in_kwargs(type(self), **kwargs)
        super().__init__()
        self.nf = nf
        self.nx = nx
        self.weight = nn.Parameter(torch.empty(nx, nf))
        self.bias = nn.Parameter(torch.zeros(nf))
        nn.init.normal_(self.weight, std=0.02)
        self.init_quantizer(quant_desc_input, quant_desc_weight)

    def _weight_for_quantizer(self) -> torch.Tensor:
        """The weight as the weight quantizer sees it: ``(out_features, in_features)``,
        a view of ``weight`` (the one place the transposition is written)."""
        return self.weight.t()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        quant_x = self._input_quantizer(x)
        quant_w = self._weight_quantizer(self._weight_for_quantizer()).t()
        out = torch.addmm(self.bias, quant_x.reshape(-1, quant_x.size(-1)), quant_w)
        return out.view(*x.shape[:-1], self.nf)

    def extra_repr(self) -> str:
        return f"nf={self.nf}, nx={self.nx}"
