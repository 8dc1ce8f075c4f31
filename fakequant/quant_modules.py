"""Swap ``torch.nn`` layers for quantized ones.

Two ways:

* :func:`initialize` monkey-patches ``torch.nn.Conv2d`` & co. so that models
  built *afterwards* use the quantized classes (pytorch-quantization's way);
  :func:`deactivate` undoes it, and ``with quant_modules.initialize(): ...``
  limits it to a block.
* :func:`quantize_model` converts a model that already exists (say, loaded with
  pretrained weights) in place, keeping its parameters (same tensors, so an
  optimizer built on them stays valid), hooks and mode.
"""
from __future__ import annotations

import contextlib
import fnmatch
import sys
import warnings
from typing import Any, Dict, List, Literal, NamedTuple, Optional, Sequence, Tuple, Type, Union

import torch

from .models import _float_layers, experts, hf, pretrained, presets
from . import nn as quant_nn
from .nn._utils import QuantMixin
from .nn.tensor_quantizer import TensorQuantizer
from .tensor_quant import QuantDescriptor, ScaledQuantDescriptor
from .tensor_quant.spec import TARGETS
from ._core import enable_onnx_export  # noqa: F401  (pytorch-quantization's name; per-thread export state)

__all__ = ["initialize", "deactivate", "enable_onnx_export", "quantize_model", "unconverted",
           "QuantModuleReplacementHelper", "DEFAULT_EXCLUDE"]

# What conversion leaves alone: quantized modules and quantizers.
_QUANTIZED = _float_layers.QUANTIZED

class _quant_entry(NamedTuple):
    orig_mod: Any
    mod_name: str
    replace_mod: Type[torch.nn.Module]


# (pytorch-quantization's namedtuple("quant_entry", ...): its name in reprs)
_quant_entry.__name__ = _quant_entry.__qualname__ = "quant_entry"

_DEFAULT_QUANT_MAP = [
    _quant_entry(torch.nn, "Conv1d", quant_nn.QuantConv1d),
    _quant_entry(torch.nn, "Conv2d", quant_nn.QuantConv2d),
    _quant_entry(torch.nn, "Conv3d", quant_nn.QuantConv3d),
    _quant_entry(torch.nn, "ConvTranspose1d", quant_nn.QuantConvTranspose1d),
    _quant_entry(torch.nn, "ConvTranspose2d", quant_nn.QuantConvTranspose2d),
    _quant_entry(torch.nn, "ConvTranspose3d", quant_nn.QuantConvTranspose3d),
    _quant_entry(torch.nn, "Linear", quant_nn.QuantLinear),
    _quant_entry(torch.nn, "MultiheadAttention", quant_nn.QuantMultiheadAttention),
    _quant_entry(torch.nn, "LSTM", quant_nn.QuantLSTM),
    _quant_entry(torch.nn, "LSTMCell", quant_nn.QuantLSTMCell),
    _quant_entry(torch.nn, "AvgPool1d", quant_nn.QuantAvgPool1d),
    _quant_entry(torch.nn, "AvgPool2d", quant_nn.QuantAvgPool2d),
    _quant_entry(torch.nn, "AvgPool3d", quant_nn.QuantAvgPool3d),
    _quant_entry(torch.nn, "AdaptiveAvgPool1d", quant_nn.QuantAdaptiveAvgPool1d),
    _quant_entry(torch.nn, "AdaptiveAvgPool2d", quant_nn.QuantAdaptiveAvgPool2d),
    _quant_entry(torch.nn, "AdaptiveAvgPool3d", quant_nn.QuantAdaptiveAvgPool3d),
]

# The float classes, captured before anything is patched.
_FLOAT_CLASSES = {(id(e.orig_mod), e.mod_name): getattr(e.orig_mod, e.mod_name) for e in _DEFAULT_QUANT_MAP}

# Classes of other libraries that quantize_model converts when the library is loaded
# (imported by the user; fakequant imports none of them): (module name, class name,
# quantized class). initialize() patches none of them.
_OPTIONAL_QUANT_MAP = [
    ("transformers.pytorch_utils", "Conv1D", quant_nn.QuantConv1D),  # GPT-2's linear layer
]


def _optional_classes():
    """``{float class: quantized class}`` of :data:`_OPTIONAL_QUANT_MAP` whose library is loaded."""
    found = {}
    for module_name, name, quant_cls in _OPTIONAL_QUANT_MAP:
        cls = getattr(sys.modules.get(module_name), name, None)
        if isinstance(cls, type):
            found[cls] = (name, quant_cls)
    return found


# The layers quantize_model leaves in float unless told otherwise (exclude=None): the
# output heads and routers that recipes keep in float (Model Optimizer's defaults too), as
# fnmatch patterns of qualified module names. Embeddings and norms are not converted at all.
DEFAULT_EXCLUDE = (
    "*lm_head*",             # language-model heads (GPT-2, Llama, ...)
    "*proj_out*",            # Whisper's output projection
    "*router*",              # mixture-of-experts routers
    "*mlp.gate",             # MoE gates (Qwen-MoE, DeepSeek); not Llama's mlp.gate_proj
    "*block_sparse_moe.gate",  # Mixtral's gate
    "*shared_expert_gate",   # Qwen-MoE
)


def _check_float_module_list(float_module_list):
    if float_module_list is None:
        return set()
    if isinstance(float_module_list, str) or not all(isinstance(n, str) for n in float_module_list):
        raise TypeError(f"float_module_list must be a list of module names (str), got {float_module_list!r}")
    known = {e.mod_name for e in _DEFAULT_QUANT_MAP} | {name for _, name, _ in _OPTIONAL_QUANT_MAP}
    unknown = sorted(set(float_module_list) - known)
    if unknown:
        warnings.warn(f"float_module_list names {unknown}, which are not quantized anyway (known: {sorted(known)})",
                      stacklevel=3)
    return set(float_module_list)


def _check_custom(custom_quant_modules):
    entries = []
    for item in custom_quant_modules or ():
        if not (isinstance(item, (tuple, list)) and len(item) == 3):
            raise TypeError(f"custom_quant_modules entries must be (module, name, quant_class) tuples, got {item!r}")
        module, name, quant_cls = item
        if not isinstance(name, str) or not hasattr(module, name):
            raise ValueError(f"custom_quant_modules: {module!r} has no attribute {name!r}")
        if not (isinstance(quant_cls, type) and issubclass(quant_cls, torch.nn.Module)):
            raise TypeError(f"custom_quant_modules: the replacement of {name!r} must be a Module class, got {quant_cls!r}")
        entries.append(_quant_entry(module, name, quant_cls))
    return entries


class QuantModuleReplacementHelper:
    """Monkey-patches module classes with quantized ones and restores them.

    The originals are remembered the first time a name is patched, so that
    patching twice (calling :func:`initialize` again) never mistakes a patched
    class for the original.
    """

    def __init__(self) -> None:
        # (id(module), name) -> (module, name, original class)
        self.orginal_func_map: Dict[Tuple[int, str], Tuple[Any, str, Any]] = {}
        self.quant_map: List[_quant_entry] = []

    def prepare_state(
        self,
        float_module_list: Optional[Sequence[str]] = None,
        custom_map: Optional[Sequence[Tuple[Any, str, Type[torch.nn.Module]]]] = None,
    ) -> None:
        """Chooses the entries to patch: the default map minus ``float_module_list``, plus ``custom_map``."""
        skip = _check_float_module_list(float_module_list)
        custom = _check_custom(custom_map)
        self.quant_map = [e for e in _DEFAULT_QUANT_MAP if e.mod_name not in skip] + custom

    def apply_quant_modules(self) -> None:
        """Patches every entry of the quant map."""
        for entry in self.quant_map:
            key = (id(entry.orig_mod), entry.mod_name)
            if key not in self.orginal_func_map:
                original = _FLOAT_CLASSES.get(key, getattr(entry.orig_mod, entry.mod_name))
                self.orginal_func_map[key] = (entry.orig_mod, entry.mod_name, original)
            setattr(entry.orig_mod, entry.mod_name, entry.replace_mod)

    def restore_float_modules(self) -> None:
        """Puts every patched class back."""
        for module, name, original in self.orginal_func_map.values():
            setattr(module, name, original)
        self.orginal_func_map = {}
        self.quant_map = []

    @property
    def active(self) -> bool:
        return bool(self.orginal_func_map)


_quant_module_helper_object = QuantModuleReplacementHelper()


class _Initialized(contextlib.AbstractContextManager):
    """Returned by :func:`initialize`; leaving a ``with`` block deactivates."""

    def __exit__(self, *exc: Any) -> Literal[False]:
        deactivate()
        return False


def initialize(
    float_module_list: Optional[Sequence[str]] = None,
    custom_quant_modules: Optional[Sequence[Tuple[Any, str, Type[torch.nn.Module]]]] = None,
) -> contextlib.AbstractContextManager:
    """Replaces ``torch.nn`` layer classes by their quantized versions.

    Models constructed afterwards (``torchvision.models.resnet50()``, ...) get
    quantized layers. Calling it again replaces the previous patching.

    Args:
        float_module_list: names of ``torch.nn`` classes to leave alone, e.g. ``["Linear"]``.
        custom_quant_modules: extra ``(module, name, quant_class)`` replacements,
            e.g. ``[(torch.nn, "MaxPool2d", quant_nn.QuantMaxPool2d)]``.

    Returns:
        A context manager: ``with quant_modules.initialize(): model = build()``
        deactivates at the end of the block.
    """
    helper = _quant_module_helper_object
    helper.prepare_state(float_module_list, custom_quant_modules)  # validate before touching anything
    entries = helper.quant_map
    helper.restore_float_modules()
    helper.quant_map = entries
    helper.apply_quant_modules()
    return _Initialized()


def deactivate() -> None:
    """Undoes :func:`initialize` (no-op if it is not active)."""
    _quant_module_helper_object.restore_float_modules()


# --- converting an existing model ------------------------------------------------


def _param_device(module):
    for t in list(module.parameters()) + list(module.buffers()):
        return t.device
    return None


def _convert(module, quant_cls, quant_desc_input, quant_desc_weight):
    """A ``quant_cls`` instance that shares ``module``'s parameters, buffers,
    submodules, hooks and mode, with fresh quantizers."""
    if isinstance(module, torch.nn.LSTM) and module.proj_size:
        warnings.warn(f"an LSTM with proj_size={module.proj_size} cannot be quantized; left in float", stacklevel=3)
        return None
    if isinstance(module, torch.nn.MultiheadAttention) and quant_nn.QuantMultiheadAttention.unsupported(module):
        warnings.warn(f"a MultiheadAttention cannot be quantized: {quant_nn.QuantMultiheadAttention.unsupported(module)}"
                      "; left in float", stacklevel=3)
        return None
    converted = quant_cls.__new__(quant_cls)
    # Shallow copies of the containers (parameter/buffer/module dicts, hook dicts,
    # sets): the tensors are shared, the bookkeeping is not.
    converted.__dict__.update({k: (v.copy() if isinstance(v, (dict, list, set)) else v)
                               for k, v in module.__dict__.items()})
    desc_input = quant_desc_input or quant_cls.default_quant_desc_input
    if issubclass(quant_cls, QuantMixin):
        desc_weight = quant_desc_weight or quant_cls.default_quant_desc_weight
        if isinstance(converted, quant_nn.QuantLSTM):
            layers = converted.num_layers * (2 if converted.bidirectional else 1)
            converted.init_quantizer(desc_input, desc_weight, num_layers=layers)
        else:
            converted.init_quantizer(desc_input, desc_weight)
    else:
        converted.init_quantizer(desc_input)
    device = _param_device(module)
    if device is not None:
        for child in converted.modules():
            if isinstance(child, TensorQuantizer):
                child.to(device)
    return converted


def quantize_model(
    model: torch.nn.Module,
    quant_desc_input: Optional[ScaledQuantDescriptor] = None,
    quant_desc_weight: Optional[ScaledQuantDescriptor] = None,
    float_module_list: Optional[Sequence[str]] = None,
    custom_quant_modules: Optional[Sequence[Tuple[Any, str, Type[torch.nn.Module]]]] = None,
    exclude: Optional[Sequence[str]] = None,
    preset: Optional[Union[str, presets.Preset]] = None,
    quantize_attention: Union[bool, ScaledQuantDescriptor] = False,
    target: str = "onnx",
) -> torch.nn.Module:
    """Converts the layers of an existing model to quantized layers, in place.

    Every submodule whose class is one of those :func:`initialize` patches
    (``nn.Conv1d/2d/3d``, ``nn.ConvTranspose1d/2d/3d``, ``nn.Linear``,
    ``nn.MultiheadAttention``, ``nn.LSTM``, ``nn.LSTMCell``, ``nn.AvgPool*``,
    ``nn.AdaptiveAvgPool*``; exactly that class, not subclasses), transformers'
    ``Conv1D`` when transformers is loaded (:class:`~fakequant.nn.QuantConv1D`), or
    named in ``custom_quant_modules`` becomes its quantized class. The new modules
    share the old ones' parameters, buffers, hooks and train/eval mode: pretrained
    weights are kept and no weight is re-initialised. Embeddings and norms stay float.

    Args:
        model: the module to convert.
        quant_desc_input: descriptor of every input quantizer (default: each class's default).
        quant_desc_weight: descriptor of every weight quantizer (default: each class's default,
            per output channel).
        float_module_list: class names to leave in float, e.g. ``["Linear"]``.
        custom_quant_modules: extra ``(module, name, quant_class)`` entries; the class
            ``getattr(module, name)`` is converted to ``quant_class``, which must be a
            subclass of it (or accept its ``__dict__``).
        exclude: qualified submodule names (``fnmatch`` patterns such as ``"fc"`` or
            ``"layer4.*"``) to leave in float, with everything below them. Default
            (None): :data:`DEFAULT_EXCLUDE` (``*lm_head*`` and the other output heads and
            routers); ``[]`` converts everything.
        preset: a recipe's name (``"W8A8"``, ``"W4A8"``, ``"W4A16"``, ``"FP8"``, ``"NVFP4"``, ``"MXFP4"``,
            ...: :mod:`fakequant.models.presets`) or a :class:`~fakequant.models.presets.Preset`, giving both
            descriptors (a weight-only preset, ``W4A16``, disables the input quantizers); cannot
            be combined with ``quant_desc_input``/``quant_desc_weight``.
        quantize_attention: for a transformers model, also quantize the inputs of its
            attention matmuls (query, key, value: ``q_bmm_quantizer``, ``k_bmm_quantizer``,
            ``v_bmm_quantizer`` on each attention module, :mod:`fakequant.models.hf`). True uses the
            input descriptor; a ``QuantDescriptor`` gives theirs. Default False.
        target: the serving target whose rules the fake quantization follows, a choice made
            once for the whole model and recorded on every quantizer of it
            (:attr:`~fakequant.nn.TensorQuantizer.target`, which exporters read). ``"onnx"``
            (default): the library's rules, what ONNX Runtime, TensorRT and Model Optimizer
            compute. ``"vllm"``: compressed-tensors as vLLM serves it, where it differs
            (per-token int8 times the reciprocal of its scale, per-token FP8 with vLLM's floor
            on the scale, per-tensor FP8 activations times the reciprocal of their scale,
            NVFP4's global scale a divisor of the E4M3 block scales, MX activation block scales
            rounded to the nearest power of two): docs/serving.md, "Targets".

    Returns:
        ``model`` (a new object only when ``model`` itself is converted).
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    weight_only = False
    if preset is not None:
        if quant_desc_input is not None or quant_desc_weight is not None:
            raise ValueError("preset cannot be combined with quant_desc_input or quant_desc_weight")
        quant_desc_input, quant_desc_weight = presets.get(preset).descriptors()
        weight_only = quant_desc_input is None
        if weight_only and quantize_attention is True:
            raise ValueError(f"quantize_attention=True quantizes the attention inputs with the preset's input "
                             f"descriptor, and preset {preset!r} quantizes weights only: pass a QuantDescriptor")
    for name, desc in (("quant_desc_input", quant_desc_input), ("quant_desc_weight", quant_desc_weight)):
        if desc is not None and not isinstance(desc, QuantDescriptor):
            raise TypeError(f"{name} must be a QuantDescriptor or None, got {type(desc).__name__}")
    if not isinstance(quantize_attention, (bool, QuantDescriptor)):
        raise TypeError(f"quantize_attention must be a bool or a QuantDescriptor, got {quantize_attention!r}")
    if target not in TARGETS:
        raise ValueError(f"target must be one of {TARGETS}, got {target!r}")
    skip = _check_float_module_list(float_module_list)
    if exclude is None:
        exclude = list(DEFAULT_EXCLUDE)
    elif isinstance(exclude, str) or not all(isinstance(p, str) for p in exclude):
        raise TypeError(f"exclude must be a list of module-name patterns (str), got {exclude!r}")

    mapping = {}
    for entry in _DEFAULT_QUANT_MAP:
        if entry.mod_name not in skip:
            mapping[_FLOAT_CLASSES[(id(entry.orig_mod), entry.mod_name)]] = entry.replace_mod
    for entry in _check_custom(custom_quant_modules):
        original = _quant_module_helper_object.orginal_func_map.get((id(entry.orig_mod), entry.mod_name))
        float_cls = original[2] if original else getattr(entry.orig_mod, entry.mod_name)
        mapping[float_cls] = entry.replace_mod
    for float_cls, (name, quant_cls) in _optional_classes().items():
        if name not in skip:
            mapping.setdefault(float_cls, quant_cls)

    def excluded(qualified):
        return any(fnmatch.fnmatchcase(qualified, p) for p in exclude)

    def convert(module, qualified):
        if isinstance(module, _QUANTIZED) or (qualified and excluded(qualified)):
            return module
        quant_cls = mapping.get(type(module))
        if quant_cls is not None:
            converted = _convert(module, quant_cls, quant_desc_input, quant_desc_weight)
            if converted is None:
                return module
            if weight_only:
                _float_layers.disable_input_quantizers(converted)
            return converted
        for name, child in list(module.named_children()):
            new = convert(child, f"{qualified}.{name}" if qualified else name)
            if new is not child:
                setattr(module, name, new)
        return module

    converted = convert(model, "")
    experts.add_expert_quantizers(
        converted, None if weight_only else (quant_desc_input or quant_nn.QuantLinear.default_quant_desc_input),
        quant_desc_weight or quant_nn.QuantLinear.default_quant_desc_weight, skip=_float_layers.at_or_below(excluded))
    _float_layers.warn_left_in_float(converted, excluded, tuple(mapping), skip)
    if quantize_attention is not False:
        desc = quantize_attention if isinstance(quantize_attention, QuantDescriptor) else (
            quant_desc_input or quant_nn.QuantLinear.default_quant_desc_input)
        hf.add_attention_quantizers(converted, desc, skip=_float_layers.at_or_below(excluded))
    for name, quantizer in converted.named_modules():
        if isinstance(quantizer, TensorQuantizer) and quantizer.target != target:
            if any(part.endswith("weight_quantizer") for part in name.split(".")):
                quantizer._quantizes_weight = True  # the fused experts' weights: a target's activation rules do not apply
            try:
                quantizer.target = target
            except (ValueError, NotImplementedError) as e:
                raise type(e)(f"{name}: {e}") from None
    if pretrained.is_pretrained_model(converted):  # save_pretrained / from_pretrained keep the quantizers
        recipe: Dict[str, Any] = {
            "preset": preset if isinstance(preset, str) else None,
            "quant_desc_input": None if isinstance(preset, str) or quant_desc_input is None else quant_desc_input.dict(),
            "quant_desc_weight": None if isinstance(preset, str) or quant_desc_weight is None
            else quant_desc_weight.dict(),
            "exclude": list(exclude), "float_module_list": sorted(skip),
            "quantize_attention": quantize_attention.dict() if isinstance(quantize_attention, QuantDescriptor)
            else quantize_attention,
            "custom_quant_modules": bool(custom_quant_modules),
            "target": target,
        }
        pretrained.attach(converted, recipe)
    return converted


def unconverted(model: torch.nn.Module, usually_quantized: Optional[bool] = None) -> List[Tuple[str, str]]:
    """``[(qualified name, class name), ...]`` of the submodules that hold parameters of
    their own and are not quantized (nor inside a quantized module): what stayed in float
    after :func:`quantize_model` or under :func:`initialize`.

    Args:
        usually_quantized: None (default): all of them. True: only those whose weights
            recipes usually quantize (a parameter of two or more dimensions, or 1% or more
            of the model's parameters), less embeddings, norms and what
            :data:`DEFAULT_EXCLUDE` names (output heads, MoE routers). False: the others.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if usually_quantized is not None and not isinstance(usually_quantized, bool):
        raise TypeError(f"usually_quantized must be None or a bool, got {usually_quantized!r}")
    return _float_layers.float_layers(model, usually_quantized, DEFAULT_EXCLUDE)


pretrained.set_converter(quantize_model)
