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
import torch


def divide(t: torch.Tensor, divisor: float) -> torch.Tensor:
    """``t / divisor`` rounded once (IEEE division in t's floating dtype), the same on every
    device: the divisor is a 0-dim tensor on t's device, which CUDA divides by rather than
    multiplying by its rounded reciprocal. No host-device synchronisation (a fill)."""
    dtype = t.dtype if t.is_floating_point() else torch.get_default_dtype()
    return t / torch.full((), divisor, dtype=dtype, device=t.device)


def zero_keeping_sign(t: torch.Tensor) -> torch.Tensor:
    """0 where t is a number (-0.0 stays -0.0, everything else +0.0), NaN where t is NaN: what
    ``t.clamp(0, 0)`` gives on the CPU, which CUDA's clamp (ordering -0.0 below +0.0) does not."""
    return torch.where(t.isnan() | (t == 0), t, torch.zeros_like(t))
