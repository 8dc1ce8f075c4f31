"""The model walked into the layers a serving format writes, the same for every format: each
quantized Linear (its weight and input quantizers) and each MoE expert projection
(``_experts.py``) planned by the format (``ServingFormat.weight`` and ``input``, the weight
checked bit for bit by ``_base.exact_weight``), the float Linear layers listed, and every
quantizer the walk cannot place, or trained for a target the format does not serve
(``ServingFormat.targets``), refused before anything is written."""
from __future__ import annotations

from typing import Dict, List, NamedTuple

import torch

from ..models import experts as _fused
from .. import nn as quant_nn
from ..nn.tensor_quantizer import TensorQuantizer
from ._base import LayerPlan, ServingFormat, exact_weight, refuse_other_targets
from ._experts import ExpertsPlan, plan_experts

__all__ = ["ModelPlan", "plan_model"]


class ModelPlan(NamedTuple):
    """``plans``: {qualified name in the checkpoint: LayerPlan} of the quantized Linear layers and
    expert projections; ``ignore``: the checkpoint names of the float Linear layers and routers,
    sorted; ``experts``: the experts' part of it."""

    plans: Dict[str, LayerPlan]
    ignore: List[str]
    experts: ExpertsPlan


def _quantizers_outside(model: torch.nn.Module, linears: Dict[str, quant_nn.QuantLinear]) -> List[str]:
    """The enabled quantizers that are not a QuantLinear's own nor a fused-experts module's
    (attention, convolutions, ...)."""
    experts = tuple(f"{name}." for name, m in model.named_modules() if _fused.is_fused_experts(m))
    found = []
    for name, module in model.named_modules():
        if isinstance(module, TensorQuantizer) and module.is_enabled:
            owner = name.rsplit(".", 1)[0] if "." in name else ""
            if owner not in linears and not name.startswith(experts):
                found.append(name)
    return found


def plan_model(model: torch.nn.Module, fmt: ServingFormat) -> ModelPlan:
    """What format ``fmt`` writes of ``model``, computed without writing anything. Raises
    ValueError naming the first quantizer the format cannot describe."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    refuse_other_targets(model, fmt.targets, fmt.name)
    quantized: Dict[str, quant_nn.QuantLinear] = {}
    ignore: List[str] = []
    for name, module in model.named_modules():
        if isinstance(module, quant_nn.QuantLinear):
            quantized[name] = module
        elif isinstance(module, torch.nn.Linear):
            ignore.append(name)
    outside = _quantizers_outside(model, quantized)
    if outside:
        raise fmt.refuse(outside[0], "a quantizer outside the Linear layers (the format quantizes the inputs and "
                                     "weights of Linear layers; disable it or leave the module in float)")
    owners: Dict[int, List[str]] = {}
    for pname, param in model.named_parameters(remove_duplicate=False):
        owners.setdefault(id(param), []).append(pname)
    plans: Dict[str, LayerPlan] = {}
    for name, module in quantized.items():
        wq, iq = module.weight_quantizer, module.input_quantizer
        if not wq.is_enabled:
            if iq.is_enabled:
                raise fmt.refuse(f"{name}.input_quantizer", "quantized inputs with float weights")
            ignore.append(name)
            continue
        shared = [p for p in owners.get(id(module.weight), []) if p != f"{name}.weight"]
        if shared:
            raise fmt.refuse(f"{name}.weight_quantizer", f"its weight is shared with {shared[0]} (tied embeddings?): "
                                                         "a checkpoint holds one tensor for both; leave the layer in "
                                                         "float")
        w_args, tensors, _ = exact_weight(fmt, f"{name}.weight_quantizer", wq, module.weight)
        i_args, i_tensors = fmt.input(f"{name}.input_quantizer", iq)
        tensors.update(i_tensors)
        plans[name] = LayerPlan(w_args, i_args, tensors, tuple(module.weight.shape))
    experts = plan_experts(model, fmt)
    plans.update(experts.plans)
    return ModelPlan(plans, sorted(ignore + experts.ignore), experts)
