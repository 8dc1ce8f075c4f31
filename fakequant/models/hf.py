"""Quantizers on the inputs of the attention matmuls of Hugging Face transformers models.

transformers models compute attention through a registry of attention functions
(``transformers.AttentionInterface``), chosen by ``config._attn_implementation``;
each attention module calls ``fn(module, query, key, value, attention_mask, ...)``
with ``query``/``key``/``value`` of shape ``(batch, heads, tokens, head_dim)``, after
the projections and rotary embeddings. :func:`add_attention_quantizers` (what
``quantize_model(..., quantize_attention=True)`` calls) registers one more function,
``"fakequant"``: it fake-quantizes query, key and value with the module's
``q_bmm_quantizer``, ``k_bmm_quantizer`` and ``v_bmm_quantizer`` (Model Optimizer's
names) and then runs transformers' ``"sdpa"`` function; the model is switched to it
with transformers' own ``set_attn_implementation``. Key and value are quantized
before grouped-query heads are repeated. Nothing from transformers is imported until
this is asked for, and nothing of it is patched.
"""
from __future__ import annotations

import warnings
from typing import Any, Callable, List, Optional

import torch

from ..nn.tensor_quantizer import TensorQuantizer
from ..tensor_quant import QuantDescriptor, ScaledQuantDescriptor

__all__ = ["ATTN_IMPLEMENTATION", "BMM_QUANTIZERS", "add_attention_quantizers", "is_attention_module",
           "register_attention"]

ATTN_IMPLEMENTATION = "fakequant"
BMM_QUANTIZERS = ("q_bmm_quantizer", "k_bmm_quantizer", "v_bmm_quantizer")


def _quantized_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Optional[torch.Tensor],
    **kwargs: Any,
) -> Any:
    assert _SDPA is not None  # (registered by register_attention, which sets it first)
    quantizers: List[Any] = [getattr(module, name, None) for name in BMM_QUANTIZERS]
    if quantizers[0] is not None:
        query, key, value = (q(t) for q, t in zip(quantizers, (query, key, value)))
    return _SDPA(module, query, key, value, attention_mask, **kwargs)


_SDPA: Optional[Callable[..., Any]] = None


def register_attention() -> str:
    """Registers the ``"fakequant"`` attention (and its mask, the sdpa one) with transformers'
    public registries, once. Returns its name."""
    global _SDPA
    if _SDPA is None:
        try:
            from transformers import AttentionInterface
            from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
            from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
        except ImportError as e:
            raise ImportError("quantize_attention needs transformers (pip install 'fakequant[hf]')") from e
        _SDPA = ALL_ATTENTION_FUNCTIONS["sdpa"]
        AttentionInterface.register(ATTN_IMPLEMENTATION, _quantized_attention)
        AttentionMaskInterface.register(ATTN_IMPLEMENTATION, sdpa_mask)
    return ATTN_IMPLEMENTATION


def is_attention_module(module: torch.nn.Module) -> bool:
    """Whether ``module`` is a transformers attention module that calls the attention
    registry: its class name holds ``Attention`` and it has the ``config`` and
    ``is_causal`` attributes those modules keep (``BertSelfAttention``, ``GPT2Attention``,
    ``LlamaAttention``, ...; not wrappers such as ``BertAttention``)."""
    return "Attention" in type(module).__name__ and hasattr(module, "config") and hasattr(module, "is_causal")


def add_attention_quantizers(
    model: torch.nn.Module, quant_desc: ScaledQuantDescriptor, skip: Optional[Callable[[str], bool]] = None
) -> List[str]:
    """Adds ``q_bmm_quantizer``/``k_bmm_quantizer``/``v_bmm_quantizer`` (from ``quant_desc``)
    to every attention module of the transformers model ``model`` (except those whose
    qualified name ``skip(name)`` accepts) and switches the model to the ``"fakequant"``
    attention. Returns the qualified names of the modules that got quantizers."""
    if not isinstance(quant_desc, QuantDescriptor):
        raise TypeError(f"quant_desc must be a QuantDescriptor, got {type(quant_desc).__name__}")
    if not callable(getattr(model, "set_attn_implementation", None)):
        raise ValueError("quantize_attention needs a transformers PreTrainedModel (with set_attn_implementation), "
                         f"got {type(model).__name__}")
    hf_model: Any = model  # (a transformers PreTrainedModel, duck-typed: checked just above)
    name = register_attention()
    done: List[str] = []
    for qualified, module in model.named_modules():
        if not is_attention_module(module) or (skip is not None and skip(qualified)):
            continue
        device = next((t.device for t in module.parameters()), None)
        for attr in BMM_QUANTIZERS:
            if not isinstance(getattr(module, attr, None), TensorQuantizer):
                module.add_module(attr, TensorQuantizer(quant_desc).to(device) if device else TensorQuantizer(quant_desc))
        done.append(qualified)
    if not done:
        warnings.warn("quantize_attention: the model has no transformers attention module; nothing added",
                      stacklevel=3)
        return done
    hf_model.set_attn_implementation(name)
    if hf_model.config._attn_implementation != name:
        raise ValueError(f"quantize_attention: {type(model).__name__} does not take a registered attention "
                         f"function (its attention implementation stayed {hf_model.config._attn_implementation!r})")
    return done
