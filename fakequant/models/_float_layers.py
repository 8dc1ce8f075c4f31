"""What a conversion left in float, and why it matters: the rules behind
:func:`fakequant.quant_modules.unconverted` and :func:`~fakequant.quant_modules.quantize_model`'s
warning (a layer is quantized, kept float by every recipe, or usually quantized), and the
small conversion helpers they share (``DEFAULT_EXCLUDE``'s patterns, applied at or below a name)."""
from __future__ import annotations

import fnmatch
import warnings
from typing import List, Optional, Sequence, Tuple

import torch

from .. import nn as quant_nn
from ..nn._utils import QuantInputMixin, QuantMixin
from ..nn.tensor_quantizer import TensorQuantizer

# What conversion leaves alone: quantized modules and quantizers.
QUANTIZED = (QuantMixin, QuantInputMixin, TensorQuantizer)


def disable_input_quantizers(module: torch.nn.Module) -> None:
    """Disables the input quantizers of a module just converted (a weight-only preset)."""
    for name, child in module.named_modules():
        if isinstance(child, TensorQuantizer) and any(
                part.lstrip("_").startswith("input_quantizer") for part in name.split(".")):
            child.disable()


def _is_quantized(module: torch.nn.Module) -> bool:
    """A quantized module, a quantizer, or a module whose weights (own parameters of two or
    more dimensions) each have their ``<name>_weight_quantizer`` (fused MoE experts)."""
    if isinstance(module, QUANTIZED):
        return True
    weights = [n for n, p in module.named_parameters(recurse=False) if p.dim() >= 2 and not n.endswith("bias")]
    return bool(weights) and all(isinstance(getattr(module, f"{n}_weight_quantizer", None),
                                            (TensorQuantizer, quant_nn.QuantizerList)) for n in weights)


def _kept_float(module: torch.nn.Module) -> bool:
    """Embeddings and normalisation layers: float in every recipe."""
    name = type(module).__name__
    return isinstance(module, (torch.nn.Embedding, torch.nn.EmbeddingBag)) or "Embedding" in name or "Norm" in name


def _usually_quantized(module: torch.nn.Module, total: int) -> bool:
    """Whether ``module``'s own parameters are of the kind recipes quantize: one of two or
    more dimensions, or 1% or more of the model's parameters (``total``); embeddings and
    norms aside."""
    own = list(module.parameters(recurse=False))
    return not _kept_float(module) and any(p.dim() >= 2 or p.numel() * 100 >= total for p in own)


def at_or_below(excluded):
    """Whether a qualified name or one above it is ``excluded``."""
    def test(name):
        parts = name.split(".") if name else []
        return any(excluded(".".join(parts[:i])) for i in range(1, len(parts) + 1))
    return test


def warn_left_in_float(model, excluded, converted, float_classes):
    """Warns, once, naming each layer left in float whose weights recipes usually quantize
    (:func:`unconverted` with ``usually_quantized=True``) and that neither the defaults nor
    the user excluded (``exclude``, ``float_module_list``). ``converted``: the float classes
    this call converts; one of them still in float was refused by ``_convert``, which warned
    already (a subclass of one is not refused: it is named here)."""
    left_out = at_or_below(excluded)

    def owned(name):  # a float MultiheadAttention's out_proj goes (or stays) with its attention
        parent = name.rpartition(".")[0]
        return "." in name and isinstance(model.get_submodule(parent), torch.nn.MultiheadAttention)

    total = sum(p.numel() for p in model.parameters())
    skipped = []
    for name, cls in float_layers(model):
        module = model.get_submodule(name)
        if (left_out(name) or owned(name) or type(module) in converted
                or any(c.__name__ in float_classes for c in type(module).__mro__)):
            continue
        if isinstance(module, converted) or _usually_quantized(module, total):
            skipped.append((name, cls))
    if skipped:
        listed = ", ".join(f"{name or '(the model)'} ({cls})" for name, cls in skipped[:8])
        more = f" and {len(skipped) - 8} more" if len(skipped) > 8 else ""
        warnings.warn(f"quantize_model left {len(skipped)} layer(s) with weights in float that are usually "
                      f"quantized: {listed}{more}. fakequant converts the classes of docs/qat-guide.md "
                      "(not their subclasses) and transformers' fused MoE experts; pass exclude=[...] or "
                      "float_module_list=[...] to keep a layer in float on purpose; "
                      "fakequant.quant_modules.unconverted(model) lists every float layer", stacklevel=3)



def float_layers(model: torch.nn.Module, usually_quantized: Optional[bool] = None,
                 default_exclude: Sequence[str] = ()) -> List[Tuple[str, str]]:
    """What :func:`fakequant.quant_modules.unconverted` returns (its arguments checked there;
    ``default_exclude``: the patterns of the layers kept in float by default)."""
    total = sum(p.numel() for p in model.parameters())
    by_default = at_or_below(lambda name: any(fnmatch.fnmatchcase(name, p) for p in default_exclude))
    found: List[Tuple[str, str]] = []

    def walk(module: torch.nn.Module, qualified: str) -> None:
        if _is_quantized(module):
            return
        if next(module.parameters(recurse=False), None) is not None:
            usual = _usually_quantized(module, total) and not by_default(qualified)
            if usually_quantized is None or usual == usually_quantized:
                found.append((qualified, type(module).__name__))
        for name, child in module.named_children():
            walk(child, f"{qualified}.{name}" if qualified else name)

    walk(model, "")
    return found


