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
  one-bit packed mask), called from the compiled graph. On CUDA (``FUSED_BACKWARD_DEVICE_TYPES``)
  their backward, the gradient where the packed mask's bit is set, is plain PyTorch
  (``masked_grad``), which Inductor fuses into the backward's neighbouring kernels: one
  launch and one pass fewer an operator, exact (a select).
- ``"composite"``: the rules above, for CPU tensors; the backward keeps the bool mask (8
  bits per element), which Inductor computes in the forward's fused loop, unless the
  partitioner recomputes it from what it saves anyway. Tensors on other devices keep the
  operators (``EXACT_DEVICE_TYPES``): Inductor's CUDA kernels do not compute the rules'
  arithmetic as eager PyTorch does. Triton divides float32 with ``div.full.f32`` (an
  approximation, within 2 ulp) where eager CUDA divides exactly; Inductor multiplies by the
  reciprocal where the divisor is a constant; and it contracts a product and a sum into one
  fused multiply-add (``x * (1 / d) + 8.5`` in GGML's Q4_0 rule), each a different value
  at some inputs (docs/compile-distributed.md).

``benchmarks/bench_compiled_qat.py`` measures both (docs/performance.md): on the
2-core CPU the opaque operators were faster in both models measured (ResNet-18
1.12x the compiled float step against 1.18x, a small Llama 1.06x against 1.11x),
so they are the default. On CUDA the composites would be the route to Inductor's fused
Triton kernels, once their arithmetic there is exact (above).
"""
import warnings

import torch

from . import rules
from .._core.numerics import divide
from .._core.export_state import onnx_export_enabled

__all__ = ["set_compiled_path", "compiled_path", "active", "apply"]

PATHS = ("composite", "opaque")
_path = "opaque"

#: The device types whose compiled code computes the rules as eager does, bit for bit
#: (tests/test_compiled.py): Inductor's C++ for the CPU. Elsewhere the composite path
#: keeps the operators.
EXACT_DEVICE_TYPES = ("cpu",)


#: The device types whose compiled graphs take an operator's backward as :func:`masked_grad`
#: (plain PyTorch that Inductor fuses into the backward's neighbouring kernels) instead of a
#: call of ``mask_backward``. Exact everywhere (a select); chosen by speed. On CUDA a compiled
#: step of the models measured is the host's time per launch (docs/performance.md), and each
#: operator's backward was a call from the graph's wrapper and a kernel of its own. On the
#: CPU it lost: Inductor's C++ loads the mask's bytes one at a time where mask_backward's loop
#: is vectorised (the ResNet-18 step 2-4% slower, a small Llama's 5.5%), though it saved the
#: host a call (docs/compile-distributed.md).
FUSED_BACKWARD_DEVICE_TYPES = ("cuda",)


def set_compiled_path(path: str) -> None:
    """What fakequant's operators become under ``torch.compile``: ``"opaque"`` (the
    C++ operators, as eager; the default) or ``"composite"`` (plain-PyTorch rules that
    Inductor fuses with their neighbours, with the eager numerics bit for bit), which
    applies to CPU tensors: on other devices the operators stay (``EXACT_DEVICE_TYPES``;
    a UserWarning says so where CUDA is available). Read while Dynamo traces: functions
    compiled before the change recompile on their next call (a guard on the setting)."""
    global _path
    if path not in PATHS:
        raise ValueError(f"fakequant: path must be one of {PATHS}, got {path!r}")
    if path == "composite" and torch.cuda.is_available():
        warnings.warn("fakequant: the composite path applies to CPU tensors; CUDA tensors keep the C++ operators "
                      "under torch.compile, because Inductor's CUDA kernels would compute the rules' divisions "
                      "and multiply-adds with other roundings than eager (docs/compile-distributed.md)",
                      UserWarning, stacklevel=2)
    _path = path


def compiled_path() -> str:
    """The current setting of :func:`set_compiled_path`."""
    return _path


def active(x: torch.Tensor) -> bool:
    """Whether an op called now on ``x`` should run as its composite: Dynamo is tracing for
    torch.compile (not torch.export, not an ONNX export), the path is "composite" and x is
    on a device of ``EXACT_DEVICE_TYPES``."""
    return (_path == "composite" and x.device.type in EXACT_DEVICE_TYPES and torch.compiler.is_compiling()
            and not torch.compiler.is_exporting() and not onnx_export_enabled())


def _assert(ok, message):
    """The eager operators' value check, as an assertion that the compiled code runs:
    a RuntimeError with the eager message (less the offending index) when it fails."""
    torch._assert_async(ok.all(), f"fakequant: {message}")


def _check_amax(name, amax):
    a = amax.float()
    _assert((a >= 0) & (a < float("inf")), f"{name} must be finite and >= 0 (as float32)")


class _MaskedRule(torch.autograd.Function):
    """y, mask = rule(x); the gradient of x is grad where mask, else 0."""

    @staticmethod
    def forward(ctx, x, rule):
        y, mask = rule(x)
        ctx.save_for_backward(mask)
        return y

    @staticmethod
    def backward(ctx, grad):
        (mask,) = ctx.saved_tensors
        return torch.where(mask, grad, torch.zeros((), dtype=grad.dtype, device=grad.device)), None


def _memory_order(stride) -> list:
    """The dimensions of a dense tensor with ``stride``, from the largest stride to the
    smallest: the order in which a packed mask's bits follow its elements. (An insertion
    sort by comparisons: Dynamo sorts no symbolic keys, and guards on each comparison.)"""
    order: list = []
    for d in range(len(stride)):
        i = len(order)
        while i > 0 and stride[order[i - 1]] < stride[d]:
            i -= 1
        order.insert(i, d)
    return order


def packed_bits(mask: torch.Tensor, n: int) -> torch.Tensor:
    """The first ``n`` bits of a packed mask as a flat bool tensor: bit i is bit i % 8 of
    byte i // 8 (the operators' layout; csrc/include/fakequant/contract.h)."""
    shifts = torch.arange(8, dtype=torch.uint8, device=mask.device)
    return ((mask.unsqueeze(-1) >> shifts) & 1).flatten()[:n].bool()


def masked_grad(grad: torch.Tensor, mask: torch.Tensor, output_stride) -> torch.Tensor:
    """``mask_backward(grad, mask, output_stride)`` in plain PyTorch, for Inductor to fuse:
    ``grad`` where the packed mask's bit is set, else +0. Bit i (bit i % 8 of byte i // 8)
    belongs to the element at offset i of the forward's output, a dense tensor with
    ``output_stride``. A select, so exact on every device."""
    order = _memory_order(output_stride)
    g = grad.permute(order)  # a view whose row-major order is the output's memory order
    out = torch.where(packed_bits(mask, g.numel()).view(g.shape), g, torch.zeros((), dtype=grad.dtype, device=grad.device))
    inverse = [0] * len(order)
    for i, d in enumerate(order):
        inverse[d] = i
    return out.permute(inverse)


class _PackedMaskOp(torch.autograd.Function):
    """y = op(x)[0], an operator returning (output, packed mask): the C++ kernel's one pass
    and one-bit mask in the forward; the gradient of x is :func:`masked_grad` of the mask,
    which Inductor fuses with the backward's neighbouring loops where the operator's
    autograd formula would call mask_backward, a pass of its own."""

    @staticmethod
    def forward(ctx, x, op):
        y, mask = op(x)
        ctx.save_for_backward(mask)
        ctx.output_stride = y.stride()
        return y

    @staticmethod
    def backward(ctx, grad):
        (mask,) = ctx.saved_tensors
        return masked_grad(grad, mask, ctx.output_stride), None


def fuses_backward(x: torch.Tensor) -> bool:
    """Whether an operator called now on ``x`` should take :class:`_PackedMaskOp`'s backward:
    Dynamo is tracing for torch.compile (not torch.export, not an ONNX export), x requires grad
    and is on a device of ``FUSED_BACKWARD_DEVICE_TYPES``."""
    return (torch.compiler.is_compiling() and x.requires_grad and x.device.type in FUSED_BACKWARD_DEVICE_TYPES
            and not torch.compiler.is_exporting() and not onnx_export_enabled())  # (eager: the first test, 0.1 us)


def apply_packed(op, x):
    """``op(x)[0]`` for an operator ``op`` returning (output, packed mask), differentiable in
    x through :func:`masked_grad` (:class:`_PackedMaskOp`)."""
    return _PackedMaskOp.apply(x, op)


def apply(rule, x, *args):
    """The output of ``rule(x, *args)[0]``, differentiable in x as the C++ operators are.
    (The rule and its arguments reach the autograd function as one callable: passed one by
    one, Dynamo bound them to the wrong parameters where x does not require grad and no
    argument is a tensor, GGML's (x, block_size, num_bits), in torch 2.13.)"""
    return _MaskedRule.apply(x, lambda t: rule(t, *args))


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
