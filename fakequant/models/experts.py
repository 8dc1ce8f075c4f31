"""Quantizers on the fused experts of transformers' mixture-of-experts layers.

transformers keeps a MoE layer's experts as 3-D parameters in one module
(``Qwen3MoeExperts``, ``MixtralExperts``, ``GptOssExperts``, ...: ``gate_up_proj`` of shape
``(experts, 2 * intermediate, hidden)``, ``down_proj`` of ``(experts, hidden, intermediate)``;
gpt-oss stores them transposed, with biases) and picks the experts' forward from a registry
(``transformers.integrations.moe.ExpertsInterface``, chosen by
``config._experts_implementation``), the way attention is picked. No ``nn.Linear`` is there
for :func:`fakequant.quantize_model` to convert, so :func:`add_expert_quantizers` adds to each
such module, for each projection ``p`` (``gate_up_proj`` or ``up_proj``, then ``down_proj``):

- ``p_weight_quantizer``: one quantizer over the 3-D weight, seen as ``(experts, out, in)``
  whatever its storage: one amax per expert and output channel for a per-channel weight
  descriptor (``axis=0``), per expert for a per-tensor one, per block along the input
  dimension for block formats; for blocks with E4M3 scales under a per-tensor amax (NVFP4),
  a :class:`~fakequant.nn.QuantizerList` of one quantizer per expert, so that each expert
  has its own per-tensor amax. Each expert's weight is quantized as an ``nn.Linear`` of its
  shape would be under the same descriptor, bit for bit;
- ``p_input_quantizer``: a :class:`~fakequant.nn.QuantizerList` of one input quantizer per
  expert, calibrated on the tokens routed to that expert; an expert that calibration never
  reached takes the largest amax of the others (the list's rule).

It registers one more experts function, ``"fakequant"``, with transformers' public registry
and switches the model to it (``set_experts_implementation``): the expert loop of
transformers' eager forward, on the fake-quantized weights and inputs. While
``torch.compile`` traces it, the (token, expert) pairs are sorted by expert and each
projection is one grouped matmul over them (``fakequant_moe::experts_linear``), so the
graph has no data-dependent shapes (``fullgraph=True`` works) and computes the routed
tokens only; each expert's input quantizer sees its own rows. Under ``torch.export`` (the
ONNX exporter) every expert runs on every token, weighted by its routing weight (0 where
not routed): plain operators that every exporter lowers. Routers stay float (:data:`fakequant.quant_modules.DEFAULT_EXCLUDE`).
Nothing from transformers is imported until this is asked for, and nothing of it is patched.
"""
from __future__ import annotations

from typing import Any, Callable, List, Optional, Tuple

import torch
import torch.nn.functional as F

from ._experts_linear import experts_linear
from ..nn.quantizer_list import QuantizerList
from ..nn.tensor_quantizer import TensorQuantizer
from ..tensor_quant import QuantDescriptor, QuantSpec, ScaledQuantDescriptor

__all__ = ["EXPERTS_IMPLEMENTATION", "add_expert_quantizers", "expert_projections", "is_fused_experts",
           "quantized_weight", "register_experts"]

EXPERTS_IMPLEMENTATION = "fakequant"


def expert_projections(module: torch.nn.Module) -> Tuple[str, ...]:
    """The names of the 3-D expert weights of ``module`` in the order the forward applies
    them (``("gate_up_proj", "down_proj")``, or ``("up_proj", "down_proj")`` without a
    gate); ``()`` when it is not a fused-experts module."""
    experts = getattr(module, "num_experts", None)
    if not isinstance(experts, int):
        return ()
    first = "gate_up_proj" if getattr(module, "has_gate", True) else "up_proj"
    names = (first, "down_proj")
    for name in names:
        p = getattr(module, name, None)
        if not isinstance(p, torch.nn.Parameter) or p.dim() != 3 or p.shape[0] != experts:
            return ()
    return names


def is_fused_experts(module: torch.nn.Module) -> bool:
    """Whether ``module`` holds its experts as 3-D parameters (``num_experts`` of them) and
    takes transformers' experts registry (its class is decorated with
    ``use_experts_implementation``, which gives it ``is_transposed``)."""
    return bool(expert_projections(module)) and hasattr(module, "is_transposed")


def _weight_descriptor(desc: ScaledQuantDescriptor) -> ScaledQuantDescriptor:
    """``desc`` for a weight seen as ``(experts, out, in)``: per tensor becomes per expert,
    per output channel per expert and channel; blocks along the input stay."""
    fields = desc.dict()
    axis = fields.get("axis")
    if axis is None:
        fields["axis"] = 0 if desc.block_sizes is None else None
    elif axis in (0, (0,)):
        fields["axis"] = (0, 1)
    else:
        raise ValueError(f"expert weights take a per-tensor or per-output-channel (axis=0) weight descriptor, "
                         f"got axis={axis!r}")
    if desc.block_sizes is not None and set(k for k in desc.block_sizes if isinstance(k, int)) - {-1, 2}:
        raise ValueError(f"expert weights take blocks along the input dimension (block_sizes={{-1: ...}}), "
                         f"got block_sizes={desc.block_sizes!r}")
    return QuantDescriptor(**fields)


def _two_level(desc: ScaledQuantDescriptor) -> bool:
    """Blocks whose E4M3 scales are relative to a per-tensor amax (NVFP4): that amax is per
    expert, as each expert is a layer of its own (NVFP4 MoE checkpoints keep one per expert)."""
    return QuantSpec.of(desc).scales_need_amax


def add_expert_quantizers(model: torch.nn.Module, quant_desc_input: Optional[ScaledQuantDescriptor],
                          quant_desc_weight: ScaledQuantDescriptor,
                          skip: Optional[Callable[[str], bool]] = None) -> List[str]:
    """Adds ``<p>_weight_quantizer`` and ``<p>_input_quantizer`` (see the module's
    description; no input quantizers when ``quant_desc_input`` is None, a weight-only recipe)
    to every fused-experts module of ``model`` (except those whose qualified name
    ``skip(name)`` accepts) and switches the model to the ``"fakequant"`` experts function.
    Returns the qualified names of the modules that got quantizers."""
    for name, desc in (("quant_desc_input", quant_desc_input), ("quant_desc_weight", quant_desc_weight)):
        if desc is None and name == "quant_desc_input":
            continue
        if not isinstance(desc, QuantDescriptor):
            raise TypeError(f"{name} must be a QuantDescriptor, got {type(desc).__name__}")
    done: List[str] = []
    weight_desc = None
    for qualified, module in model.named_modules():
        if not is_fused_experts(module) or (skip is not None and skip(qualified)):
            continue
        if weight_desc is None:
            weight_desc = _weight_descriptor(quant_desc_weight)
        device = getattr(module, expert_projections(module)[0]).device
        for proj in expert_projections(module):
            if not isinstance(getattr(module, f"{proj}_weight_quantizer", None), (TensorQuantizer, QuantizerList)):
                if _two_level(quant_desc_weight):  # one per-tensor scale per expert: one quantizer each
                    weights: torch.nn.Module = QuantizerList(
                        TensorQuantizer(quant_desc_weight) for _ in range(module.num_experts))
                else:
                    weights = TensorQuantizer(weight_desc)
                module.add_module(f"{proj}_weight_quantizer", weights.to(device))
            if quant_desc_input is not None and not isinstance(getattr(module, f"{proj}_input_quantizer", None),
                                                               QuantizerList):
                inputs = QuantizerList(TensorQuantizer(quant_desc_input) for _ in range(module.num_experts))
                module.add_module(f"{proj}_input_quantizer", inputs.to(device))
        done.append(qualified)
    if not done:
        return done
    name = register_experts()
    setter = getattr(model, "set_experts_implementation", None)
    if callable(setter):
        setter(name)
    for qualified in done:  # (a standalone experts module: its own config)
        config = getattr(model.get_submodule(qualified), "config", None)
        if config is not None and getattr(config, "_experts_implementation", None) != name:
            config._experts_implementation = name
    return done


def register_experts() -> str:
    """Registers the ``"fakequant"`` experts function with transformers' public registry
    (``ExpertsInterface.register``). Returns its name."""
    try:
        from transformers.integrations.moe import ExpertsInterface
    except ImportError as e:
        raise ImportError("quantizing MoE experts needs transformers (pip install 'fakequant[hf]')") from e
    ExpertsInterface.register(EXPERTS_IMPLEMENTATION, _quantized_experts)
    return EXPERTS_IMPLEMENTATION


def _weights(module: Any) -> List[Tuple[torch.Tensor, Optional[torch.Tensor], Optional[QuantizerList]]]:
    """``[(weight (experts, out, in), bias or None, input quantizers or None)]`` per projection,
    the weight fake-quantized. (The experts function is the whole model's: a module left in
    float, excluded, has no quantizers and runs in float.)"""
    out = []
    for proj in expert_projections(module):
        bias = getattr(module, f"{proj}_bias", None) if getattr(module, "has_bias", False) else None
        out.append((quantized_weight(module, proj), bias, getattr(module, f"{proj}_input_quantizer", None)))
    return out


def quantized_weight(module: torch.nn.Module, proj: str) -> torch.Tensor:
    """The expert weight ``proj`` of ``module`` as the forward uses it: shape
    ``(experts, out, in)`` (gpt-oss's transposed storage undone), fake-quantized by
    ``<proj>_weight_quantizer`` (as it is if there is none)."""
    w = getattr(module, proj)
    if getattr(module, "is_transposed", False):
        w = w.transpose(1, 2)
    quantizer = getattr(module, f"{proj}_weight_quantizer", None)
    if isinstance(quantizer, QuantizerList):
        return torch.stack([q(w[e]) for e, q in enumerate(quantizer)])
    return w if quantizer is None else quantizer(w)


def _mlp(module: Any, first: Callable[[torch.Tensor], torch.Tensor], second: Callable[[torch.Tensor], torch.Tensor],
         x: torch.Tensor) -> torch.Tensor:
    """What every form of the experts computes on rows ``x``: the first projection, the gate
    (or the activation), the second projection, the optional post-expert norm."""
    h = first(x)
    h = module._apply_gate(h) if getattr(module, "has_gate", True) else module.act_fn(h)
    y = second(h)
    if getattr(module, "has_post_expert_norm", False):
        y = module.post_expert_norm(y)
    return y


def _expert(module: Any, projections, e: int, x: torch.Tensor) -> torch.Tensor:
    """Expert ``e`` on rows ``x``."""
    def linear(w: torch.Tensor, b: Optional[torch.Tensor], q: Optional[QuantizerList]):
        return lambda t: F.linear(t if q is None else q[e](t), w[e], None if b is None else b[e])

    (w1, b1, in1), (w2, b2, in2) = projections
    return _mlp(module, linear(w1, b1, in1), linear(w2, b2, in2), x)


def _quantized_experts(module: Any, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                       top_k_weights: torch.Tensor) -> torch.Tensor:
    projections = _weights(module)
    if torch.compiler.is_exporting():  # plain operators for the exporters: every expert on every token
        return _dense(module, projections, hidden_states, top_k_index, top_k_weights)
    if torch.compiler.is_compiling():  # no data-dependent shapes: tokens sorted by expert
        return _grouped(module, projections, hidden_states, top_k_index, top_k_weights)
    out = torch.zeros_like(hidden_states)
    with torch.no_grad():
        routed = torch.nn.functional.one_hot(top_k_index, num_classes=module.num_experts + 1).permute(2, 1, 0)
        hit = routed.sum(dim=(-1, -2)).gt(0).nonzero().flatten().tolist()
    for e in hit:
        if e >= module.num_experts:  # (expert parallelism's sentinel)
            continue
        position, token = torch.where(routed[e])
        y = _expert(module, projections, e, hidden_states[token]) * top_k_weights[token, position, None]
        out.index_add_(0, token, y.to(out.dtype))
    return out


def _dense(module: Any, projections, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
           top_k_weights: torch.Tensor) -> torch.Tensor:
    """Every expert on every token, weighted by its routing weight (0 where not routed)."""
    out = torch.zeros_like(hidden_states)
    for e in range(module.num_experts):
        weight = (top_k_weights * (top_k_index == e)).sum(-1, keepdim=True)
        out = out + (_expert(module, projections, e, hidden_states) * weight).to(out.dtype)
    return out


def _grouped_inputs(quantizers: Optional[QuantizerList], x: torch.Tensor, expert: torch.Tensor) -> torch.Tensor:
    """Row ``i`` of ``x`` through ``quantizers[expert[i]]``, in static shapes: each quantizer
    sees its own rows and zeros elsewhere. A quantizer's output on a row depends on that row
    and its calibrated state only, or (a dynamic per-tensor amax) on the largest magnitude
    of its rows, which the zeros do not change: the rows get the eager loop's values. Alike
    quantizers that work row by row (:meth:`QuantizerList.shared`) take all the rows in one call."""
    if quantizers is None:
        return x
    shared = quantizers.shared()
    if shared is not None:  # (row-wise and alike: one call for every expert's rows)
        return shared(x)
    out = x
    for e, q in enumerate(quantizers):
        mine = (expert == e).unsqueeze(-1)
        out = torch.where(mine, q(torch.where(mine, x, torch.zeros_like(x))), out)
    return out


def _grouped(module: Any, projections, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
             top_k_weights: torch.Tensor) -> torch.Tensor:
    """The (token, expert) pairs sorted by expert, each projection one grouped matmul over
    them (``fakequant_moe::experts_linear``): the expert FLOPs of the routed tokens only."""
    top_k = top_k_index.shape[-1]
    flat = top_k_index.reshape(-1)
    order = torch.argsort(flat, stable=True)  # (expert parallelism's sentinels, >= num_experts, last)
    expert = flat[order]
    counts = (expert.unsqueeze(-1) == torch.arange(module.num_experts, device=expert.device)).sum(0)
    rows = order // top_k

    def linear(w: torch.Tensor, b: Optional[torch.Tensor], q: Optional[QuantizerList]):
        def grouped(t: torch.Tensor) -> torch.Tensor:
            y = experts_linear(_grouped_inputs(q, t, expert).to(w.dtype), w, counts)
            return y if b is None else y + b[expert.clamp(max=module.num_experts - 1)]
        return grouped

    (w1, b1, in1), (w2, b2, in2) = projections
    y = _mlp(module, linear(w1, b1, in1), linear(w2, b2, in2), hidden_states[rows])
    valid = (expert < module.num_experts).unsqueeze(-1)  # (sentinel rows: zero, as the eager loop skips them)
    y = torch.where(valid, y * top_k_weights.reshape(-1)[order].unsqueeze(-1), torch.zeros_like(y))
    # back to (token, k) order and summed over k: no atomics, the same sum on every run
    y = y[torch.argsort(order)].reshape(*top_k_index.shape, -1).sum(1)
    return y.to(hidden_states.dtype)
