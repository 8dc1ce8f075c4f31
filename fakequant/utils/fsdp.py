"""A quantized model under FSDP2 (``torch.distributed.fsdp.fully_shard``) and
``torch.distributed.checkpoint`` (DCP).

* :func:`prepare_fully_shard`: ``fully_shard`` shards every parameter along its first
  dimension and rejects 0-dimensional ones, and a learned range (``learn_amax``) is two
  0-dimensional parameters (pytorch-quantization's layout). Call it before ``fully_shard``
  and before building the optimizer: they become shape ``(1,)``, same values.
* :func:`register_quantizer_buffers`: DCP loads into the keys of the state dict it is
  given, and a quantizer registers its ``_amax`` buffer only once calibrated (or loaded):
  a fresh model's state dict has no ``_amax`` key. This registers them, with the shapes
  the checkpoint holds, so that ``dcp.load`` fills them.

Calibration (:func:`fakequant.calibrate`) needs nothing more: run on every rank, on its
own share of the data, before or after ``fully_shard``, it merges the statistics of
every rank, so the ``_amax`` buffers (which FSDP2 leaves whole on every rank) and the
learned ranges it starts are the same everywhere.
"""
from typing import Mapping, Union

import torch

from ..nn.clip import Clip
from ..nn.tensor_quantizer import TensorQuantizer

__all__ = ["prepare_fully_shard", "register_quantizer_buffers"]


def _check_model(model):
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")


def prepare_fully_shard(model: torch.nn.Module) -> int:
    """Makes every learnable clip bound (the learned ranges of ``learn_amax``
    quantizers) a parameter of shape ``(1,)`` (:meth:`fakequant.nn.Clip.learned_bounds_1d_`),
    which ``fully_shard`` can shard. Forward, gradients and exports are unchanged, and
    checkpoints load either way. The parameter objects are new: build the optimizer
    afterwards. Returns how many parameters changed."""
    _check_model(model)
    return sum(m.learned_bounds_1d_() for m in model.modules() if isinstance(m, Clip))


def _shape(value):
    if isinstance(value, torch.Tensor):
        return value.shape
    size = getattr(value, "size", value)  # DCP's TensorStorageMetadata has .size
    if isinstance(size, (torch.Size, tuple, list)) and all(isinstance(n, int) for n in size):
        return torch.Size(size)
    return None


def register_quantizer_buffers(model: torch.nn.Module, source: Union[Mapping, object], prefix: str = "") -> int:
    """Registers the ``_amax`` and ``_pre_quant_scale`` buffers that ``source`` holds
    for ``model``'s quantizers (zero-filled, float32, the checkpoint's shape) where a
    quantizer has none or one of another shape, so that a loader driven by the model's
    own state dict (``torch.distributed.checkpoint.load`` with ``get_state_dict``) loads
    them. Needed for a model that was not calibrated yet; ``load_state_dict`` itself
    makes room without it.

    Args:
        model: the quantized model (wrapped by ``fully_shard`` or not).
        source: a DCP checkpoint's metadata
            (``torch.distributed.checkpoint.FileSystemReader(path).read_metadata()``) or a
            mapping of state-dict keys to tensors or shapes.
        prefix: what the checkpoint's keys carry before the model's own, e.g.
            ``"model."`` for ``dcp.save({"model": model_state_dict, ...})``.

    Returns:
        The number of buffers registered.
    """
    _check_model(model)
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str, got {type(prefix).__name__}")
    entries = getattr(source, "state_dict_metadata", source)
    if not isinstance(entries, Mapping):
        raise TypeError("source must be a torch.distributed.checkpoint Metadata or a mapping of state-dict keys, "
                        f"got {type(source).__name__}")
    registered = 0
    for name, q in model.named_modules():
        if not isinstance(q, TensorQuantizer):
            continue
        for buffer in TensorQuantizer._LOADABLE_BUFFERS:
            key = f"{prefix}{name}.{buffer}" if name else f"{prefix}{buffer}"
            if key not in entries:
                continue
            shape = _shape(entries[key])
            if shape is None:
                raise TypeError(f"source[{key!r}] is neither a tensor nor a shape: {entries[key]!r}")
            old = q._buffers.get(buffer)
            if old is None or old.shape != shape:
                q._make_room(buffer, shape)
                registered += 1
    return registered
