"""Quantized ``nn.MultiheadAttention``.

The attention of ``torch.nn.MultiheadAttention`` runs inside one functional call whose
out-projection input cannot be reached from outside, so the quantized class computes
the same steps itself: fake-quantized query/key/value inputs, fake-quantized
in-projection weights, attention (``scaled_dot_product_attention``, or the explicit
softmax when the attention weights are returned), and ``out_proj`` as a
:class:`~fakequant.nn.QuantLinear` (its own input and weight quantizers). With every
quantizer disabled it computes what ``nn.MultiheadAttention`` computes outside
torch's inference fast path (a fused kernel used in eval mode without autograd),
operation for operation.
"""
from __future__ import annotations

import math
from typing import Any, Optional, Tuple

import torch
from torch import nn
from torch.nn import functional as F

from .. import tensor_quant
from . import _utils
from .quant_linear import QuantLinear
from .tensor_quantizer import TensorQuantizer

__all__ = ["MultiheadAttention", "QuantMultiheadAttention"]


class QuantMultiheadAttention(nn.MultiheadAttention, _utils.QuantMixin):
    """Quantized ``nn.MultiheadAttention`` (same constructor, same parameters).

    Quantizers: ``_input_quantizer`` (query), ``_key_input_quantizer``,
    ``_value_input_quantizer`` (the layer's inputs, with the input descriptor);
    ``_weight_quantizer`` (``in_proj_weight``, ``(3E, E)``, per output channel by
    default; with separate projection weights it quantizes ``q_proj_weight`` and
    ``_k_weight_quantizer`` / ``_v_weight_quantizer`` the other two); and
    ``out_proj``'s ``_input_quantizer`` / ``_weight_quantizer`` (``out_proj`` is a
    :class:`~fakequant.nn.QuantLinear` sharing the float layer's parameters).
    ``bias_k``/``bias_v`` and ``add_zero_attn`` are not supported.
    """

    default_quant_desc_input = tensor_quant.QUANT_DESC_8BIT_PER_TENSOR
    default_quant_desc_weight = tensor_quant.QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW

    def __init__(self, embed_dim: int, num_heads: int, *args: Any, **kwargs: Any) -> None:
        quant_desc_input, quant_desc_weight = _utils.take_quant_descs(type(self), kwargs)
        super().__init__(embed_dim, num_heads, *args, **kwargs)
        self.init_quantizer(quant_desc_input, quant_desc_weight)

    @staticmethod
    def unsupported(module: nn.MultiheadAttention) -> Optional[str]:
        """Why ``module`` (an ``nn.MultiheadAttention``) cannot be quantized, or None."""
        if module.bias_k is not None or module.add_zero_attn:
            return "bias_k/bias_v and add_zero_attn are not supported"
        return None

    def init_quantizer(
        self,
        quant_desc_input: tensor_quant.ScaledQuantDescriptor,
        quant_desc_weight: tensor_quant.ScaledQuantDescriptor,
        num_layers: Optional[int] = None,
    ) -> None:
        # (num_layers: QuantMixin's signature; attention has one set of quantizers)
        if num_layers is not None:
            raise TypeError(f"QuantMultiheadAttention.init_quantizer takes no num_layers, got {num_layers!r}")
        reason = self.unsupported(self)
        if reason is not None:
            raise ValueError(f"QuantMultiheadAttention: {reason}")
        super().init_quantizer(quant_desc_input, quant_desc_weight)
        self._key_input_quantizer = TensorQuantizer(quant_desc_input)
        self._value_input_quantizer = TensorQuantizer(quant_desc_input)
        if not self._qkv_same_embed_dim:
            self._k_weight_quantizer = TensorQuantizer(quant_desc_weight)
            self._v_weight_quantizer = TensorQuantizer(quant_desc_weight)
            self._k_weight_quantizer._quantizes_weight = self._v_weight_quantizer._quantizes_weight = True
        # out_proj becomes a QuantLinear over the same parameters (a float nn.Linear
        # subclass otherwise).
        out_proj = self.out_proj
        if not isinstance(out_proj, QuantLinear):
            quant_out = QuantLinear.__new__(QuantLinear)
            quant_out.__dict__.update({k: (v.copy() if isinstance(v, (dict, list, set)) else v)
                                       for k, v in out_proj.__dict__.items()})
            quant_out.init_quantizer(quant_desc_input, quant_desc_weight)
            # (ignore: torch infers out_proj's type from its __init__, NonDynamicallyQuantizableLinear;
            # any nn.Linear serves, the attention reads out_proj's weight and bias only)
            self.out_proj = quant_out  # type: ignore[assignment]

    def _in_projection(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor
    ) -> Tuple[torch.Tensor, ...]:
        """q, k, v projected with the quantized weights (the packed projection shares
        one matrix product where the inputs are the same tensor, as torch does)."""
        E = self.embed_dim
        b = self.in_proj_bias
        if self._qkv_same_embed_dim:
            w = self._weight_quantizer(self.in_proj_weight)
            if key is value and query is key:
                return F.linear(query, w, b).unflatten(-1, (3, E)).unbind(-2)
            w_q, w_kv = w.split([E, 2 * E])
            b_q, b_kv = (None, None) if b is None else b.split([E, 2 * E])
            if key is value:
                return (F.linear(query, w_q, b_q), *F.linear(key, w_kv, b_kv).unflatten(-1, (2, E)).unbind(-2))
            w_k, w_v = w_kv.chunk(2)
            b_k, b_v = (None, None) if b is None else b_kv.chunk(2)
            return F.linear(query, w_q, b_q), F.linear(key, w_k, b_k), F.linear(value, w_v, b_v)
        b_q, b_k, b_v = (None, None, None) if b is None else b.chunk(3)
        return (F.linear(query, self._weight_quantizer(self.q_proj_weight), b_q),
                F.linear(key, self._k_weight_quantizer(self.k_proj_weight), b_k),
                F.linear(value, self._v_weight_quantizer(self.v_proj_weight), b_v))

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        key_padding_mask: Optional[torch.Tensor] = None,
        need_weights: bool = True,
        attn_mask: Optional[torch.Tensor] = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        key_padding_mask = F._canonical_mask(mask=key_padding_mask, mask_name="key_padding_mask",
                                             other_type=F._none_or_dtype(attn_mask), other_name="attn_mask",
                                             target_type=query.dtype)
        attn_mask = F._canonical_mask(mask=attn_mask, mask_name="attn_mask", other_type=None, other_name="",
                                      target_type=query.dtype, check_other=False)
        batched = query.dim() == 3
        if self.batch_first and batched:  # to (L, N, E), keeping which inputs are the same tensor
            same_qk, same_kv = query is key, key is value
            query = query.transpose(0, 1)
            key = query if same_qk else key.transpose(0, 1)
            value = key if same_kv else value.transpose(0, 1)
        if not batched:
            query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)

        # (a disabled quantizer returns its input: self-attention keeps its packed projection)
        query = self._input_quantizer(query)
        key = self._key_input_quantizer(key)
        value = self._value_input_quantizer(value)

        tgt_len, bsz, embed_dim = query.shape
        src_len = key.shape[0]
        heads, head_dim = self.num_heads, self.head_dim
        if is_causal and attn_mask is None:
            raise RuntimeError("is_causal needs attn_mask (as nn.MultiheadAttention)")
        if is_causal and key_padding_mask is None and not need_weights:
            attn_mask = None  # scaled_dot_product_attention applies the causal mask itself
        else:
            if key_padding_mask is not None:
                is_causal = False
        q, k, v = self._in_projection(query, key, value)
        if attn_mask is not None and attn_mask.dim() == 2:
            attn_mask = attn_mask.unsqueeze(0)
        q = q.reshape(tgt_len, bsz * heads, head_dim).transpose(0, 1)
        k = k.reshape(src_len, bsz * heads, head_dim).transpose(0, 1)
        v = v.reshape(src_len, bsz * heads, head_dim).transpose(0, 1)
        if key_padding_mask is not None:
            key_padding_mask = (key_padding_mask.view(bsz, 1, 1, src_len).expand(-1, heads, -1, -1)
                                .reshape(bsz * heads, 1, src_len))
            attn_mask = key_padding_mask if attn_mask is None else attn_mask + key_padding_mask
        dropout_p = self.dropout if self.training else 0.0

        if need_weights:
            scores = q * math.sqrt(1.0 / float(head_dim))
            scores = (torch.baddbmm(attn_mask, scores, k.transpose(-2, -1)) if attn_mask is not None
                      else torch.bmm(scores, k.transpose(-2, -1)))
            weights = F.softmax(scores, dim=-1)
            if dropout_p > 0.0:
                weights = F.dropout(weights, p=dropout_p)
            out = torch.bmm(weights, v).transpose(0, 1).reshape(tgt_len * bsz, embed_dim)
            weights = weights.view(bsz, heads, tgt_len, src_len)
            if average_attn_weights:
                weights = weights.mean(dim=1)
        else:
            if attn_mask is not None:
                attn_mask = (attn_mask.unsqueeze(0) if attn_mask.size(0) == 1 and attn_mask.dim() == 3
                             else attn_mask.view(bsz, heads, -1, src_len))
            out = F.scaled_dot_product_attention(q.view(bsz, heads, tgt_len, head_dim),
                                                 k.view(bsz, heads, src_len, head_dim),
                                                 v.view(bsz, heads, src_len, head_dim), attn_mask, dropout_p,
                                                 is_causal)
            out = out.permute(2, 0, 1, 3).reshape(bsz * tgt_len, embed_dim)
            weights = None
        out = self.out_proj(out).view(tgt_len, bsz, -1)
        if not batched:
            out = out.squeeze(1)
            weights = None if weights is None else weights.squeeze(0)
        elif self.batch_first:
            out = out.transpose(1, 0)
        return out, weights


MultiheadAttention = QuantMultiheadAttention
