"""The dynamo exporter (``torch.onnx.export(..., dynamo=True)``, torch's
default): ONNX translations of the ``torch.ops.fakequant`` operators.

:func:`custom_translation_table` is what ``torch.onnx.export`` takes as
``custom_translation_table`` (torch's public way to add translations);
:func:`fakequant.onnx.export` passes it, which keeps the ``torch.ops.fakequant``
operators in the traced graph and translates them here (a plain ``torch.onnx.export``
gets the same nodes from the operators themselves: ``symbolic_dynamo.py``), and which is
how an ``ExportedProgram`` traced beforehand exports.

The translations are traced Python functions: the exporter calls them with
``onnx_ir`` values for the tensors and Python values for the other arguments,
under an onnxscript evaluator that records the ops. The scale is built from
the amax initializer with ONNX ops, which the exporter's optimizer (on by
default, ``optimize=True``) folds into one float32 initializer.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Set

import torch

from . import _lowering

_ONNX_TO_TORCH = {t: dt for dt, t in _lowering.ONNX_TYPES.items()}
# The dynamo exporter builds graphs at opset 18 or above (lower opsets are
# converted afterwards).
BUILD_OPSET = _DEFAULT_OPSET = 18


def _target_opset():
    from onnxscript import evaluator

    opset = getattr(evaluator.default(), "opset", None)
    version = getattr(opset, "version", None)
    return version if isinstance(version, int) else _DEFAULT_OPSET


class _DynamoBuilder(_lowering.Builder):
    def __init__(self):
        import onnxscript

        self.opset = _target_opset()
        self._op = onnxscript.values.Opset("", self.opset)

    def op(self, op_type, *inputs, **attrs):
        return getattr(self._op, op_type)(*inputs, **attrs)

    def const(self, tensor):
        import onnx_ir as ir

        return self._op.Constant(value=ir.tensor(tensor.numpy()))

    def dtype(self, value):
        dtype = getattr(value, "dtype", None)
        return None if dtype is None else _ONNX_TO_TORCH.get(int(dtype))

    def shape(self, value):
        shape = getattr(value, "shape", None)
        if shape is None:
            return None
        return tuple(d if isinstance(d, int) else None for d in shape)

    def depends_on(self, value, other, limit=10_000):
        seen: Set[int] = set()
        stack = [value]
        while stack and len(seen) < limit:
            v = stack.pop()
            if v is other:
                return True
            if v is None or id(v) in seen:
                continue
            seen.add(id(v))
            node = v.producer()
            if node is not None:
                stack.extend(node.inputs)
        return False

    def unused_mask(self):
        # The operators' second output (the packed mask for the backward) has
        # no use in an inference graph; the optimizer drops it.
        return self.const(torch.zeros(0, dtype=torch.uint8))


# The translations below carry no type annotations on purpose: the dynamo exporter reads a
# translation's type hints as its ONNX signature (which parameters are inputs, which attributes).


def fake_quantize_amax(input, amax, num_bits=8, unsigned=False, narrow_range=True, check_values=True):
    b = _DynamoBuilder()
    y = _lowering.lower_amax(b, input, amax, num_bits, unsigned, narrow_range)
    return y, b.unused_mask()


def quantize_amax(input, amax, num_bits=8, unsigned=False, narrow_range=True, check_values=True):
    b = _DynamoBuilder()
    y = _lowering.lower_amax(b, input, amax, num_bits, unsigned, narrow_range, integer_output=True)
    return y, b.unused_mask()


def fake_quantize_affine(input, scale, zero_point, axis=None, quant_min=-128, quant_max=127, pack_mask=True):
    b = _DynamoBuilder()
    y = _lowering.lower_affine(b, input, scale, zero_point, axis, quant_min, quant_max)
    return y, b.unused_mask()


def fake_quantize_min_max(input, min_range, max_range, num_bits=8):
    b = _DynamoBuilder()
    y = _lowering.lower_min_max(b, input, min_range, max_range, num_bits)
    return y, b.unused_mask()


def fake_quantize_fp8(input, amax, exponent_bits=4, mantissa_bits=3, check_values=True):
    b = _DynamoBuilder()
    y = _lowering.lower_fp8(b, input, amax, exponent_bits, mantissa_bits)
    return y, b.unused_mask()


def fake_quantize_blockwise(input, block_size, num_bits=8, unsigned=False, narrow_range=True, exponent_bits=0,
                            scale_amax=None, check_values=True, e8m0_scale=False, centered=False):
    b = _DynamoBuilder()
    y = _lowering.lower_blockwise(b, input, block_size, num_bits, unsigned, narrow_range, exponent_bits, scale_amax,
                                  e8m0_scale, centered)
    return y, b.unused_mask()


def fake_quantize_lsq(input, scale, zero_point, axis=None, quant_min=-128, quant_max=127, grad_factor=1.0):
    # The forward of LSQ is fake_quantize_affine's; grad_factor only scales gradients.
    return _lowering.lower_affine(_DynamoBuilder(), input, scale, zero_point, axis, quant_min, quant_max)


def convert_opset(program: torch.onnx.ONNXProgram, opset_version: int, optimize: bool = True) -> None:
    """Converts an unoptimized ``ONNXProgram`` (built at opset 18) down to
    ``opset_version`` in place with ONNX's converter, and optimizes it.

    ONNX's converter lacks some down-adapters and gets some wrong: torch
    converts before it optimizes, which fails on the quantizers' scale
    arithmetic (no Div-14 -> 13 adapter) and on computed inputs of others
    (ReduceMean-18's axes), and lets the optimizer write opset-18 nodes into
    the converted graph (Split with num_outputs); converting after optimizing
    fails on other ops. Both orders are tried, and the result is checked;
    RuntimeError if neither gives a valid graph.
    """
    import logging

    import onnx
    import onnx_ir as ir
    from onnxscript import version_converter

    original = ir.serde.serialize_model(program.model)
    causes: List[str] = []

    def convert() -> bool:
        records: List[logging.LogRecord] = []

        class _Records(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                records.append(record)

        handler = _Records()
        logger = logging.getLogger(version_converter.__name__)
        logger.addHandler(handler)
        try:
            version_converter.convert_version(program.model, opset_version, fallback=True)
        finally:
            logger.removeHandler(handler)
        if program.model.opset_imports.get("") == opset_version:
            return True
        # The converter logs (and swallows) its failure.
        causes.extend(str(r.exc_info[1]).split(": ")[-1] for r in records if r.exc_info)
        return False

    for optimize_first in (False, True):
        program.model = ir.serde.deserialize_model(original)
        if optimize_first:
            program.optimize()
        if not convert():
            continue
        if optimize and not optimize_first:
            program.optimize()
        try:
            onnx.checker.check_model(program.model_proto)
            return
        except onnx.checker.ValidationError as e:
            causes.append(str(e).strip().splitlines()[0])
    program.model = ir.serde.deserialize_model(original)
    raise RuntimeError(
        f"ONNX's version converter cannot convert this graph from opset {BUILD_OPSET} to {opset_version} "
        f"({'; '.join(dict.fromkeys(causes)) or 'no reason given'}); export at opset_version >= "
        f"{BUILD_OPSET} with dynamo=True, or use dynamo=False")


def custom_translation_table() -> Dict[torch._ops.OpOverload, Callable[..., Any]]:
    """``{torch.ops.fakequant.<op>.default: translation}`` for ``torch.onnx.export(custom_translation_table=...)``."""
    ops = torch.ops.fakequant
    return {
        ops.fake_quantize_amax.default: fake_quantize_amax,
        ops.quantize_amax.default: quantize_amax,
        ops.fake_quantize_affine.default: fake_quantize_affine,
        ops.fake_quantize_min_max.default: fake_quantize_min_max,
        ops.fake_quantize_fp8.default: fake_quantize_fp8,
        ops.fake_quantize_blockwise.default: fake_quantize_blockwise,
        ops.fake_quantize_lsq.default: fake_quantize_lsq,
    }
