"""tests/cuda_arithmetic.py, the mode that computes CUDA's rounding on the CPU: each difference it
models, that it leaves the CPU's tensors and the gradients alone, and that fakequant's rule for
host-side parameters (fakequant._core.divide) gives one value under it and without it."""
import math

import pytest
import torch

from conftest import bits_equal
from cuda_arithmetic import CudaArithmetic
from fakequant import _core

DEVICE = "cpu"  # what the tests pass as the device: the mode takes it for the GPU's


def reciprocal_product(a, b):
    return a * (torch.tensor(1.0) / torch.tensor(float(b)))


def test_division_by_a_number_multiplies_by_the_rounded_reciprocal():
    a = torch.arange(1, 20001, device=DEVICE, dtype=torch.float32) * 0.01
    for b in (127, 7.0, 448.0, 255):
        plain = a / b
        assert not bits_equal(plain, reciprocal_product(a, b))  # the two differ somewhere
        with CudaArithmetic():
            on_gpu, inplace = a / b, a.clone()
            inplace /= b
            by_func, by_cpu_scalar = torch.div(a, b), a / torch.tensor(float(b))
            by_device_tensor = a / torch.full((), float(b), device=DEVICE)
            helper = _core.divide(a, b)
        for t in (on_gpu, inplace, by_func, by_cpu_scalar):
            assert bits_equal(t, reciprocal_product(a, b))
        assert bits_equal(by_device_tensor, plain) and bits_equal(helper, plain)


def test_tensors_of_the_host_compute_as_the_cpu():
    with CudaArithmetic():
        s = torch.tensor(4.5) / 127  # made without a device: the CPU's, in a run on a GPU too
        moved = torch.tensor([4.5], device=DEVICE).cpu() / 127
        back = torch.tensor(4.5).to(DEVICE) / 127
    assert bits_equal(s, torch.tensor(4.5) / 127) and bits_equal(moved, torch.tensor([4.5]) / 127)
    assert bits_equal(back, reciprocal_product(torch.tensor(4.5), 127))


def test_clamp_orders_negative_zero_below_positive_zero():
    z = torch.tensor([-0.0, 0.0, -1.0, float("nan")], device=DEVICE)
    assert z.clamp(0, 0).signbit().tolist() == [True, False, False, False]  # the CPU keeps -0.0
    with CudaArithmetic():
        got = [z.clamp(0, 0), z.clamp_min(0.0), torch.maximum(z, torch.zeros(4, device=DEVICE)), z.clone().clamp_(0, 0)]
        low = torch.minimum(torch.tensor([0.0], device=DEVICE), torch.tensor([-0.0], device=DEVICE))
        kept = _core.zero_keeping_sign(z)
    for t in got:
        assert t.signbit().tolist()[:3] == [False, False, False] and bool(t[3].isnan())
    assert low.signbit().tolist() == [True]
    assert kept.signbit().tolist()[:3] == [True, False, False] and bool(kept[3].isnan())


def test_inexact_transcendentals_move_by_one_ulp_exact_ones_stay():
    x = torch.tensor([3.0, 4.0, 0.1, 1.0], device=DEVICE)
    with CudaArithmetic():
        l2, e2 = torch.log2(x), torch.exp2(torch.tensor([0.5, 3.0], device=DEVICE))
    assert l2[1].item() == 2.0 and l2[3].item() == 0.0 and e2[1].item() == 8.0
    for got, plain in ((l2[0], torch.log2(x)[0]), (l2[2], torch.log2(x)[2]), (e2[0], torch.exp2(torch.tensor(0.5)))):
        assert got.item() != plain.item()
        assert got.item() == torch.nextafter(plain, torch.tensor(math.inf if got > plain else -math.inf)).item()
    e, _ = torch.frexp(torch.tensor([3.0, 0.1]))
    with CudaArithmetic():
        assert bits_equal(torch.frexp(torch.tensor([3.0, 0.1], device=DEVICE))[0], e)  # frexp is exact


def test_gradients_are_the_cpu_ops():
    a = torch.tensor([1.0, 2.0, 3.0], device=DEVICE, requires_grad=True)
    lo = torch.tensor(-0.0, device=DEVICE, requires_grad=True)
    with CudaArithmetic():
        (torch.log2(a).sum() + (a / 7.0).sum() + a.clamp(lo, torch.tensor(2.5, device=DEVICE)).sum()).backward()
    expected = 1 / (a.detach() * math.log(2)) + 1 / 7.0 + torch.tensor([1.0, 1.0, 0.0])
    torch.testing.assert_close(a.grad, expected)


@pytest.mark.parametrize("divisor", [7, 127, 255, 448.0])
def test_the_rule_gives_one_value(divisor):
    x = torch.rand(4096, device=DEVICE) * 10
    with CudaArithmetic():
        emulated = _core.divide(x, divisor)
    assert bits_equal(emulated, _core.divide(x, divisor)) and bits_equal(emulated, x / divisor)
