"""CUDA's arithmetic on the CPU: a torch function mode that computes the torch operations whose
CUDA kernels round differently from the CPU's the way CUDA does (docs/design.md, "One value on
every device"), so that a test or a library path whose result depends on the device fails on a
machine without a GPU too.

``FAKEQUANT_CUDA_ARITHMETIC=1`` turns it on for every test (tests/conftest.py; ``make
cuda-arithmetic``). What it reproduces, each from PyTorch's CUDA kernels:

- true division of a tensor of the GPU by a CPU scalar (a Python number, or a 0-dim tensor that
  would be on the CPU: ``torch.tensor(127.0)`` made without a device, ``.cpu()``) multiplies by
  the reciprocal rounded to the op's compute type (PyTorch's BinaryDivTrueKernel.cu:
  ``a * (1 / b)``); ``a / tensor`` of the device divides. All tensors are CPU tensors here: the
  mode follows which would be on the GPU in a run on one (made with a device, or moved there with
  ``.to``), and computes those alone as CUDA does.
- ``clamp``, ``clamp_min``, ``clamp_max``, ``maximum``, ``minimum`` order -0.0 below +0.0
  (the GPU's min/max instructions): ``(-0.0).clamp(0, 0)`` is +0.0 on CUDA, -0.0 on the CPU.
- ``exp``, ``exp2``, ``log``, ``log2``, ``pow`` of float32/float16/bfloat16 are within an ulp or
  two on CUDA, not correctly rounded: where the exact result is not a float32, the mode returns
  the other float32 neighbour of it (a result CUDA may give), so a value that depends on the
  last bit of a transcendental fails here as it could on the GPU.

What it does not reproduce: the order of floating-point sums (compare reductions within a
tolerance), NaN payloads (the tests compare NaN as NaN), the CUDA random generator (make inputs
on the CPU, then move them), floor division by a CPU scalar, and arithmetic inside C++ (the
kernels share one element rule; the emulated kernels are compared with the CPU's in
tests/test_cuda_emulated.py).
"""
import math
import numbers

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.overrides import TorchFunctionMode

_TAG = "_fakequant_on_the_host"

_DIV = {torch.div, torch.true_divide, torch.divide, torch.Tensor.div, torch.Tensor.true_divide,
        torch.Tensor.divide, torch.Tensor.__truediv__}
_DIV_INPLACE = {torch.Tensor.div_, torch.Tensor.true_divide_, torch.Tensor.divide_, torch.Tensor.__itruediv__}
_FACTORIES = {torch.tensor, torch.as_tensor, torch.scalar_tensor, torch.full, torch.zeros, torch.ones,
              torch.empty, torch.arange, torch.linspace, torch.logspace, torch.rand, torch.randn, torch.randint,
              torch.randperm, torch.eye, torch.empty_strided}
_LIKE = {torch.zeros_like, torch.ones_like, torch.full_like, torch.empty_like, torch.rand_like, torch.randn_like,
         torch.randint_like}
_CLAMP = {torch.clamp, torch.clip, torch.Tensor.clamp, torch.Tensor.clip, torch.clamp_min, torch.clamp_max,
          torch.Tensor.clamp_min, torch.Tensor.clamp_max, torch.maximum, torch.minimum, torch.Tensor.maximum,
          torch.Tensor.minimum}
_CLAMP_INPLACE = {torch.Tensor.clamp_, torch.Tensor.clip_, torch.Tensor.clamp_min_, torch.Tensor.clamp_max_}
_TRANSCENDENTAL = {torch.exp, torch.exp2, torch.log, torch.log2, torch.pow, torch.Tensor.exp, torch.Tensor.exp2,
                   torch.Tensor.log, torch.Tensor.log2, torch.Tensor.pow, torch.Tensor.__pow__,
                   torch.Tensor.__rpow__, torch.special.exp2}


def _is_cpu_scalar(b):
    if isinstance(b, numbers.Number) and not isinstance(b, complex):
        return True
    return isinstance(b, torch.Tensor) and b.dim() == 0 and getattr(b, _TAG, False)


class _Value(torch.autograd.Function):
    """``value``'s numbers with ``out``'s gradient: the mode changes values only."""

    @staticmethod
    def forward(ctx, out, value):
        return value.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def _with_value(out, value):
    if torch.equal(out.isnan(), value.isnan()) and bool((out.masked_fill(out.isnan(), 0).view(_INT[out.dtype]) ==
                                                         value.masked_fill(value.isnan(), 0).view(_INT[out.dtype])).all()):
        return out
    return _Value.apply(out, value) if out.requires_grad else value


_INT = {torch.float64: torch.int64, torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}


def _divide_like_cuda(a, b):
    """CUDA's a / b for a CPU scalar b: a * (1 / b), the reciprocal in the op's compute type."""
    dtype = torch.result_type(a, b)
    if not dtype.is_floating_point or dtype not in _INT:
        return None
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    value = b.item() if isinstance(b, torch.Tensor) else b
    inv = torch.tensor(1.0, dtype=compute) / torch.tensor(value, dtype=compute)
    return (a.detach().to(compute) * inv).to(dtype)


def _zero_ordered(result, a, b, take_max):
    """Where a and b are zeros of both signs, the GPU's max gives +0.0 and its min -0.0."""
    b = torch.as_tensor(b, dtype=result.dtype)
    both_zero = (a == 0) & (b == 0) & (a.signbit() != b.signbit())
    if not bool(both_zero.any()):
        return result
    zero = torch.zeros((), dtype=result.dtype) if take_max else torch.tensor(-0.0, dtype=result.dtype)
    return torch.where(both_zero, zero, result)


@torch.no_grad()
def _clamp_like_cuda(name, out, args, kwargs):
    """clamp(x, lo, hi) as CUDA computes it: NaN stays, else min(max(x, lo), hi) with -0.0 < +0.0."""
    x = args[0].to(out.dtype)
    if name in ("maximum", "minimum"):
        other = args[1] if len(args) > 1 else kwargs["other"]
        return _zero_ordered(out.detach(), x, other, name == "maximum")
    if name.startswith("clamp_min"):
        lo, hi = (args[1] if len(args) > 1 else kwargs.get("min")), None
    elif name.startswith("clamp_max"):
        lo, hi = None, (args[1] if len(args) > 1 else kwargs.get("max"))
    else:
        lo = args[1] if len(args) > 1 else kwargs.get("min")
        hi = args[2] if len(args) > 2 else kwargs.get("max")
    y = x
    if lo is not None:
        y = _zero_ordered(torch.where(y.isnan(), y, torch.maximum(y, torch.as_tensor(lo, dtype=y.dtype))), y, lo, True)
    if hi is not None:
        y = _zero_ordered(torch.where(y.isnan(), y, torch.minimum(y, torch.as_tensor(hi, dtype=y.dtype))), y, hi, False)
    return y.expand_as(out)


def _other_neighbour(r32, exact):
    """The float32 neighbour of ``exact`` (float64) that ``r32`` is not, where ``exact`` is no float32."""
    inexact = torch.isfinite(exact) & (r32.to(torch.float64) != exact) & torch.isfinite(r32) & (r32 != 0)
    if not bool(inexact.any()):
        return r32
    toward = torch.where(exact > r32.to(torch.float64), torch.tensor(math.inf), torch.tensor(-math.inf))
    return torch.where(inexact, torch.nextafter(r32, toward), r32)


@torch.no_grad()
def _transcendental_like_cuda(func, out, args, kwargs):
    args64 = [a.detach().to(torch.float64) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
    exact = func(*args64, **kwargs)
    if not isinstance(exact, torch.Tensor) or exact.dtype != torch.float64 or exact.shape != out.shape:
        return None
    # CUDA computes float16 and bfloat16 in float32, then rounds
    r32 = out.detach().to(torch.float32) if out.dtype == torch.float32 else exact.to(torch.float32)
    return _other_neighbour(r32, exact).to(out.dtype)


class CudaArithmetic(TorchFunctionMode):
    """Computes, on CPU tensors, what the torch operations listed in the module's docstring
    compute on CUDA tensors (values only: gradients are the CPU op's).

    All tensors are CPU tensors here; the mode follows which of them would be on the CPU in a
    run on a GPU (made without a device, ``.cpu()``, or computed from such tensors alone: they
    compute as the CPU does) and which on the GPU (made with a device, or moved with ``.to``)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if torch.compiler.is_compiling():  # what Dynamo traces is the op itself
            return func(*args, **kwargs)
        inplace = func in _DIV_INPLACE or func in _CLAMP_INPLACE
        before = (args[0].detach().clone(), *args[1:]) if inplace else args
        out = func(*args, **kwargs)
        if not isinstance(out, torch.Tensor) or "out" in kwargs or out.device.type != "cpu" or isinstance(out, FakeTensor):
            return out  # (meta tensors of a model being built, fake tensors of a trace: no values)
        value = None
        if _on_the_gpu(args[0] if args else None):
            if (func in _DIV or func in _DIV_INPLACE) and len(args) >= 2 and kwargs.get("rounding_mode") is None \
                    and _is_cpu_scalar(args[1]):
                value = _divide_like_cuda(before[0], args[1])
            elif (func in _CLAMP or func in _CLAMP_INPLACE) and out.is_floating_point() and out.dtype in _INT:
                value = _clamp_like_cuda(func.__name__, out, before, kwargs)
            elif func in _TRANSCENDENTAL and out.dtype in (torch.float32, torch.float16, torch.bfloat16):
                value = _transcendental_like_cuda(func, out, args, kwargs)
        if value is not None:
            if inplace:
                with torch.no_grad():
                    out.copy_(value)
                return out
            return _with_value(out, value)
        if out.device.type == "cpu":
            on_host = _on_the_host(func, args, kwargs)
            if on_host and not getattr(out, _TAG, False):
                setattr(out, _TAG, True)
            elif not on_host and getattr(out, _TAG, False):
                # .to(device) returned the CPU tensor itself: in a run on a GPU it is a new tensor there
                # (and the CPU one, seldom used again, is taken to have moved with it)
                setattr(out, _TAG, False)
        return out


def _on_the_gpu(t):
    return isinstance(t, torch.Tensor) and not getattr(t, _TAG, False)


def _on_the_host(func, args, kwargs):
    """Whether the result would be a CPU tensor in a run on a GPU."""
    if func in _FACTORIES:
        return kwargs.get("device") is None
    if func is torch.Tensor.cpu or func is torch.from_numpy:
        return True
    if func is torch.Tensor.to:
        # to(device) follows the device of the run (tests pass "cpu" or "cuda"); to(other) follows
        # other; to(dtype) keeps where it is
        where = [a for a in (*args[1:], kwargs.get("device"), kwargs.get("other"))
                 if isinstance(a, (str, torch.device, torch.Tensor))]
        if where:
            return isinstance(where[0], torch.Tensor) and getattr(where[0], _TAG, False)
    tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
    tensors += [t for a in args if isinstance(a, (list, tuple)) for t in a if isinstance(t, torch.Tensor)]
    if func in _LIKE and kwargs.get("device") is not None:
        return False
    return bool(tensors) and all(getattr(t, _TAG, False) for t in tensors)
