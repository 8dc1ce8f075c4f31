"""A plain ``torch.onnx.export(model, args, f)`` (torch's default, the dynamo exporter):
while it traces the model, fakequant's operators emit their ONNX nodes themselves.

Each function of ``fakequant.ops`` asks :func:`fakequant._core.lower_symbolically`
first; while the dynamo exporter traces (``torch.onnx.is_in_onnx_export()``, not the
TorchScript exporter's ``torch.jit`` trace) and outside :func:`fakequant.onnx.export`
(which hands the exporter the translations of ``translation_dynamo.py`` instead), that
calls the lowering of ``_lowering`` with the builder below, which writes every ONNX
node as ``torch.onnx.ops.symbolic`` (torch's public way to put a named ONNX node into
the traced graph, since torch 2.8). The exporter turns each into that node; its
optimizer then folds the scale arithmetic on the amax initializers into float32
initializers, as it does for the translations, so both routes write the same graph.

The opset. A traced node cannot see the ``opset_version`` given to
``torch.onnx.export``, so the lowering is built for
``fakequant.onnx.export_options(opset_version=...)`` when that is set, else for
torch's default opset (:data:`DEFAULT_OPSET`), or for the lowest opset a format needs
when that is higher (19 for FP8, 21 for block-wise formats). Built for the default,
the nodes are the same at every opset from 13 to 20 and valid at 21, so they take the
graph's (fakequant.onnx.export writes int4/int16 types and leaves out zero points at 21,
which needs ``export_options(opset_version=21)`` here). Built for another opset, every
node carries it as its version: the exporter converts it up to a higher
``opset_version`` and refuses a lower one with its own error, instead of writing nodes
the opset lacks.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Sequence, Tuple

import torch

from .. import _core
from . import _lowering

# torch.onnx.export's default opset_version (tests/test_onnx_plain.py checks it against
# torch's) and the opset its dynamo exporter builds at, at least.
DEFAULT_OPSET = 20
BUILD_OPSET = 18

_COMPARISONS = {"Greater", "Less", "LessOrEqual", "GreaterOrEqual", "Equal", "Or", "And", "Not", "IsNaN", "IsInf"}
_SAME_SHAPE = {"Abs", "Round", "Floor", "Log", "IsNaN", "IsInf", "Not", "Cast", "Clip", "QuantizeLinear",
               "DequantizeLinear"}


def _available() -> bool:
    return hasattr(torch.onnx, "ops") and hasattr(torch.onnx.ops, "symbolic")


class _SymbolicBuilder(_lowering.Builder):
    """Writes each node with ``torch.onnx.ops.symbolic``, which needs the output's type
    and shape: they follow from the ONNX operator's definition (:meth:`_infer`), for the
    operators the lowerings use. Constants are plain tensors (initializers in the graph)."""

    def __init__(self, opset: int) -> None:
        self.opset = opset
        # Built for torch's default opset, the nodes are those of every opset from 13 to 20
        # and valid at 21: they take the graph's. Built for another, they say which.
        self._version = None if opset == DEFAULT_OPSET else opset
        self._types: Dict[int, Tuple[torch.Tensor, int]] = {}  # id(value) -> (value, ONNX type)
        # id(value) -> (value, its integers): a constant made while the exporter traces is a
        # fake tensor, whose values cannot be read back
        self._ints: Dict[int, Tuple[torch.Tensor, List[int]]] = {}

    def onnx_type(self, value: torch.Tensor) -> int:
        known = self._types.get(id(value))
        if known is not None and known[0] is value:
            return known[1]
        return _lowering.ONNX_TYPES[value.dtype]

    def op(self, op_type, *inputs, **attrs):
        onnx_type, shape = self._infer(op_type, inputs, attrs)
        out = torch.onnx.ops.symbolic(op_type, inputs, attrs, dtype=onnx_type, shape=shape, version=self._version)
        self._types[id(out)] = (out, onnx_type)
        return out

    def const(self, tensor):
        return tensor

    def ints(self, values):
        values = [int(v) for v in values]
        t = torch.tensor(values, dtype=torch.int64)
        self._ints[id(t)] = (t, values)
        return t

    def _values(self, value: torch.Tensor) -> List[int]:
        known = self._ints.get(id(value))
        if known is None or known[0] is not value:
            raise RuntimeError("fakequant ONNX export: an axes/shape input is not a constant of the lowering")
        return known[1]

    def dtype(self, value):
        return value.dtype

    def shape(self, value):
        return tuple(d if isinstance(d, int) else None for d in value.shape)

    def depends_on(self, value, other):
        # A traced tensor does not say what it was computed from: the warning about a
        # dynamic range is given by fakequant.onnx.export (and the TorchScript exporter).
        return False

    def _infer(self, op_type: str, inputs: Sequence[Any], attrs: Dict[str, Any]) -> Tuple[int, List[Any]]:
        x = inputs[0]
        if op_type in _SAME_SHAPE:
            shape = list(x.shape)
        elif op_type == "Squeeze":
            axes = self._values(inputs[1])
            shape = [d for i, d in enumerate(x.shape) if i not in {a % x.dim() for a in axes}]
        elif op_type == "Unsqueeze":
            added = self._values(inputs[1])
            rank = x.dim() + len(added)
            inserted = {a % rank for a in added}
            rest = iter(x.shape)
            shape = [1 if i in inserted else next(rest) for i in range(rank)]
        elif op_type in ("ReduceMax", "ReduceMin"):
            reduced = {a % x.dim() for a in self._values(inputs[1])}
            keep = attrs.get("keepdims", 1)
            shape = [1 if i in reduced else d for i, d in enumerate(x.shape) if keep or i not in reduced]
        elif op_type == "Reshape":
            target = self._values(inputs[1])
            shape = [x.shape[i] if d == 0 else d for i, d in enumerate(target)]
            if -1 in target:
                known = math.prod(d for d in shape if not (isinstance(d, int) and d == -1))
                shape[target.index(-1)] = x.numel() // known
        elif op_type == "Pad":
            pads = self._values(inputs[1])
            rank = x.dim()
            shape = [d + pads[i] + pads[i + rank] for i, d in enumerate(x.shape)]
        elif op_type == "Slice":
            starts, ends, axes = self._values(inputs[1]), self._values(inputs[2]), self._values(inputs[3])
            shape = list(x.shape)
            for start, end, axis in zip(starts, ends, axes):
                shape[axis] = min(end, shape[axis]) - start if isinstance(shape[axis], int) else end - start
        else:  # elementwise, with broadcasting
            shape = list(torch.broadcast_shapes(*(v.shape for v in inputs if v is not None)))
        return self._type_of(op_type, inputs, attrs), shape

    def _type_of(self, op_type: str, inputs: Sequence[Any], attrs: Dict[str, Any]) -> int:
        if op_type in _COMPARISONS:
            return _lowering.BOOL
        if op_type == "Cast":
            return int(attrs["to"])
        if op_type == "QuantizeLinear":
            if len(inputs) > 2 and inputs[2] is not None:
                return self.onnx_type(inputs[2])
            return int(attrs.get("output_dtype", 2))  # (no zero point, no output_dtype: uint8)
        if op_type == "DequantizeLinear":
            return self.onnx_type(inputs[1])
        if op_type == "Where":
            return self.onnx_type(inputs[1])
        return self.onnx_type(inputs[0])


def _opset(needed: int = BUILD_OPSET) -> int:
    """The opset to build for: the one set in export_options, else torch's default or the
    format's minimum if that is higher."""
    chosen = _core.current_export_options().opset_version
    if chosen is not None:
        return max(chosen, BUILD_OPSET)  # (the exporter converts below 18 at the end)
    return max(DEFAULT_OPSET, needed)


def _unused_mask(y: torch.Tensor) -> torch.Tensor:
    # The operators' second output, the packed mask for the backward, has no use in an
    # exported graph: a tensor of its size, which the exporter drops unless it is used.
    return y.new_zeros(((y.numel() + 7) // 8,), dtype=torch.uint8)


def fake_quantize_amax(input, amax, num_bits=8, unsigned=False, narrow_range=True, check_values=True):
    b = _SymbolicBuilder(_opset())
    y = _lowering.lower_amax(b, input, amax, num_bits, unsigned, narrow_range)
    return y, _unused_mask(y)


def quantize_amax(input, amax, num_bits=8, unsigned=False, narrow_range=True, check_values=True):
    b = _SymbolicBuilder(_opset())
    y = _lowering.lower_amax(b, input, amax, num_bits, unsigned, narrow_range, integer_output=True)
    return y, _unused_mask(y)


def fake_quantize_affine(input, scale, zero_point, axis=None, quant_min=-128, quant_max=127, pack_mask=True):
    b = _SymbolicBuilder(_opset())
    y = _lowering.lower_affine(b, input, scale, zero_point, axis, quant_min, quant_max)
    mask = _unused_mask(y) if pack_mask else torch.ones_like(y, dtype=torch.bool)
    return y, mask


def fake_quantize_min_max(input, min_range, max_range, num_bits=8):
    b = _SymbolicBuilder(_opset())
    y = _lowering.lower_min_max(b, input, min_range, max_range, num_bits)
    return y, _unused_mask(y)


def fake_quantize_fp8(input, amax, exponent_bits=4, mantissa_bits=3, check_values=True):
    b = _SymbolicBuilder(_opset(_lowering.FP8_MIN_OPSET))
    y = _lowering.lower_fp8(b, input, amax, exponent_bits, mantissa_bits)
    return y, _unused_mask(y)


def fake_quantize_blockwise(input, block_size, num_bits=8, unsigned=False, narrow_range=True, exponent_bits=0,
                            scale_amax=None, check_values=True, e8m0_scale=False, centered=False):
    b = _SymbolicBuilder(_opset(_lowering.BLOCK_MIN_OPSET))
    y = _lowering.lower_blockwise(b, input, block_size, num_bits, unsigned, narrow_range, exponent_bits,
                                  scale_amax, e8m0_scale, centered)
    return y, _unused_mask(y)


def fake_quantize_lsq(input, scale, zero_point, axis=None, quant_min=-128, quant_max=127, grad_factor=1.0):
    # The forward of LSQ is fake_quantize_affine's; grad_factor only scales gradients.
    return _lowering.lower_affine(_SymbolicBuilder(_opset()), input, scale, zero_point, axis, quant_min, quant_max)


LOWERINGS: Dict[str, Callable[..., Any]] = {
    "fake_quantize_amax": fake_quantize_amax,
    "quantize_amax": quantize_amax,
    "fake_quantize_affine": fake_quantize_affine,
    "fake_quantize_min_max": fake_quantize_min_max,
    "fake_quantize_fp8": fake_quantize_fp8,
    "fake_quantize_blockwise": fake_quantize_blockwise,
    "fake_quantize_lsq": fake_quantize_lsq,
}


def register() -> None:
    """Hands :data:`LOWERINGS` to the operators (``fakequant._core.set_symbolic_lowerings``);
    on ``import fakequant``. Where torch lacks ``torch.onnx.ops`` (before 2.8) nothing is
    registered, and a plain dynamo export raises naming :func:`fakequant.onnx.export`."""
    _core.set_symbolic_lowerings(LOWERINGS if _available() else None)

