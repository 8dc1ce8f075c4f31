"""fakequant's differentiable operators as plain-PyTorch composites, for torch.compile.

Eager, every fake-quant op is one C++/CUDA kernel pass with a one-bit mask. Under
``torch.compile`` such an op is opaque to Inductor: it reads and writes its whole
tensor on its own, between the batch norm and ReLU before it and the convolution
after it, and the mask it returns is packed in a layout Inductor cannot fuse into
the backward. So while Dynamo traces (``torch.compile``, not ``torch.export`` or an
ONNX export, which keep the operators for their lowerings), the public functions of
``fakequant.ops`` call the rule of ``fakequant.composite.rules`` instead, the plain-PyTorch
statement of the same numerics contract, inside an autograd function whose
backward passes the gradient where the rule's mask is set. Inductor fuses it with
its neighbours; the tests (tests/test_compiled.py) compare every op and dtype
compiled with Inductor to eager, bit for bit (outputs, sign of zero) and gradients.

The two compiled paths (``set_compiled_path``):

- ``"opaque"`` (the default): the C++ operators as in eager mode (one pass each, a
  one-bit packed mask), called from the compiled graph.
- ``"composite"``: the rules above; the backward keeps the bool mask (8 bits per
  element), which Inductor computes in the forward's fused loop, unless the
  partitioner recomputes it from what it saves anyway.

``benchmarks/bench_compiled_qat.py`` measures both (docs/performance.md): on the
2-core CPU the opaque operators were faster in both models measured (ResNet-18
1.12x the compiled float step against 1.18x, a small Llama 1.06x against 1.11x),
so they are the default; the composites are the route to Triton kernels on CUDA,
not yet measured on a GPU.
"""
import torch

from . import rules
from .._core.numerics import divide
from .._core.export_state import onnx_export_enabled

__all__ = ["set_compiled_path", "compiled_path", "active", "apply"]

PATHS = ("composite", "opaque")
_path = "opaque"


def set_compiled_path(path: str) -> None:
    """What fakequant's operators become under ``torch.compile``: ``"opaque"`` (the
    C++ operators, as eager; the default) or ``"composite"`` (plain-PyTorch rules that
    Inductor fuses with their neighbours, with the eager numerics bit for bit). Read
    while Dynamo traces: functions compiled before the change recompile on their next
    call (a guard on the setting)."""
    global _path
    if path not in PATHS:
        raise ValueError(f"fakequant: path must be one of {PATHS}, got {path!r}")
    _path = path


def compiled_path() -> str:
    """The current setting of :func:`set_compiled_path`."""
    return _path


def active() -> bool:
    """Whether an op called now should run as its composite: Dynamo is tracing for
    torch.compile (not torch.export, not an ONNX export) and the path is "composite"."""
    return (_path == "composite" and torch.compiler.is_compiling() and not torch.compiler.is_exporting()
            and not onnx_export_enabled())


def _assert(ok, message):
    """The eager operators' value check, as an assertion that the compiled code runs:
    a RuntimeError with the eager message (less the offending index) when it fails."""
    torch._assert_async(ok.all(), f"fakequant: {message}")


def _check_amax(name, amax):
    a = amax.float()
    _assert((a >= 0) & (a < float("inf")), f"{name} must be finite and >= 0 (as float32)")


class _MaskedRule(torch.autograd.Function):
    """y, mask = rule(x, *args); the gradient of x is grad where mask, else 0 (none for
    the other arguments)."""

    @staticmethod
    def forward(ctx, rule, x, *args):
        y, mask = rule(x, *args)
        ctx.save_for_backward(mask)
        ctx.num_args = len(args)
        return y

    @staticmethod
    def backward(ctx, grad):
        (mask,) = ctx.saved_tensors
        g = torch.where(mask, grad, torch.zeros((), dtype=grad.dtype, device=grad.device))
        return (None, g) + (None,) * ctx.num_args


def apply(rule, x, *args):
    """The output of ``rule(x, *args)[0]``, differentiable in x as the C++ operators are."""
    return _MaskedRule.apply(rule, x, *args)


def fake_quantize_amax(x, amax, num_bits, unsigned, narrow_range, check_values):
    if check_values:
        _check_amax("amax", amax)
    return apply(rules.fake_quantize_amax, x, amax, num_bits, unsigned, narrow_range)


def fake_quantize_fp8(x, amax, exponent_bits, mantissa_bits, check_values):
    if check_values:
        _check_amax("amax", amax)
    return apply(rules.fake_quantize_fp8, x, amax, exponent_bits, mantissa_bits)


def fake_quantize_affine(x, scale, zero_point, axis, quant_min, quant_max):
    if axis is not None:
        axis %= max(x.dim(), 1)
    s, z = scale.float(), zero_point.double()
    _assert((s > 0) & (s < float("inf")), "scale must be positive and finite (as float32)")
    _assert((z == z.round()) & (z >= quant_min) & (z <= quant_max),
            f"zero_point must hold integers in [quant_min, quant_max] = [{quant_min}, {quant_max}]")
    return apply(rules.fake_quantize_affine, x, scale, zero_point, axis, quant_min, quant_max)


def fake_quantize_min_max(x, min_range, max_range, num_bits):
    step = divide(max_range.float() - min_range.float(), 2**num_bits - 1)
    _assert((step > 0) & (step < float("inf")), "max_range must exceed min_range and both be finite")
    return apply(rules.fake_quantize_min_max, x, min_range, max_range, num_bits)


def fake_quantize_blockwise(x, block_size, num_bits, unsigned, narrow_range, exponent_bits, scale_amax,
                            check_values, e8m0_scale, centered):
    if check_values and scale_amax is not None:
        _check_amax("scale_amax", scale_amax)
    return apply(rules.fake_quantize_blockwise, x, block_size, num_bits, unsigned, narrow_range, exponent_bits,
                 scale_amax, e8m0_scale, centered)
