"""The fused MoE experts of a Hugging Face checkpoint, planned the same way for every format.

transformers keeps a MoE layer's experts as 3-D parameters (``gate_up_proj`` of shape
``(experts, 2 * intermediate, hidden)``, ``down_proj`` of ``(experts, hidden, intermediate)``;
:mod:`fakequant.models.experts`), but its checkpoints, and vLLM's, store each expert's projections as
the Linear layers of the original model (Qwen3-MoE ``mlp.experts.E.gate_proj`` / ``up_proj`` /
``down_proj``, Mixtral ``block_sparse_moe.experts.E.w1`` / ``w3`` / ``w2``), which transformers'
conversion mapping stacks into the fused parameters when it loads them. The experts are
written in that per-expert layout: each expert's weight ``(out, in)`` goes through the
Linear layers' code path (``_base.exact_weight`` and the format's ``weight`` and ``input``)
as the Linear layer it is in the checkpoint, with the expert's quantizers, and the rows of
``gate_up_proj`` are then split into the gate and up projections (every weight scale a format
stores is per tensor, per row or per group of a row). What a format's loaders cannot read of
them its export refuses (compressed-tensors: ``check_expert_formats``).

What is written per expert projection is exactly what fakequant computes: the codes and
scales of expert ``e`` come from ``<proj>_weight_quantizer`` at expert ``e`` (the amax of
that expert), and their dequantization equals ``fakequant.models.experts.quantized_weight(module,
proj)[e]`` bit for bit, checked before anything is written. Inputs: each expert's input
quantizer of ``gate_up_proj`` gives the ``input_scale`` of both its gate and up projections
(fakequant quantizes the one input they share with one quantizer), that of ``down_proj`` the
``input_scale`` of its down projection.
"""
from __future__ import annotations

import re
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

import torch

from ..models import experts as _fused
from ..nn.quantizer_list import QuantizerList
from ..nn.tensor_quantizer import TensorQuantizer
from ._base import LayerPlan, ServingFormat, bits_equal, exact_weight, refusal

__all__ = ["LAYOUTS", "ExpertLayout", "ExpertsPlan", "has_quantizers", "plan_experts"]


class ExpertLayout(NamedTuple):
    """How a model type's checkpoint names the experts of one fused-experts module:
    ``renames`` applied to the module's qualified name (``(old, new)`` substrings), and for
    each fused projection the checkpoint's projections its rows are split into, in order."""

    renames: Tuple[Tuple[str, str], ...]
    projections: Dict[str, Tuple[str, ...]]
    router: str


#: The model types whose experts are written, and their checkpoint layout (the inverse of
#: transformers' conversion mapping for them: ``transformers.conversion_mapping``).
LAYOUTS: Dict[str, ExpertLayout] = {
    "qwen3_moe": ExpertLayout((), {"gate_up_proj": ("gate_proj", "up_proj"), "down_proj": ("down_proj",)}, "gate"),
    "mixtral": ExpertLayout(((".mlp.", ".block_sparse_moe."),),
                            {"gate_up_proj": ("w1", "w3"), "down_proj": ("w2",)}, "gate"),
}


class ExpertsPlan(NamedTuple):
    """What the experts add to a checkpoint: ``{checkpoint module name: LayerPlan}`` of each
    expert projection, the fused parameters they replace (qualified names in the model),
    the checkpoint names of what stays float (routers; the experts of a module without
    quantizers, by one ``re:`` pattern each), per quantized fused-experts module (by its name in
    the model) its name in the checkpoint and the checkpoint names of its expert projections, and
    the modules whose experts stay float."""

    plans: Dict[str, Any]
    replaced: List[str]
    ignore: List[str]
    modules: Dict[str, Tuple[str, List[str]]]
    floats: List[str]


def _enabled(q: Optional[torch.nn.Module]) -> bool:
    if isinstance(q, QuantizerList):
        return any(m.is_enabled for m in q.quantizers())
    return isinstance(q, TensorQuantizer) and q.is_enabled


def has_quantizers(module: torch.nn.Module) -> bool:
    """Whether a fused-experts module has an enabled weight or input quantizer."""
    return any(_enabled(getattr(module, f"{proj}_{role}_quantizer", None))
               for proj in _fused.expert_projections(module) for role in ("weight", "input"))


class _ExpertView:
    """Expert ``e`` of a weight quantizer over ``(experts, out, in)``, read as a Linear layer's
    weight quantizer would be: its descriptor without the expert axis (per expert becomes per
    tensor, per expert and channel per channel), its amax at expert ``e``, and as its output
    the quantizer's output on the whole weight at ``e`` (what the experts' forward uses)."""

    def __init__(self, q: TensorQuantizer, e: int, weight: torch.Tensor,
                 outputs: Dict[torch.dtype, torch.Tensor]) -> None:
        self._q, self._e, self._weight, self._outputs = q, e, weight, outputs

    def __getattr__(self, name: str) -> Any:  # num_bits, block_sizes, scale_bits, unsigned, ...
        return getattr(self._q, name)

    @property
    def axis(self) -> Any:
        axis = self._q.axis
        if axis in (0, (0,)):
            return None
        if axis == (0, 1):
            return 0
        return axis  # (refused by the Linear rules)

    @property
    def amax(self) -> Optional[torch.Tensor]:
        amax = self._q.amax
        if amax is None or amax.numel() == 1 or amax.dim() != 3:
            return amax
        return amax[self._e]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape != self._weight.shape[1:]:
            raise ValueError(f"expected expert weight of shape {tuple(self._weight.shape[1:])}, got {tuple(x.shape)}")
        if x.dtype not in self._outputs:
            self._outputs[x.dtype] = self._q(self._weight.detach().cpu().to(x.dtype))
        return self._outputs[x.dtype][self._e]


def _split(tensors: Dict[str, torch.Tensor], rows: int, parts: int) -> List[Dict[str, torch.Tensor]]:
    """The tensors of a fused projection of ``rows`` output rows, for each of its ``parts``
    checkpoint projections: per-row tensors (codes, per-channel and group scales) split along
    the rows, the others (per-tensor, global and input scales) the same for each."""
    size = rows // parts
    return [{k: (t[i * size:(i + 1) * size] if t.dim() >= 1 and t.shape[0] == rows and rows > 1 else t.clone())
             for k, t in tensors.items()} for i in range(parts)]


def plan_experts(model: torch.nn.Module, fmt: ServingFormat) -> ExpertsPlan:
    """The per-expert plans in format ``fmt`` of every quantized fused-experts module of
    ``model``. Raises ValueError naming the module or quantizer that cannot be written."""
    result = ExpertsPlan({}, [], [], {}, [])
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    for name, module in model.named_modules():
        if not _fused.is_fused_experts(module):
            continue
        layout = LAYOUTS.get(model_type)  # type: ignore[arg-type]
        quantized = has_quantizers(module)
        if layout is None and not quantized:
            continue  # (written by save_pretrained as the model type writes it)
        if layout is None:
            raise refusal(name, f"quantized experts of a {model_type!r} model ({type(module).__name__}): "
                                f"the export writes the per-expert layout of {sorted(LAYOUTS)} models only, "
                                "which transformers' compressed-tensors loader stacks into its fused experts "
                                "(gpt-oss checkpoints keep their experts in a format of their own)")
        if getattr(module, "is_transposed", False) or getattr(module, "has_bias", False):
            raise refusal(name, "transposed experts or experts with biases (the per-expert layout has "
                                "neither)")
        projections = _fused.expert_projections(module)
        if set(projections) != set(layout.projections):
            raise refusal(name, f"expert projections {list(projections)}, the layout has "
                                f"{list(layout.projections)}")
        prefix = name
        for old, new in layout.renames:
            prefix = prefix.replace(old, new)
        parent = name.rsplit(".", 1)[0] if "." in name else ""
        router = getattr(model.get_submodule(parent), layout.router, None)
        if isinstance(router, torch.nn.Module) and not isinstance(router, torch.nn.Linear):
            # (a router that is an nn.Linear is listed by the Linear rules)
            result.ignore.append(f"{prefix.rsplit('.', 1)[0]}.{layout.router}" if parent else layout.router)
        if not quantized:  # save_pretrained writes them per expert: ignored by one pattern
            parts = sorted(p for ps in layout.projections.values() for p in ps)
            result.ignore.append(f"re:^{re.escape(prefix)}\\.\\d+\\.({'|'.join(parts)})$")
            result.floats.append(name)
            continue
        names: List[str] = []
        for proj in projections:
            weight = getattr(module, proj)
            wq = getattr(module, f"{proj}_weight_quantizer", None)
            iq = getattr(module, f"{proj}_input_quantizer", None)
            where = f"{name}.{proj}_weight_quantizer"
            if not _enabled(wq):
                raise refusal(where, "float expert weights in quantized experts (the format quantizes the "
                                     "experts' weights, or none)")
            if isinstance(wq, QuantizerList) and fmt.per_expert_weight_quantizers is not None:
                raise refusal(where, fmt.per_expert_weight_quantizers)
            assert isinstance(wq, (TensorQuantizer, QuantizerList))  # (what _enabled accepts)
            with torch.no_grad():
                fake = _fused.quantized_weight(module, proj).detach().cpu()
            outputs: Dict[torch.dtype, torch.Tensor] = {}
            for e in range(module.num_experts):
                q = wq[e] if isinstance(wq, QuantizerList) else _ExpertView(wq, e, weight, outputs)
                w_args, tensors, target = exact_weight(fmt, f"{where} (expert {e})", q, weight[e])
                if not bits_equal(target, fake[e]):
                    raise refusal(where, f"expert {e}'s weight read as a Linear layer's is not the experts' "
                                         "forward's")
                i_args, i_tensors = (None, {}) if iq is None else fmt.input(f"{name}.{proj}_input_quantizer.{e}",
                                                                         iq[e])
                tensors.update(i_tensors)
                split = layout.projections[proj]
                rows = weight.shape[1]
                if rows % len(split):
                    raise refusal(name, f"{proj} of {rows} rows cannot be split into {list(split)}")
                for part, part_tensors in zip(split, _split(tensors, rows, len(split))):
                    checkpoint = f"{prefix}.{e}.{part}"
                    result.plans[checkpoint] = LayerPlan(w_args, i_args, part_tensors,
                                                          (rows // len(split), weight.shape[2]))
                    names.append(checkpoint)
            result.replaced.append(f"{name}.{proj}")
        result.modules[name] = (prefix, names)
    return result
