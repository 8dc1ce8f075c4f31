"""compressed-tensors checkpoints (vLLM, SGLang, transformers): the codes and scales of
fakequant's weight quantizers, and the description of its input quantizers.

The layout is the one ``model.save_pretrained`` writes (safetensors shards, ``config.json``,
``generation_config.json``), with ``quantization_config`` in ``config.json`` (quant_method
``"compressed-tensors"``). compressed-tensors' own classes build that configuration
(``QuantizationArgs``, ``QuantizationScheme``, ``QuantizationConfig``), choose each
layer's storage format (``infer_module_format``), pack the codes (``pack_to_int32``,
``pack_fp4_to_uint8``) and write the configuration (``ModelCompressor.update_config``).
The codes and scales are asked of the rule the quantizer computes with
(``fakequant.composite.rules``: ``block_scales`` from amax to scales, per format, and
``element_codes``): the scales from the quantizer's amax, the codes from the quantizer's
output divided by them (on the element grid already: the rule's codes of the weight), and
then the format's dequantization of what is written is checked against the quantizer's
output, bit for bit, before anything is written (docs/serving.md).

Each quantizer is read through its public properties (``num_bits``, ``axis``,
``block_sizes``, ``scale_format``, ``amax``, ...); one the format cannot describe raises a
ValueError naming the quantizer and why, before anything is written. The model is walked into
its layers and MoE experts by what every format shares (``_plan.py``, ``_experts.py``); this
module is the format, ``CompressedTensors`` (registered as ``"compressed-tensors"``):
how it stores one planned layer, and the files.
"""
from __future__ import annotations

import os
import re
from typing import Any, Dict, List, Optional, Tuple, Union

import torch

from .. import _core
from ..composite import rules
from .._core import BlockScales
from ._base import LayerPlan, ServingFormat, bits_equal, format_named, refusal, register
from ._experts import ExpertsPlan
from ._hf import check_arguments, save
from ._plan import ModelPlan, plan_model
from ._scales import (check_common, codes_of, expand, group_amax, last_axis_block, nvfp4, one_level, static_amax,
                      tensor_amax_of_blocks)

__all__ = ["LayerPlan", "export_compressed_tensors", "plan"]

_E4M3 = (4, 3)
_E2M1 = (2, 1)
_NVFP4_BLOCK = 16
_MX_BLOCK = 32


# --- weights: NVFP4's global scale --------------------------------------------------------


def _search_global_scale(g: torch.Tensor, block_codes: torch.Tensor, codes: torch.Tensor,
                         target: torch.Tensor) -> Optional[torch.Tensor]:
    """A float32 global scale G for NVFP4 weights. The format divides each E4M3 block scale c by
    G where fakequant multiplies it by g, so fp32(1 / g) or a neighbour is searched for one whose
    dequantization ``codes * fp32(c / G)``, rounded to the weight's dtype, equals ``target`` (the
    quantizer's output) bit for bit; preferably one with fp32(c / G) == fp32(c * g) for every c.
    None if there is none."""
    first = (torch.ones((), dtype=torch.float32) / g).reshape(())
    candidates = [first]
    up, down = first, first
    for _ in range(64):
        up = torch.nextafter(up, torch.tensor(float("inf")))
        down = torch.nextafter(down, torch.tensor(0.0))
        candidates += [up, down]
    c = block_codes.float().unique()
    c = c[c > 0]
    same_scales = [G for G in candidates if torch.equal((c / G).view(torch.int32), (c * g).view(torch.int32))]
    for G in same_scales + candidates:
        dequant = (codes * expand(block_codes.float() / G, codes)).to(target.dtype)
        if bits_equal(dequant, target):
            return G.reshape(1)
    return None


@register
class CompressedTensors(ServingFormat):
    """compressed-tensors (vLLM, SGLang, transformers): each layer's weights as the codes and
    scales of a ``QuantizationArgs``, its inputs as their arguments and static scales."""

    name = "compressed-tensors"
    package = "compressed_tensors"
    distribution = "compressed-tensors"
    #: "onnx": the library's rules, written as trained (the weights bit for bit; where vLLM's
    #: activation rules differ, docs/serving.md has the difference); "vllm": vLLM's own
    targets = ("onnx", "vllm")
    per_expert_weight_quantizers = ("expert weights with a global scale per expert (NVFP4): transformers' "
                                    "compressed-tensors loader decompresses packed experts without their "
                                    "weight_global_scale")

    def weight(self, where: str, q: Any, weight: torch.Tensor
               ) -> Tuple[Dict[str, Any], Dict[str, torch.Tensor], torch.Tensor]:
        """(weight QuantizationArgs fields, tensors, the format's dequantized weight in float32)."""
        check_common(self, where, q)
        w = weight.detach().float().cpu()
        with torch.no_grad():
            y = q(w)  # the quantizer's output before its rounding to the weight's dtype
        fmt = q.num_bits
        block = last_axis_block(q, 2)
        if block is not None and not block[0]:
            raise self.refuse(where, f"block_sizes={q.block_sizes}: the format's groups run along the input "
                                     "features only")
        size = None if block is None else block[1]
        if size is None and block is not None:
            raise self.refuse(where, "one block per row (block_sizes {-1: None}): use axis=0 for per-channel weights")
        tensors: Dict[str, torch.Tensor] = {}

        num_bits, exponent_bits = rules.block_element(fmt)

        if isinstance(fmt, int) or fmt == _E4M3 and q.scale_format is None:
            # one level: s = fp32(amax) / bound (int: 2^(b-1) - 1, E4M3: 448); amax <= 2^-24 gives 0
            bits = fmt if isinstance(fmt, int) else 0
            is_int = bits > 0
            if is_int and not 2 <= bits <= 8:
                raise self.refuse(where, f"num_bits={fmt}: the format stores integers of 2 to 8 bits")
            if q.scale_format is not None:
                raise self.refuse(where, f"integer elements with scale_bits={q.scale_bits}")
            scale, codes, strategy = one_level(self, where, q, w, y, size)
            args: Dict[str, Any] = {"strategy": strategy}
            if size is not None:
                args["group_size"] = size
            stored = codes.to(torch.int8) if is_int else codes.to(torch.float8_e4m3fn)
            args.update(num_bits=bits if is_int else 8, type="int" if is_int else "float", symmetric=True,
                        dynamic=False)
            tensors["weight"], tensors["weight_scale"] = stored, scale
            dequant = stored.float() * expand(scale, w)
            return args, tensors, dequant

        if fmt not in (_E2M1, _E4M3) or q.scale_format not in (BlockScales.E4M3, BlockScales.E8M0):
            raise self.refuse(where, f"num_bits={fmt} with scale_bits={q.scale_bits}: the format has E4M3 and E2M1 "
                                     "elements (FP8, NVFP4, MXFP4, MXFP8)")
        if q.scale_format is BlockScales.E8M0:
            # MX: s = 2^clamp(floor(log2 amax) - emax, -127, 127), stored as the biased exponent
            if size != _MX_BLOCK:
                raise self.refuse(where, f"MX blocks of {size}: the format's MX groups are {_MX_BLOCK}")
            amax = group_amax(self, where, q, w, size)
            scale, _, tensors["weight_scale"], _ = rules.block_scales(amax, num_bits, False, exponent_bits,
                                                                          BlockScales.E8M0)
            codes = codes_of(q, y, scale)
            args = {"strategy": "group", "group_size": size, "scale_dtype": "torch.uint8", "zp_dtype": "torch.uint8"}
            effective = scale
        else:
            # NVFP4: the quantizer's target's rule (_scales.nvfp4); the format divides the E4M3 codes by G
            if fmt != _E2M1 or size != _NVFP4_BLOCK:
                raise self.refuse(where, f"num_bits={fmt} in blocks of {size} with E4M3 block scales: the format's "
                                         f"NVFP4 is E2M1 in groups of {_NVFP4_BLOCK}")
            codes, tensors["weight_scale"], g, divides = nvfp4(self, where, q, w, y, size)
            if divides:  # target="vllm": the format's own rule, G = 2688 / amax
                global_scale = g.reshape(1)
            else:  # target="onnx": fakequant multiplies by g; search a G for it
                with torch.no_grad():
                    target = q(weight.detach().cpu())  # (what exact_weight compares with)
                found = _search_global_scale(g, tensors["weight_scale"], codes, target)
                if found is None:
                    raise self.refuse(where, f"no float32 global scale G makes the format's block scales (E4M3 code "
                                             f"/ G) reproduce fakequant's (E4M3 code * {g.item()!r}) in "
                                             f"{target.dtype} weights (compressed-tensors decompresses FP4 weights to "
                                             "bfloat16: export a bfloat16 model, model.to(torch.bfloat16); or train "
                                             "with quantize_model(target='vllm'), whose block scales are the format's)")
                global_scale = found
            tensors["weight_global_scale"] = global_scale
            args = {"strategy": "tensor_group", "group_size": size, "scale_dtype": "torch.float8_e4m3fn",
                    "zp_dtype": "torch.float8_e4m3fn"}
            effective = tensors["weight_scale"].float() / global_scale
        if fmt == _E2M1:
            tensors["weight"] = codes  # E2M1 values, packed when the format is chosen
            dequant = codes * expand(effective, w)
        else:
            tensors["weight"] = codes.to(torch.float8_e4m3fn)
            dequant = tensors["weight"].float() * expand(effective, w)
        args.update(num_bits=4 if fmt == _E2M1 else 8, type="float", symmetric=True, dynamic=False)
        return args, tensors, dequant

    def input(self, where: str, q: Any) -> Tuple[Optional[Dict[str, Any]], Dict[str, torch.Tensor]]:
        """(input QuantizationArgs fields or None, tensors: a static scale)."""
        if not q.is_enabled:
            return None, {}
        check_common(self, where, q)
        if q.learn_amax:
            raise self.refuse(where, "a learned range: fakequant clips the inputs to its bounds before quantizing, the "
                                     "format clamps them to the full signed range")
        if q.narrow_range and isinstance(q.num_bits, int):
            limit = _core.amax_bound(q.num_bits)
            raise self.refuse(where, f"a narrow range [-{limit}, {limit}]: "
                                     "the format rounds activations to the full signed range")
        fmt = q.num_bits
        block = last_axis_block(q, 2)
        bits = fmt if isinstance(fmt, int) else 0
        is_int = bits > 0
        if is_int and not 2 <= bits <= 8:
            raise self.refuse(where, f"num_bits={fmt}: the format's integer activations have 2 to 8 bits")
        if not is_int and fmt not in (_E4M3, _E2M1):
            raise self.refuse(where, f"num_bits={fmt}: the format's float activations are E4M3 and E2M1")
        base = {"num_bits": bits if is_int else (4 if fmt == _E2M1 else 8), "type": "int" if is_int else "float",
                "symmetric": True}
        if q.scale_format is None and (is_int or fmt == _E4M3):
            if block == (True, None) and q.dynamic:
                return {**base, "strategy": "token", "dynamic": True}, {}
            if block is None and q.axis is None:
                static = static_amax(q)
                if static is None:
                    return {**base, "strategy": "tensor", "dynamic": True}, {}
                if static.numel() != 1:
                    raise self.refuse(where, f"an amax of shape {tuple(static.shape)} with axis=None")
                bound = float(_core.amax_bound(bits)) if is_int else _core.float_format_max(_E4M3)
                scale = rules.amax_scale(static.reshape(1), bound)
                return {**base, "strategy": "tensor", "dynamic": False}, {"input_scale": scale}
            raise self.refuse(where, f"axis={q.axis!r}, block_sizes={q.block_sizes}: the format's activation "
                                     "scales are per tensor or per token (block_sizes {-1: None}, dynamic)")
        if q.scale_format is BlockScales.E4M3 and fmt == _E2M1 and block == (True, _NVFP4_BLOCK):
            tensor_amax = tensor_amax_of_blocks(q)
            if tensor_amax is None:
                raise self.refuse(where, "NVFP4 activations without a calibrated per-tensor amax: the format's global "
                                         "activation scale is static (calibrate first: fakequant.calibrate)")
            global_scale = rules.vllm_nvfp4_global_scale(tensor_amax.reshape(1))  # compressed-tensors' G
            return ({**base, "strategy": "tensor_group", "dynamic": "local", "group_size": _NVFP4_BLOCK,
                     "scale_dtype": "torch.float8_e4m3fn", "zp_dtype": "torch.float8_e4m3fn"},
                    {"input_global_scale": global_scale})
        if q.scale_format is BlockScales.E8M0 and block == (True, _MX_BLOCK):
            return ({**base, "strategy": "group", "dynamic": True, "group_size": _MX_BLOCK,
                     "scale_dtype": "torch.uint8", "zp_dtype": "torch.uint8"}, {})
        raise self.refuse(where, f"num_bits={fmt}, block_sizes={q.block_sizes}, scale_bits={q.scale_bits}: no "
                                 "activation scheme of the format matches")

    def export(self, model: torch.nn.Module, directory: Any, **kwargs: Any) -> Dict[str, Any]:
        return export_compressed_tensors(model, directory, **kwargs)


# --- the model ---------------------------------------------------------------------------


def plan(model: torch.nn.Module) -> Tuple[Dict[str, LayerPlan], List[str]]:
    """``({qualified name: LayerPlan} of the quantized Linear layers and expert projections,
    [qualified names of the float Linear layers and routers]})``: what
    :func:`export_compressed_tensors` writes, computed without writing anything (the experts
    of a MoE layer by their names in the checkpoint, ``...experts.E.gate_proj``: see
    ``fakequant/serve/_experts.py``). Raises ValueError naming the first quantizer the format
    cannot describe."""
    planned = _plan(model)
    return planned.plans, planned.ignore


def _plan(model: torch.nn.Module) -> ModelPlan:
    planned = plan_model(model, format_named(CompressedTensors.name))
    if not planned.plans:
        raise ValueError("model has no quantized Linear layer (convert it with fakequant.quantize_model first)")
    return planned


def _scheme_key(p: LayerPlan) -> str:
    """What makes two layers' schemes one config group: their weights' and inputs' arguments."""
    return repr((sorted(p.weights.items()), sorted((p.inputs or {}).items())))


def _scheme_groups(ct: Any, plans: Dict[str, LayerPlan], ignore: List[str], experts: Optional[Any] = None
                   ) -> Tuple[Dict[str, Any], Dict[str, str]]:
    """compressed-tensors' config groups ({group name: QuantizationScheme}) and each layer's format.
    With several groups, the experts of each MoE module are named by one ``re:`` target
    (``re:^<module>\\.\\d+\\.(gate_proj|up_proj|down_proj)$``), the form transformers reads as
    the experts' group (``get_experts_scheme``)."""
    from compressed_tensors.compressors.format import infer_module_format
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    kinds: Dict[str, List[str]] = {}
    specs: Dict[str, Tuple[Dict[str, Any], Optional[Dict[str, Any]]]] = {}
    for name, p in plans.items():
        key = _scheme_key(p)
        kinds.setdefault(key, []).append(name)
        specs[key] = (p.weights, p.inputs)
    groups: Dict[str, Any] = {}
    formats: Dict[str, str] = {}
    single = len(kinds) == 1
    for i, (key, names) in enumerate(kinds.items()):
        w_args, i_args = specs[key]
        # one scheme: every Linear not ignored (by its full name); several: each layer by its full name
        targets = ["Linear"] if single else _targets(names, experts)
        scheme = QuantizationScheme(targets=targets, weights=QuantizationArgs(**w_args),
                                    input_activations=None if i_args is None else QuantizationArgs(**i_args))
        fmt = infer_module_format(torch.nn.Linear, scheme).value
        scheme.format = fmt
        groups[f"group_{i}"] = scheme
        for name in names:
            formats[name] = fmt
    return groups, formats


def _targets(names: List[str], experts: Optional[Any]) -> List[str]:
    """The full names of a group's Linear layers, and a ``re:`` target per MoE module for its experts."""
    modules = {} if experts is None else dict(experts.modules.values())
    grouped = {n: prefix for prefix, members in modules.items() for n in members}
    targets = [n for n in names if n not in grouped]
    for prefix in dict.fromkeys(grouped[n] for n in names if n in grouped):
        parts = sorted({n.rsplit(".", 1)[1] for n in modules[prefix]})
        targets.append(f"re:^{re.escape(prefix)}\\.\\d+\\.({'|'.join(parts)})$")
    return targets


#: The storage formats whose experts transformers' compressed-tensors loader dequantizes
#: (``CompressedTensorsDequantize`` in ``transformers.integrations.compressed_tensors``):
#: FP8 weights times their float32 scales, and packed codes (``weight_packed``, ``weight_scale``,
#: ``weight_shape``) through compressed-tensors' decompressor. Not: ``int-quantized`` (it reads
#: only ``weight_packed`` for non-FP8 experts), ``mxfp8-quantized`` (it multiplies FP8 weights by
#: their scales as floats, where MXFP8's are uint8 exponents), ``nvfp4-pack-quantized`` (no
#: ``weight_global_scale``: refused earlier, by the quantizer).
LOADABLE_FORMATS = ("float-quantized", "pack-quantized", "mxfp4-pack-quantized")


def check_expert_formats(experts: ExpertsPlan, formats: Dict[str, str], first_format: str) -> None:
    """Refuses experts transformers could not load: several schemes among the experts (it
    dequantizes every expert with one config group), a storage format it does not dequantize
    for experts (:data:`LOADABLE_FORMATS`), or float experts beside a scheme of packed experts
    (that scheme's, or without quantized experts the first group's, ``first_format``: it reads
    only the packed tensors of every expert)."""
    names = [n for _, members in experts.modules.values() for n in members]
    fmt = formats[names[0]] if names else first_format
    if experts.floats and fmt != "float-quantized":
        raise refusal(experts.floats[0], f"experts left in float beside {fmt!r} weights: transformers' "
                                         "compressed-tensors loader dequantizes every expert with one "
                                         "scheme and drops float expert weights unless it is FP8 "
                                         "('float-quantized'); quantize the experts too")
    first_key = _scheme_key(experts.plans[names[0]]) if names else None
    for module, (_, members) in experts.modules.items():
        if any(_scheme_key(experts.plans[n]) != first_key for n in members):
            raise refusal(module, "experts quantized with different schemes (transformers loads every expert "
                                  "of a model with one config group)")
        fmt = formats[members[0]]
        if fmt not in LOADABLE_FORMATS:
            raise refusal(module, f"experts stored as {fmt!r}: transformers' compressed-tensors loader "
                                  f"dequantizes experts stored as {list(LOADABLE_FORMATS)} only")


def _stored(ct: Any, fmt: str, tensors: Dict[str, torch.Tensor], w_args: Dict[str, Any], shape: Tuple[int, ...]) -> Dict[str, torch.Tensor]:
    """The layer's tensors as the format stores them (the codes packed where it packs them)."""
    from compressed_tensors.compressors.nvfp4.helpers import pack_fp4_to_uint8
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

    out = dict(tensors)
    if fmt in ("int-quantized", "naive-quantized", "float-quantized", "mxfp8-quantized"):
        return out
    codes = out.pop("weight")
    if fmt == "pack-quantized":
        out["weight_packed"] = pack_to_int32(codes, w_args["num_bits"])
        out["weight_shape"] = torch.tensor(list(shape), dtype=torch.int64)
        return out
    if fmt in ("nvfp4-pack-quantized", "mxfp4-pack-quantized"):
        out["weight_packed"] = pack_fp4_to_uint8(codes)
        return out
    raise ValueError(f"compressed-tensors chose the format {fmt!r}, which this exporter does not write")


def export_compressed_tensors(model: torch.nn.Module, directory: Union[str, "os.PathLike[str]"],
                              tokenizer: Any = None, max_shard_size: Union[int, str] = "5GB") -> Dict[str, Any]:
    """Writes ``model`` as a compressed-tensors checkpoint in ``directory`` (the layout of
    ``model.save_pretrained``; load it with ``transformers.AutoModelForCausalLM.from_pretrained``
    or ``vllm serve``).

    Args:
        model: a transformers ``PreTrainedModel`` converted with :func:`fakequant.quantize_model`
            (and calibrated where its quantizers are static).
        directory: the folder to write.
        tokenizer: written beside the model when given (its ``save_pretrained``).
        max_shard_size: passed to ``save_pretrained``.

    Returns:
        The ``quantization_config`` written to ``config.json`` (a dict).

    Every quantized weight is written as the codes and scales of its quantizer (checked to
    dequantize to the quantizer's output bit for bit); every Linear left in float is listed
    in ``ignore`` by its full name. A quantizer the format cannot describe raises a ValueError
    that names it, before anything is written.
    """
    check_arguments(model, directory, tokenizer)
    ct = format_named(CompressedTensors.name).library()
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationConfig

    plans, ignore, experts = _plan(model)
    groups, formats = _scheme_groups(ct, plans, ignore, experts)
    check_expert_formats(experts, formats, next(iter(groups.values())).format)
    single_format = set(formats.values())
    config = QuantizationConfig(config_groups=groups, ignore=ignore, quantization_status="compressed",
                                format=single_format.pop() if len(single_format) == 1 else "mixed-precision")

    stored = {name: _stored(ct, formats[name], p.tensors, p.weights, p.shape) for name, p in plans.items()}
    save(model, directory, stored, experts.replaced, tokenizer, max_shard_size)
    ModelCompressor(quantization_config=config).update_config(os.fspath(directory))
    return dict(config.model_dump(exclude={"quant_method"}), quant_method="compressed-tensors")
