"""One value on every device (docs/design.md): the forms of host-side torch arithmetic that
round the same on the CPU and on CUDA.

PyTorch's CUDA kernels divide a tensor by a Python number or by a 0-dim CPU tensor as
``a * (1 / b)``, the reciprocal rounded first (PyTorch's BinaryDivTrueKernel.cu),
while the CPU divides: float32 ``a * RN(1/b)`` differs from ``RN(a / b)`` for about 4% of values
at b = 127 and for over half at b = 7, 15, 255 or 448. A quantization parameter (a scale, a
step, a histogram's bin width) computed on the host from a tensor and a number therefore divides
by a tensor on the tensor's own device, here, and nowhere else by hand. tests/cuda_arithmetic.py
reproduces CUDA's rounding on the CPU, so that a form that breaks this fails the suite
(``make cuda-arithmetic``).
"""
import math

import torch


def divide(t: torch.Tensor, divisor: float) -> torch.Tensor:
    """``t / divisor`` rounded once to t's floating dtype (the default dtype for integer t), the
    same on every device, eager and under ``torch.compile``. No host-device synchronisation.

    - The divisor is a 0-dim tensor on t's device, which CUDA divides by rather than
      multiplying by its rounded reciprocal (as it does for a Python number).
    - Under ``torch.compile`` Inductor's CUDA code multiplies by a constant divisor's reciprocal
      all the same (its ``div`` lowering; and Triton's float32 division is approximate), so
      there a dividend narrower than float64 is divided in float64 and rounded once: the
      float64 quotient rounds to the correctly rounded one (53 >= 2 * 24 + 2 bits), and so does
      the float64 product by the reciprocal where the divisor is an integer times a power of
      two whose odd part is below 2^24 (the quotient is then farther from a rounding boundary
      than the product's error; tests/test_cuda_arithmetic.py checks the divisors in use).
      Eager, float32 divides in float32 (the same value, and no conversions to launch);
      float16 and bfloat16 in float64 as well, where the divisor may not be exact in them.
    - Other divisors of a dividend narrower than float64 raise ValueError.
    - An export writes the division in t's dtype (TensorRT has no float64)."""
    dtype = t.dtype if t.is_floating_point() else torch.get_default_dtype()
    if dtype == torch.float64 or torch.compiler.is_exporting() or torch.jit.is_tracing():
        return t / torch.full((), divisor, dtype=dtype, device=t.device)
    _check_divisor(divisor)
    if dtype == torch.float32 and not torch.compiler.is_compiling():
        return t.to(dtype) / torch.full((), divisor, dtype=dtype, device=t.device)
    wide = t.to(dtype).to(torch.float64)
    return (wide / torch.full((), divisor, dtype=torch.float64, device=t.device)).to(dtype)


def divide_into(dividend: float, t: torch.Tensor) -> torch.Tensor:
    """``dividend / t`` for a floating tensor t, rounded once to t's dtype, the same on every
    device, eager and under ``torch.compile``: what a tensor dividend gives
    (pytorch-quantization's ``torch.tensor(bound) / amax``). A Python number over a tensor
    (``bound / t``) is ``t.reciprocal() * bound`` in PyTorch, two roundings: in float32 one
    step off RN(127 / amax) for about a quarter of the values of amax.

    Eager, float32 and float64 divide in t's dtype; under ``torch.compile`` (Triton's float32
    division is approximate) and in float16 and bfloat16, in float64, rounded once (as
    :func:`divide`). ``dividend`` is an integer times a power of two whose odd part is below
    2^24 (exact in float32), as :func:`divide`'s divisor is."""
    _check_divisor(dividend, "divide_into's dividend")
    if t.dtype == torch.float64 or torch.compiler.is_exporting() or torch.jit.is_tracing() or (
            t.dtype == torch.float32 and not torch.compiler.is_compiling()):
        return torch.full_like(t, dividend) / t
    wide = t.to(torch.float64)
    return (torch.full_like(wide, dividend) / wide).to(t.dtype)


def _check_divisor(divisor: float, name: str = "divide's divisor") -> None:
    if type(divisor) in (int, float) and 0 < abs(divisor) < 2**24 and float(divisor).is_integer():
        return  # (the usual divisors: integers below 2^24)
    numerator = abs(float(divisor)).as_integer_ratio()[0] if math.isfinite(divisor) else 0  # (over a power of two)
    if numerator == 0 or numerator >> ((numerator & -numerator).bit_length() - 1) >= 2**24:
        raise ValueError(f"fakequant: {name} must be a nonzero integer times a power of two whose odd part is "
                         f"below 2^24 (the quotient exact under torch.compile on every device), got {divisor!r}")


def zero_keeping_sign(t: torch.Tensor) -> torch.Tensor:
    """0 where t is a number (-0.0 stays -0.0, everything else +0.0), NaN where t is NaN: what
    ``t.clamp(0, 0)`` gives on the CPU, which CUDA's clamp (ordering -0.0 below +0.0) does not."""
    return torch.where(t.isnan() | (t == 0), t, torch.zeros_like(t))
