"""Serving checkpoints: a QAT model written in the formats LLM engines load.

:func:`export_checkpoint` writes a ``quantize_model``'d transformers model as a
``compressed-tensors`` checkpoint (what vLLM and SGLang load; :mod:`fakequant.serve.compressed_tensors`)
or as GGUF (llama.cpp; ``fakequant.serve.gguf``). Each needs its format's library
(``pip install 'fakequant[serve]'``), imported only when that format is asked for.
Each format is one module holding a registered ``ServingFormat`` (``_base.py``), found by its
name; what they share (the model walk, the MoE experts, the bit-for-bit check, the refusal)
is written once beside them.
"""
from __future__ import annotations

import os
from typing import Any, Union

import torch

from . import compressed_tensors, gguf  # noqa: F401  (each registers its format)
from ._base import format_named, formats

__all__ = ["FORMATS", "export_checkpoint"]

#: The formats :func:`export_checkpoint` writes.
FORMATS = formats()


def export_checkpoint(model: torch.nn.Module, directory: Union[str, "os.PathLike[str]"],
                      format: str = "compressed-tensors", **kwargs: Any) -> Any:
    """Writes ``model`` (a transformers model converted with :func:`fakequant.quantize_model`)
    to ``directory`` as a serving checkpoint holding the quantized weights fakequant computed.

    Args:
        model: the quantized model.
        directory: the folder to write (created if missing).
        format: ``"compressed-tensors"`` (:func:`fakequant.serve.compressed_tensors.export_compressed_tensors`,
            whose keyword arguments ``kwargs`` are) or ``"gguf"`` (``fakequant.serve.gguf.export_gguf``).

    Nothing is written when the model cannot be exported: the error names the quantizer and why.
    """
    return format_named(format).export(model, directory, **kwargs)
