"""``save_pretrained`` / ``from_pretrained`` of a quantized transformers model.

:func:`fakequant.quantize_model` on a transformers ``PreTrainedModel`` records its recipe (the
preset or the descriptors, ``exclude``, ``quantize_attention``) in
``model.config.quantization_config``, a ``FakequantConfig`` (``quant_method
"fakequant"``), and gives the model a quantizer object of transformers' kind
(``model.hf_quantizer``). ``model.save_pretrained(directory)`` then writes that config with
the amax shapes of every calibrated quantizer (refreshed at each save), and the weights with
every quantizer's state (amax, learned ranges) in the safetensors file.
``transformers.AutoModelForCausalLM.from_pretrained(directory)`` (any ``from_pretrained``)
finds ``quant_method "fakequant"`` in transformers' quantization registries
(``register_quantization_config``, ``register_quantizer``: public), converts the model with the
same recipe before the weights load, creates the amax buffers, and loads everything into them:
the same model, bit for bit, in eval and in training.

The registration happens on :func:`register` (``import fakequant`` calls it when transformers
is already imported, and ``quantize_model`` does on a transformers model); a script that
imports fakequant before transformers and only loads calls ``fakequant.models.pretrained.register()``.
"""
from __future__ import annotations

import contextlib
import sys
from typing import Any, Callable, Dict, Iterator, List, Optional

import torch

from ..nn.tensor_quantizer import TensorQuantizer
from ..tensor_quant import QuantDescriptor

__all__ = ["QUANT_METHOD", "amax_shapes", "attach", "detached", "is_pretrained_model", "recipe_kwargs", "register",
           "set_converter"]

QUANT_METHOD = "fakequant"

_convert: Optional[Callable[..., torch.nn.Module]] = None
_classes: Dict[str, Any] = {}


def set_converter(convert: Callable[..., torch.nn.Module]) -> None:
    """The function that converts a model from a recipe (``fakequant.quantize_model``,
    which ``fakequant.quant_modules`` sets on import: this module sits below it)."""
    global _convert
    _convert = convert


def is_pretrained_model(model: torch.nn.Module) -> bool:
    """Whether ``model`` is a transformers ``PreTrainedModel`` (duck-typed: a config and
    ``save_pretrained``; nothing of transformers is imported)."""
    return hasattr(model, "config") and callable(getattr(model, "save_pretrained", None)) and \
        "transformers" in sys.modules


def _json_value(v: Any) -> Any:
    if isinstance(v, tuple):
        return [_json_value(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _json_value(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_json_value(x) for x in v]
    return v


def _descriptor_from_json(d: Dict[str, Any]) -> QuantDescriptor:
    """A descriptor from its JSON form: block_sizes' axis keys back to ints, pairs back to tuples."""
    d = dict(d)
    for key in ("num_bits", "axis"):
        if isinstance(d.get(key), list):
            d[key] = tuple(d[key])
    blocks = d.get("block_sizes")
    if isinstance(blocks, dict):
        d["block_sizes"] = {(int(k) if k.lstrip("-").isdigit() else k): (tuple(v) if isinstance(v, list) else v)
                            for k, v in blocks.items()}
    return QuantDescriptor(**d)


def recipe_kwargs(recipe: Dict[str, Any]) -> Dict[str, Any]:
    """``quantize_model``'s keyword arguments from a recorded recipe."""
    kwargs: Dict[str, Any] = {"exclude": recipe.get("exclude"), "float_module_list": recipe.get("float_module_list")}
    if recipe.get("preset") is not None:
        kwargs["preset"] = recipe["preset"]
    else:
        for name in ("quant_desc_input", "quant_desc_weight"):
            if recipe.get(name) is not None:
                kwargs[name] = _descriptor_from_json(recipe[name])
    attention = recipe.get("quantize_attention", False)
    kwargs["quantize_attention"] = _descriptor_from_json(attention) if isinstance(attention, dict) else attention
    if recipe.get("target") is not None:
        kwargs["target"] = recipe["target"]
    return kwargs


def amax_shapes(model: torch.nn.Module) -> Dict[str, List[int]]:
    """``{quantizer name: amax shape}`` of every quantizer of ``model`` that has an amax."""
    return {name: list(m.amax.shape) for name, m in model.named_modules()
            if isinstance(m, TensorQuantizer) and m.amax is not None}


def register() -> None:
    """Registers ``FakequantConfig`` and its quantizer with transformers' quantization
    registries, once."""
    if _classes:
        return
    from transformers.quantizers.auto import (AUTO_QUANTIZATION_CONFIG_MAPPING, AUTO_QUANTIZER_MAPPING,
                                              register_quantization_config, register_quantizer)
    from transformers.quantizers.base import HfQuantizer
    from transformers.utils.quantization_config import QuantizationConfigMixin

    class FakequantConfig(QuantizationConfigMixin):
        """``quantization_config`` of a fakequant model: the recipe and the amax shapes."""

        def __init__(self, recipe: Optional[Dict[str, Any]] = None, amax_shapes: Optional[Dict[str, List[int]]] = None,
                     **kwargs: Any) -> None:
            # (transformers types quant_method as its enum of its own methods)
            self.quant_method = QUANT_METHOD  # type: ignore[assignment]
            self.recipe = recipe or {}
            self.amax_shapes = amax_shapes or {}

    class FakequantHfQuantizer(HfQuantizer):
        """Converts the model with the recorded recipe before its weights load."""

        requires_calibration = False

        def _process_model_before_weight_loading(self, model: Any, **kwargs: Any) -> None:
            if _convert is None:
                raise RuntimeError("fakequant.quant_modules is not imported: import fakequant")
            config: Any = self.quantization_config
            recipe = config.recipe
            if recipe.get("custom_quant_modules"):
                raise ValueError("this checkpoint was quantized with custom_quant_modules, which a config cannot "
                                 "record: load it in float and call fakequant.quantize_model with them, then "
                                 "load_state_dict")
            _convert(model, **recipe_kwargs(recipe))
            device = next((p.device for p in model.parameters()), torch.device("cpu"))
            for name, shape in config.amax_shapes.items():
                quantizer = model.get_submodule(name)
                if not isinstance(quantizer, TensorQuantizer):
                    raise ValueError(f"the checkpoint's quantization_config names {name!r}, which is not a quantizer "
                                     "of the converted model")
                quantizer.amax = torch.zeros(shape, device=device)

        def _process_model_after_weight_loading(self, model: Any, **kwargs: Any) -> None:
            attach(model, getattr(self.quantization_config, "recipe"), self)

        def get_state_dict_and_metadata(self, model: Any) -> Any:
            setattr(self.quantization_config, "amax_shapes", amax_shapes(model))  # (before the config is written)
            return None, {}

        def is_serializable(self) -> bool:
            return True

        @property
        def is_trainable(self) -> bool:
            return True

        @property
        def is_qat_trainable(self) -> bool:
            return True

        @property
        def is_compileable(self) -> bool:
            return True

    if QUANT_METHOD not in AUTO_QUANTIZATION_CONFIG_MAPPING:
        register_quantization_config(QUANT_METHOD)(FakequantConfig)
    if QUANT_METHOD not in AUTO_QUANTIZER_MAPPING:
        register_quantizer(QUANT_METHOD)(FakequantHfQuantizer)
    _classes.update(config=AUTO_QUANTIZATION_CONFIG_MAPPING[QUANT_METHOD],
                    quantizer=AUTO_QUANTIZER_MAPPING[QUANT_METHOD])


def attach(model: Any, recipe: Dict[str, Any], quantizer: Any = None) -> None:
    """Records ``recipe`` (``quantize_model``'s arguments, in JSON form) on the transformers
    model ``model``: its ``config.quantization_config`` and ``hf_quantizer``."""
    register()
    if quantizer is None:
        config = _classes["config"](recipe=_json_value(recipe), amax_shapes=amax_shapes(model))
        quantizer = _classes["quantizer"](config, pre_quantized=True)
    model.config.quantization_config = quantizer.quantization_config
    model.hf_quantizer = quantizer
    model.is_quantized = True
    model.quantization_method = QUANT_METHOD


@contextlib.contextmanager
def detached(model: Any) -> Iterator[Any]:
    """``model`` without fakequant's ``quantization_config`` and ``hf_quantizer`` inside the
    block (restored after): for writers of other checkpoint formats, whose
    ``save_pretrained(state_dict=...)`` transformers would otherwise replace with the
    quantizer's."""
    saved = {name: getattr(model, name) for name in ("hf_quantizer", "is_quantized", "quantization_method")
             if name in vars(model)}
    config = getattr(model, "config", None)
    had_config = config is not None and hasattr(config, "quantization_config")
    quantization_config = getattr(config, "quantization_config", None)
    try:
        for name in saved:
            delattr(model, name)
        if had_config and config is not None:
            del config.quantization_config
        yield model
    finally:
        for name, value in saved.items():
            setattr(model, name, value)
        if had_config and config is not None:
            config.quantization_config = quantization_config
