"""The TorchScript exporter (``torch.onnx.export(..., dynamo=False)``): symbolic
functions of the ``torch.ops.fakequant`` operators, registered with
``torch.onnx.register_custom_op_symbolic`` on ``import fakequant``.

The exporter traces the model (the operators run for real), then calls these
functions with the graph values of the operator's arguments; the lowering
itself is shared with the dynamo exporter (``_lowering``). The scale is
built from the amax initializer with ONNX ops that the exporter's constant
folding (always on) turns into one float32 initializer, computed by the same
IEEE float32 division as the operator.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Set

import torch

from . import _lowering

# First opset with per-axis QuantizeLinear/DequantizeLinear.
MIN_OPSET = 13
# Registered from this opset: below MIN_OPSET the functions raise a clear error.
_REGISTERED_FROM = 7

# (looked up with the scalar type of a TensorType, or None)
_SCALAR_TYPES: Dict[Optional[str], torch.dtype] = {
    "Float": torch.float32, "Half": torch.float16, "BFloat16": torch.bfloat16, "Double": torch.float64,
    "Int": torch.int32, "Long": torch.int64, "Char": torch.int8, "Byte": torch.uint8, "Short": torch.int16,
    "Bool": torch.bool,
}
_ATTR_SUFFIX = {bool: "i", int: "i", float: "f", str: "s"}


class _TorchScriptBuilder(_lowering.Builder):
    wide_int_types = False

    def __init__(self, g):
        self.g = g
        self.opset = g.opset

    def op(self, op_type, *inputs, **attrs):
        kwargs: Dict[str, Any] = {}
        for name, value in attrs.items():
            if isinstance(value, torch.Tensor):
                kwargs[name + "_t"] = value
            elif isinstance(value, (list, tuple)):
                kwargs[name + "_" + _ATTR_SUFFIX[type(value[0])]] = list(value)
            else:
                kwargs[name + "_" + _ATTR_SUFFIX[type(value)]] = value
        return self.g.op(op_type, *inputs, **kwargs)

    def const(self, tensor):
        return self.g.op("Constant", value_t=tensor)

    def dtype(self, value):
        t = value.type()
        scalar = t.scalarType() if isinstance(t, torch._C.TensorType) else None
        return _SCALAR_TYPES.get(scalar)

    def shape(self, value):
        t = value.type()
        if not isinstance(t, torch._C.TensorType) or t.dim() is None:
            return None
        sizes = t.varyingSizes()
        assert sizes is not None  # (the rank is known)
        return tuple(sizes)

    def depends_on(self, value, other, limit=10_000):
        target = other.unique()
        seen: Set[int] = set()
        stack = [value]
        while stack and len(seen) < limit:
            v = stack.pop()
            if v.unique() == target:
                return True
            if v.unique() in seen:
                continue
            seen.add(v.unique())
            stack.extend(v.node().inputs())
        return False


def _const_arg(value, kind, name):
    from torch.onnx import symbolic_helper

    if kind == "none_or_i" and symbolic_helper._is_none(value):
        return None
    try:
        parsed = symbolic_helper._get_const(value, "i" if kind == "none_or_i" else kind, name)
    except Exception as e:  # noqa: BLE001  (the exporter raises various types here)
        raise RuntimeError(f"fakequant ONNX export: {name} must be a constant, got a computed value ({e})") from None
    return bool(parsed) if kind == "b" else int(parsed)


def _builder(g, op_name):
    if g.opset < MIN_OPSET:
        raise RuntimeError(
            f"fakequant ONNX export of {op_name} needs opset_version >= {MIN_OPSET} "
            f"(per-axis QuantizeLinear), got {g.opset}"
        )
    return _TorchScriptBuilder(g)


def _unused_mask(g):
    # The operators' second output (the packed mask for the backward) has no
    # use in an inference graph; the exporter drops it with the dead code.
    return g.op("Constant", value_t=torch.zeros(0, dtype=torch.uint8))


def fake_quantize_amax(g, input, amax, num_bits, unsigned, narrow_range, check_values=None):
    b = _builder(g, "fake_quantize_amax")
    y = _lowering.lower_amax(b, input, amax, _const_arg(num_bits, "i", "num_bits"),
                             _const_arg(unsigned, "b", "unsigned"), _const_arg(narrow_range, "b", "narrow_range"))
    return y, _unused_mask(g)


def quantize_amax(g, input, amax, num_bits, unsigned, narrow_range, check_values=None):
    b = _builder(g, "quantize_amax")
    y = _lowering.lower_amax(b, input, amax, _const_arg(num_bits, "i", "num_bits"),
                             _const_arg(unsigned, "b", "unsigned"), _const_arg(narrow_range, "b", "narrow_range"),
                             integer_output=True)
    return y, _unused_mask(g)


def fake_quantize_affine(g, input, scale, zero_point, axis, quant_min, quant_max, pack_mask):
    b = _builder(g, "fake_quantize_affine")
    y = _lowering.lower_affine(b, input, scale, zero_point, _const_arg(axis, "none_or_i", "axis"),
                               _const_arg(quant_min, "i", "quant_min"), _const_arg(quant_max, "i", "quant_max"))
    return y, _unused_mask(g)


def fake_quantize_min_max(g, input, min_range, max_range, num_bits):
    b = _builder(g, "fake_quantize_min_max")
    y = _lowering.lower_min_max(b, input, min_range, max_range, _const_arg(num_bits, "i", "num_bits"))
    return y, _unused_mask(g)


def fake_quantize_fp8(g, input, amax, exponent_bits, mantissa_bits, check_values=None):
    b = _builder(g, "fake_quantize_fp8")
    y = _lowering.lower_fp8(b, input, amax, _const_arg(exponent_bits, "i", "exponent_bits"),
                            _const_arg(mantissa_bits, "i", "mantissa_bits"))
    return y, _unused_mask(g)


def fake_quantize_blockwise(g, input, block_size, num_bits, unsigned, narrow_range, exponent_bits, scale_amax,
                            check_values=None, e8m0_scale=None, centered=None):
    from torch.onnx import symbolic_helper

    b = _builder(g, "fake_quantize_blockwise")
    y = _lowering.lower_blockwise(
        b, input, _const_arg(block_size, "i", "block_size"), _const_arg(num_bits, "i", "num_bits"),
        _const_arg(unsigned, "b", "unsigned"), _const_arg(narrow_range, "b", "narrow_range"),
        _const_arg(exponent_bits, "i", "exponent_bits"),
        None if symbolic_helper._is_none(scale_amax) else scale_amax,
        e8m0_scale is not None and _const_arg(e8m0_scale, "b", "e8m0_scale"),
        centered is not None and _const_arg(centered, "b", "centered"))
    return y, _unused_mask(g)


def fake_quantize_lsq(g, input, scale, zero_point, axis, quant_min, quant_max, grad_factor):
    # The forward of LSQ is fake_quantize_affine's; grad_factor only scales gradients.
    b = _builder(g, "fake_quantize_lsq")
    return _lowering.lower_affine(b, input, scale, zero_point, _const_arg(axis, "none_or_i", "axis"),
                                  _const_arg(quant_min, "i", "quant_min"), _const_arg(quant_max, "i", "quant_max"))


SYMBOLICS: Dict[str, Callable[..., Any]] = {
    "fakequant::fake_quantize_fp8": fake_quantize_fp8,
    "fakequant::fake_quantize_blockwise": fake_quantize_blockwise,
    "fakequant::fake_quantize_lsq": fake_quantize_lsq,
    "fakequant::fake_quantize_amax": fake_quantize_amax,
    "fakequant::quantize_amax": quantize_amax,
    "fakequant::fake_quantize_affine": fake_quantize_affine,
    "fakequant::fake_quantize_min_max": fake_quantize_min_max,
}


def register() -> None:
    """Registers the symbolic functions with the TorchScript exporter (idempotent)."""
    from torch.onnx import register_custom_op_symbolic

    for name, fn in SYMBOLICS.items():
        register_custom_op_symbolic(name, fn, _REGISTERED_FROM)
