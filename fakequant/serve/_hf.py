"""The Hugging Face checkpoint layout, shared by the formats that write one (compressed-tensors
and any other safetensors format transformers' ``save_pretrained`` lays out): the checks of
the export's arguments, and the model's state dict written with each planned layer's tensors
in place of its weight (the fused experts' parameters replaced by their per-expert tensors)."""
from __future__ import annotations

import os
from typing import Any, Dict, Iterable

import torch

from ..models import pretrained
from ..nn.tensor_quantizer import TensorQuantizer

__all__ = ["check_arguments", "save"]


def check_arguments(model: Any, directory: Any, tokenizer: Any) -> None:
    """TypeError naming the argument that is not a transformers model, a path or a tokenizer."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not callable(getattr(model, "save_pretrained", None)) or getattr(model, "config", None) is None:
        raise TypeError(f"model must be a transformers PreTrainedModel (with config and save_pretrained), "
                        f"got {type(model).__name__}")
    if not isinstance(directory, (str, os.PathLike)):
        raise TypeError(f"directory must be a path (str or os.PathLike), got {type(directory).__name__}")
    if tokenizer is not None and not callable(getattr(tokenizer, "save_pretrained", None)):
        raise TypeError(f"tokenizer must have save_pretrained (a transformers tokenizer or processor), "
                        f"got {type(tokenizer).__name__}")


def save(model: Any, directory: Any, tensors: Dict[str, Dict[str, torch.Tensor]], replaced: Iterable[str],
         tokenizer: Any, max_shard_size: Any) -> None:
    """``model.save_pretrained(directory)`` of the model's state without its quantizers' state and
    without the ``replaced`` parameters, each layer of ``tensors`` ({qualified name: {local name:
    tensor}}) written in place of its weight; then the tokenizer beside it, when given. The
    model's own (fakequant's) ``quantization_config`` is left out of config.json."""
    quantizer_prefixes = tuple(f"{name}." for name, m in model.named_modules() if isinstance(m, TensorQuantizer))
    state = {k: v for k, v in model.state_dict().items() if not k.startswith(quantizer_prefixes)}
    for name in replaced:
        del state[name]
    for name, local_tensors in tensors.items():
        state.pop(f"{name}.weight", None)  # (the experts' are in the fused parameters, replaced)
        for local, tensor in local_tensors.items():
            state[f"{name}.{local}"] = tensor.contiguous()
    os.makedirs(directory, exist_ok=True)
    with pretrained.detached(model):
        model.save_pretrained(directory, state_dict=state, max_shard_size=max_shard_size)
    if tokenizer is not None:
        tokenizer.save_pretrained(directory)
