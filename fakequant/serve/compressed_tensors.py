"""compressed-tensors checkpoints (vLLM, SGLang, transformers): the codes and scales of
fakequant's weight quantizers, and the description of its input quantizers.

The layout is the one ``model.save_pretrained`` writes (safetensors shards, ``config.json``,
``generation_config.json``), with ``quantization_config`` in ``config.json`` (quant_method
``"compressed-tensors"``). compressed-tensors' own classes build that configuration
(``QuantizationArgs``, ``QuantizationScheme``, ``QuantizationConfig``), choose each
layer's storage format (``infer_module_format``), pack the codes (``pack_to_int32``,
``pack_fp4_to_uint8``) and write the configuration (``ModelCompressor.update_config``).
The codes and scales are asked of the rule the quantizer computes with
(``fakequant.reference``: ``block_scales`` from amax to scales, per format, and
``element_codes``): the scales from the quantizer's amax, the codes from the quantizer's
output divided by them (on the element grid already: the rule's codes of the weight), and
then the format's dequantization of what is written is checked against the quantizer's
output, bit for bit, before anything is written (docs/serving.md).

Each quantizer is read through its public properties (``num_bits``, ``axis``,
``block_sizes``, ``scale_format``, ``amax``, ...); one the format cannot describe raises a
ValueError naming the quantizer and why, before anything is written.
"""
from __future__ import annotations

import os
import re
from typing import Any, Dict, List, NamedTuple, Optional, Tuple, Union

import torch

from .. import _core, pretrained, reference
from .._core import BlockScales
from .. import nn as quant_nn
from ..nn.tensor_quantizer import TensorQuantizer

__all__ = ["LayerPlan", "export_compressed_tensors", "plan"]

_E4M3 = (4, 3)
_E2M1 = (2, 1)
_NVFP4_BLOCK = 16
_MX_BLOCK = 32


def _import_ct() -> Any:
    try:
        import compressed_tensors
    except ImportError as e:
        raise ImportError("format='compressed-tensors' needs the compressed-tensors package "
                          "(pip install 'fakequant[serve]')") from e
    return compressed_tensors


class _Refused(ValueError):
    pass


def _refuse(where: str, why: str) -> _Refused:
    return _Refused(f"{where}: {why}; compressed-tensors cannot describe it (nothing was written)")


class LayerPlan(NamedTuple):
    """What is written for one quantized Linear: compressed-tensors' arguments of its weights
    and inputs (dicts of ``QuantizationArgs`` fields) and its tensors (local names)."""

    weights: Dict[str, Any]
    inputs: Optional[Dict[str, Any]]
    tensors: Dict[str, torch.Tensor]
    shape: Tuple[int, ...]


# --- the parts of a quantizer every format refuses -------------------------------------


def _check_common(where: str, q: TensorQuantizer) -> None:
    if q.unsigned:
        raise _refuse(where, "an unsigned range: the format's integers and floats are signed")
    if q.pre_quant_scale is not None:
        raise _refuse(where, "a pre_quant_scale (the format has no per-channel input scaling)")
    if q.centered:
        raise _refuse(where, "asymmetric ('max_min' bias) blocks: the format's zero points round another way")


def _static_amax(q: TensorQuantizer) -> Optional[torch.Tensor]:
    """The quantizer's amax when it is fixed (calibrated, set, or learned: the larger
    magnitude of its clip bounds), else None (computed per input)."""
    if q.learn_amax:
        low, high = (b.detach().float().cpu().reshape(()) for b in q.clip.bounds())
        return torch.maximum(-low, high)
    amax = q.amax
    return None if amax is None or q.dynamic else amax.detach().float().cpu()


def _tensor_amax_of_blocks(q: TensorQuantizer) -> Optional[torch.Tensor]:
    """The per-tensor amax that E4M3 block scales are relative to (``BlockScales.E4M3``), when
    calibrated or set (dynamic blocks read it too); None when each input gives its own."""
    amax = q.amax
    return None if amax is None or amax.numel() != 1 else amax.detach().float().cpu().reshape(())


def _last_axis_block(q: TensorQuantizer, ndim: int) -> Optional[Tuple[bool, Optional[int]]]:
    """``(True, size)`` when the quantizer's blocks run along the last axis only (size None:
    the whole axis); None when it has no blocks; refuses other layouts by returning (False, None)."""
    blocks = q.block_sizes
    if blocks is None:
        return None
    if len(blocks) != 1:
        return False, None
    (axis, size), = blocks.items()
    return (axis in (-1, ndim - 1)), size


# --- weights ------------------------------------------------------------------------------


def _per_row_or_tensor_amax(where: str, q: TensorQuantizer, w: torch.Tensor) -> Tuple[torch.Tensor, str]:
    """amax of a per-tensor (shape (1,)) or per-output-channel (shape (out, 1)) weight quantizer."""
    axis = q.axis
    static = _static_amax(q)
    if axis is None:
        amax = static if static is not None else w.abs().amax()
        if amax.numel() != 1:
            raise _refuse(where, f"an amax of shape {tuple(amax.shape)} with axis=None")
        return amax.reshape(1), "tensor"
    if axis in (0, -2):
        amax = static if static is not None else w.abs().amax(dim=1)
        if amax.numel() != w.shape[0]:
            raise _refuse(where, f"an amax of shape {tuple(amax.shape)} for {w.shape[0]} output channels")
        return amax.reshape(-1, 1), "channel"
    raise _refuse(where, f"axis={axis!r}: the format's scales are per tensor, per output channel (axis 0) "
                         "or per group of input features")


def _group_amax(where: str, q: TensorQuantizer, w: torch.Tensor, size: int) -> torch.Tensor:
    """amax per group of ``size`` input features, shape (out, in / size)."""
    out_f, in_f = w.shape
    if in_f % size:
        raise _refuse(where, f"blocks of {size} along {in_f} input features (the format's groups divide the "
                             "input features exactly)")
    static = _static_amax(q)
    if static is not None and static.numel() == out_f * (in_f // size):
        return static.reshape(out_f, in_f // size)
    if static is not None and not (q.scale_format is BlockScales.E4M3 and static.numel() == 1):
        raise _refuse(where, f"a static block amax of shape {tuple(static.shape)}")
    return w.reshape(out_f, in_f // size, size).abs().amax(dim=-1)


def _expand(scale: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """A (1,), (out, 1) or (out, groups) scale broadcast over the weight's elements."""
    if scale.dim() == 2 and scale.shape[1] not in (1, w.shape[1]):
        return scale.repeat_interleave(w.shape[1] // scale.shape[1], dim=1)
    return scale


def _divide_out(y: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """y / scale where the scale is not 0 (its codes are 0 there, keeping y's sign)."""
    s = _expand(scale, y)
    return torch.where(s == 0, y, y / torch.where(s == 0, torch.ones_like(s), s))


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
        dequant = (codes * _expand(block_codes.float() / G, codes)).to(target.dtype)
        if _bits_equal(dequant, target):
            return G.reshape(1)
    return None


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.contiguous().view(-1).view(torch.uint8), b.contiguous().view(-1).view(torch.uint8))


def _weight_plan(where: str, q: Any, weight: torch.Tensor
                 ) -> Tuple[Dict[str, Any], Dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    """(weight QuantizationArgs fields, tensors, the format's dequantized weight in float32,
    the quantizer's output in the weight's dtype)."""
    _check_common(where, q)
    if weight.dim() != 2:
        raise _refuse(where, f"a weight of {weight.dim()} dimensions")
    w = weight.detach().float().cpu()
    with torch.no_grad():
        y = q(w)  # the quantizer's output before its rounding to the weight's dtype
        target = q(weight.detach().cpu())
    fmt = q.num_bits
    block = _last_axis_block(q, 2)
    if block is not None and not block[0]:
        raise _refuse(where, f"block_sizes={q.block_sizes}: the format's groups run along the input features only")
    size = None if block is None else block[1]
    if size is None and block is not None:
        raise _refuse(where, "one block per row (block_sizes {-1: None}): use axis=0 for per-channel weights")
    tensors: Dict[str, torch.Tensor] = {}

    num_bits, exponent_bits = reference.block_element(fmt)

    def codes_of(scale: torch.Tensor) -> torch.Tensor:
        # the rule's codes of the quantizer's output (y / s is within an ulp of a code; where s
        # is 0, a degenerate block, y is)
        return reference.element_codes(_divide_out(y, scale), num_bits, False, q.narrow_range, exponent_bits)[0]

    if isinstance(fmt, int) or fmt == _E4M3 and q.scale_format is None:
        # one level: s = fp32(amax) / bound (int: 2^(b-1) - 1, E4M3: 448); amax <= 2^-24 gives 0
        bits = fmt if isinstance(fmt, int) else 0
        is_int = bits > 0
        if is_int and not 2 <= bits <= 8:
            raise _refuse(where, f"num_bits={fmt}: the format stores integers of 2 to 8 bits")
        if q.scale_format is not None:
            raise _refuse(where, f"integer elements with scale_bits={q.scale_bits}")
        if size is None:
            amax, strategy = _per_row_or_tensor_amax(where, q, w)
            args: Dict[str, Any] = {"strategy": strategy}
        else:
            amax = _group_amax(where, q, w, size)
            args = {"strategy": "group", "group_size": size}
        scale = reference.block_scales(amax, num_bits, False, exponent_bits).scale
        codes = codes_of(scale)
        stored = codes.to(torch.int8) if is_int else codes.to(torch.float8_e4m3fn)
        args.update(num_bits=bits if is_int else 8, type="int" if is_int else "float", symmetric=True,
                    dynamic=False)
        tensors["weight"], tensors["weight_scale"] = stored, scale
        dequant = stored.float() * _expand(scale, w)
        return args, tensors, dequant, target

    if fmt not in (_E2M1, _E4M3) or q.scale_format not in (BlockScales.E4M3, BlockScales.E8M0):
        raise _refuse(where, f"num_bits={fmt} with scale_bits={q.scale_bits}: the format has E4M3 and E2M1 "
                             "elements (FP8, NVFP4, MXFP4, MXFP8)")
    if q.scale_format is BlockScales.E8M0:
        # MX: s = 2^clamp(floor(log2 amax) - emax, -127, 127), stored as the biased exponent
        if size != _MX_BLOCK:
            raise _refuse(where, f"MX blocks of {size}: the format's MX groups are {_MX_BLOCK}")
        amax = _group_amax(where, q, w, size)
        scale, _, tensors["weight_scale"], _ = reference.block_scales(amax, num_bits, False, exponent_bits,
                                                                      BlockScales.E8M0)
        codes = codes_of(scale)
        args = {"strategy": "group", "group_size": size, "scale_dtype": "torch.uint8", "zp_dtype": "torch.uint8"}
        effective = scale
    else:
        # NVFP4: s = e4m3(fp32(amax / 6) / g) * g, g = fp32(scale_amax) / (6 * 448)
        if fmt != _E2M1 or size != _NVFP4_BLOCK:
            raise _refuse(where, f"num_bits={fmt} in blocks of {size} with E4M3 block scales: the format's "
                                 f"NVFP4 is E2M1 in groups of {_NVFP4_BLOCK}")
        amax = _group_amax(where, q, w, size)
        scale_amax = _tensor_amax_of_blocks(q)
        scale_amax = w.abs().amax() if scale_amax is None else scale_amax
        scale, degenerate, block_codes, g = reference.block_scales(amax, num_bits, False, exponent_bits,
                                                                   BlockScales.E4M3, scale_amax)
        assert g is not None  # (two levels)
        scale = torch.where(degenerate, torch.zeros_like(scale), scale)
        codes = codes_of(scale)
        tensors["weight_scale"] = torch.where(degenerate, torch.zeros_like(block_codes),
                                              block_codes).to(torch.float8_e4m3fn)
        global_scale = _search_global_scale(g, tensors["weight_scale"], codes, target)
        if global_scale is None:
            raise _refuse(where, f"no float32 global scale G makes the format's block scales (E4M3 code / G) "
                                 f"reproduce fakequant's (E4M3 code * {g.item()!r}) in {target.dtype} weights "
                                 "(compressed-tensors decompresses FP4 weights to bfloat16: export a bfloat16 "
                                 "model, model.to(torch.bfloat16))")
        tensors["weight_global_scale"] = global_scale
        args = {"strategy": "tensor_group", "group_size": size, "scale_dtype": "torch.float8_e4m3fn",
                "zp_dtype": "torch.float8_e4m3fn"}
        effective = tensors["weight_scale"].float() / global_scale
    if fmt == _E2M1:
        tensors["weight"] = codes  # E2M1 values, packed when the format is chosen
        dequant = codes * _expand(effective, w)
    else:
        tensors["weight"] = codes.to(torch.float8_e4m3fn)
        dequant = tensors["weight"].float() * _expand(effective, w)
    args.update(num_bits=4 if fmt == _E2M1 else 8, type="float", symmetric=True, dynamic=False)
    return args, tensors, dequant, target


def _exact_weight_plan(where: str, q: Any, weight: torch.Tensor
                       ) -> Tuple[Dict[str, Any], Dict[str, torch.Tensor], torch.Tensor]:
    """(weight QuantizationArgs fields, tensors, the quantizer's output in the weight's dtype),
    refused unless the format's dequantization of the tensors is that output bit for bit."""
    w_args, tensors, dequant, fake = _weight_plan(where, q, weight)
    if not _bits_equal(dequant.to(fake.dtype), fake):
        raise _refuse(where, "its codes times its scales do not reproduce its output "
                             "bit for bit (a rule this exporter does not know)")
    return w_args, tensors, fake


# --- inputs -------------------------------------------------------------------------------


def _input_plan(where: str, q: TensorQuantizer) -> Tuple[Optional[Dict[str, Any]], Dict[str, torch.Tensor]]:
    if not q.is_enabled:
        return None, {}
    _check_common(where, q)
    if q.learn_amax:
        raise _refuse(where, "a learned range: fakequant clips the inputs to its bounds before quantizing, the "
                             "format clamps them to the full signed range")
    if q.narrow_range and isinstance(q.num_bits, int):
        raise _refuse(where, f"a narrow range [-{_core.amax_bound(q.num_bits)}, {_core.amax_bound(q.num_bits)}]: "
                             "the format rounds activations to the full signed range")
    fmt = q.num_bits
    block = _last_axis_block(q, 2)
    bits = fmt if isinstance(fmt, int) else 0
    is_int = bits > 0
    if is_int and not 2 <= bits <= 8:
        raise _refuse(where, f"num_bits={fmt}: the format's integer activations have 2 to 8 bits")
    if not is_int and fmt not in (_E4M3, _E2M1):
        raise _refuse(where, f"num_bits={fmt}: the format's float activations are E4M3 and E2M1")
    base = {"num_bits": bits if is_int else (4 if fmt == _E2M1 else 8), "type": "int" if is_int else "float",
            "symmetric": True}
    if q.scale_format is None and (is_int or fmt == _E4M3):
        if block == (True, None) and q.dynamic:
            return {**base, "strategy": "token", "dynamic": True}, {}
        if block is None and q.axis is None:
            static = _static_amax(q)
            if static is None:
                return {**base, "strategy": "tensor", "dynamic": True}, {}
            if static.numel() != 1:
                raise _refuse(where, f"an amax of shape {tuple(static.shape)} with axis=None")
            bound = float(_core.amax_bound(bits)) if is_int else _core.float_format_max(_E4M3)
            scale = reference.amax_scale(static.reshape(1), bound)
            return {**base, "strategy": "tensor", "dynamic": False}, {"input_scale": scale}
        raise _refuse(where, f"axis={q.axis!r}, block_sizes={q.block_sizes}: the format's activation scales are "
                             "per tensor or per token (block_sizes {-1: None}, dynamic)")
    if q.scale_format is BlockScales.E4M3 and fmt == _E2M1 and block == (True, _NVFP4_BLOCK):
        tensor_amax = _tensor_amax_of_blocks(q)
        if tensor_amax is None:
            raise _refuse(where, "NVFP4 activations without a calibrated per-tensor amax: the format's global "
                                 "activation scale is static (calibrate first: fakequant.calibrate)")
        amax = tensor_amax.reshape(1)
        global_scale = torch.full_like(amax, _core.float_format_max(_E4M3) * _core.float_format_max(_E2M1)) / amax
        return ({**base, "strategy": "tensor_group", "dynamic": "local", "group_size": _NVFP4_BLOCK,
                 "scale_dtype": "torch.float8_e4m3fn", "zp_dtype": "torch.float8_e4m3fn"},
                {"input_global_scale": global_scale})
    if q.scale_format is BlockScales.E8M0 and block == (True, _MX_BLOCK):
        return ({**base, "strategy": "group", "dynamic": True, "group_size": _MX_BLOCK,
                 "scale_dtype": "torch.uint8", "zp_dtype": "torch.uint8"}, {})
    raise _refuse(where, f"num_bits={fmt}, block_sizes={q.block_sizes}, scale_bits={q.scale_bits}: no activation "
                         "scheme of the format matches")


# --- the model ---------------------------------------------------------------------------


def _quantizers_outside(model: torch.nn.Module, linears: Dict[str, quant_nn.QuantLinear]) -> List[str]:
    """The enabled quantizers that are not a QuantLinear's own nor a fused-experts module's
    (attention, convolutions, ...)."""
    from ..experts import is_fused_experts

    experts = tuple(f"{name}." for name, m in model.named_modules() if is_fused_experts(m))
    found = []
    for name, module in model.named_modules():
        if isinstance(module, TensorQuantizer) and module.is_enabled:
            owner = name.rsplit(".", 1)[0] if "." in name else ""
            if owner not in linears and not name.startswith(experts):
                found.append(name)
    return found


def plan(model: torch.nn.Module) -> Tuple[Dict[str, LayerPlan], List[str]]:
    """``({qualified name: LayerPlan} of the quantized Linear layers and expert projections,
    [qualified names of the float Linear layers and routers]})``: what
    :func:`export_compressed_tensors` writes, computed without writing anything (the experts
    of a MoE layer by their names in the checkpoint, ``...experts.E.gate_proj``: see
    ``fakequant/serve/_experts.py``). Raises ValueError naming the first quantizer the format
    cannot describe."""
    plans, ignore, _ = _plan(model)
    return plans, ignore


def _plan(model: torch.nn.Module) -> Tuple[Dict[str, LayerPlan], List[str], Any]:
    """:func:`plan`, and the experts' part of it (an ``_experts.ExpertsPlan``)."""
    from ._experts import plan_experts

    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    quantized: Dict[str, quant_nn.QuantLinear] = {}
    ignore: List[str] = []
    for name, module in model.named_modules():
        if isinstance(module, quant_nn.QuantLinear):
            quantized[name] = module
        elif isinstance(module, torch.nn.Linear):
            ignore.append(name)
    outside = _quantizers_outside(model, quantized)
    if outside:
        raise _refuse(outside[0], "a quantizer outside the Linear layers (the format quantizes the inputs and "
                                  "weights of Linear layers; disable it or leave the module in float)")
    owners: Dict[int, List[str]] = {}
    for pname, param in model.named_parameters(remove_duplicate=False):
        owners.setdefault(id(param), []).append(pname)
    plans: Dict[str, LayerPlan] = {}
    for name, module in quantized.items():
        wq, iq = module.weight_quantizer, module.input_quantizer
        if not wq.is_enabled:
            if iq.is_enabled:
                raise _refuse(f"{name}.input_quantizer", "quantized inputs with float weights")
            ignore.append(name)
            continue
        shared = [p for p in owners.get(id(module.weight), []) if p != f"{name}.weight"]
        if shared:
            raise _refuse(f"{name}.weight_quantizer", f"its weight is shared with {shared[0]} (tied embeddings?): "
                                                      "a checkpoint holds one tensor for both; leave the layer in float")
        w_args, tensors, _ = _exact_weight_plan(f"{name}.weight_quantizer", wq, module.weight)
        i_args, i_tensors = _input_plan(f"{name}.input_quantizer", iq)
        tensors.update(i_tensors)
        plans[name] = LayerPlan(w_args, i_args, tensors, tuple(module.weight.shape))
    experts = plan_experts(model)
    plans.update(experts.plans)
    ignore += experts.ignore
    if not plans:
        raise ValueError("model has no quantized Linear layer (convert it with fakequant.quantize_model first)")
    return plans, sorted(ignore), experts


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
    ct = _import_ct()
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationConfig

    from ._experts import check_expert_formats

    plans, ignore, experts = _plan(model)
    groups, formats = _scheme_groups(ct, plans, ignore, experts)
    check_expert_formats(experts, formats, next(iter(groups.values())).format)
    single_format = set(formats.values())
    config = QuantizationConfig(config_groups=groups, ignore=ignore, quantization_status="compressed",
                                format=single_format.pop() if len(single_format) == 1 else "mixed-precision")

    quantizer_prefixes = tuple(f"{name}." for name, m in model.named_modules() if isinstance(m, TensorQuantizer))
    state = {k: v for k, v in model.state_dict().items() if not k.startswith(quantizer_prefixes)}
    for name in experts.replaced:
        del state[name]
    for name, p in plans.items():
        state.pop(f"{name}.weight", None)  # (the experts' are in the fused parameters, replaced)
        for local, tensor in _stored(ct, formats[name], p.tensors, p.weights, p.shape).items():
            state[f"{name}.{local}"] = tensor.contiguous()

    os.makedirs(directory, exist_ok=True)
    hf_model: Any = model
    with pretrained.detached(hf_model):  # (compressed-tensors' quantization_config, not fakequant's)
        hf_model.save_pretrained(directory, state_dict=state, max_shard_size=max_shard_size)
    ModelCompressor(quantization_config=config).update_config(os.fspath(directory))
    if tokenizer is not None:
        tokenizer.save_pretrained(directory)
    return dict(config.model_dump(exclude={"quant_method"}), quant_method="compressed-tensors")
