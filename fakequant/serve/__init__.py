"""Serving checkpoints: a QAT model written in the formats LLM engines load.

:func:`export_checkpoint` writes a ``quantize_model``'d transformers model as a
``compressed-tensors`` checkpoint (what vLLM and SGLang load; :mod:`fakequant.serve.compressed_tensors`)
or as GGUF (llama.cpp; ``fakequant.serve.gguf``). Each needs its format's library
(``pip install 'fakequant[serve]'``), imported only when that format is asked for.
"""
from __future__ import annotations

import os
from typing import Any, Union

import torch

__all__ = ["FORMATS", "export_checkpoint"]

#: The formats :func:`export_checkpoint` writes.
FORMATS = ("compressed-tensors", "gguf")


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
    if not isinstance(format, str) or format not in FORMATS:
        raise ValueError(f"format must be one of {list(FORMATS)}, got {format!r}")
    if format == "compressed-tensors":
        from .compressed_tensors import export_compressed_tensors

        return export_compressed_tensors(model, directory, **kwargs)
    from .gguf import export_gguf

    return export_gguf(model, directory, **kwargs)
