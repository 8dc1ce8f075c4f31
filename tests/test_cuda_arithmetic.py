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


def inductor_cuda_division(gm, example_inputs):
    """What Inductor's CUDA code makes of an FX graph's divisions by a constant (its lowering
    of ``div``, ``torch._inductor.lowering.div_prim``): the product by the divisor's
    reciprocal rounded to the dividend's dtype. The graph's other operations run as eager."""
    for node in list(gm.graph.nodes):
        divisor = node.args[1] if node.target is torch.ops.aten.div.Tensor else None
        if isinstance(divisor, torch.fx.Node) and divisor.target is torch.ops.aten.full.default:
            node.target, node.args = torch.ops.aten.mul.Tensor, (node.args[0], 1.0 / divisor.args[1])
    gm.graph.lint()
    gm.recompile()
    return gm


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_rule_is_exact_where_inductor_multiplies_by_the_reciprocal(dtype):
    """Compiled, _core.divide divides a narrower dividend in float64, rounded once to its dtype:
    where Inductor's CUDA code multiplies by the rounded reciprocal instead, the result is still the
    quotient, for every divisor the library passes; the same rewrite of a float32 division
    (what divide computed before) gives other values."""
    from torch._dynamo.backends.common import aot_autograd

    backend = aot_autograd(fw_compiler=inductor_cuda_division)
    # dividends: every float32 significand step in [1, 2) at a stride, scaled across the range
    base = 1.0 + torch.arange(0, 2**23, 37, dtype=torch.float64) / 2**23
    x = torch.cat([base * 2.0**e for e in (-20, -3, 0, 1, 7, 30)]).to(dtype)
    divisors = [3, 7, 15, 127, 255, 448, 2**16 - 1, 6 * 448, 7.5 * 448, 28 * 448, -8.0, 57344 * 448, 12.0, 2048]
    plain_changed = False
    for divisor in divisors:
        torch._dynamo.reset()
        compiled = torch.compile(lambda t: _core.divide(t, divisor), backend=backend, fullgraph=True)(x)
        quotient = (x.double() / divisor).to(dtype)  # rounded once
        assert bits_equal(compiled, quotient) and bits_equal(_core.divide(x, divisor), quotient), divisor
        torch._dynamo.reset()
        plain = torch.compile(lambda t: t / torch.full((), divisor, dtype=dtype), backend=backend, fullgraph=True)(x)
        plain_changed |= not bits_equal(plain, quotient)
    # (the rewrite does change a float32 division; bfloat16 and float16 multiply in float32,
    # which rounds to them as the quotient does here)
    assert plain_changed or dtype != torch.float32


def test_the_rule_refuses_divisors_it_cannot_keep_exact():
    for divisor in (0, 0.1, 2**24 + 1, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="odd part"):
            _core.divide(torch.ones(2), divisor)
    assert bits_equal(_core.divide(torch.ones(2, dtype=torch.float64), 0.1), torch.ones(2, dtype=torch.float64) / 0.1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_a_number_over_a_tensor_is_rounded_once(dtype):
    """_core.divide_into(d, t) is RN(d / t) in t's dtype (pytorch-quantization's torch.tensor(bound)
    / amax), under CUDA's arithmetic, compiled and eager alike; d / t is t.reciprocal() * d,
    which differs."""
    from torch._dynamo.backends.common import aot_autograd

    t = (1.0 + torch.arange(0, 2**23, 61, dtype=torch.float64) / 2**23).mul(3.0).to(dtype)
    backend = aot_autograd(fw_compiler=inductor_cuda_division)
    for dividend in (127, 7, 255, 65535, 2688, 0.5):
        quotient = (torch.full_like(t, dividend, dtype=torch.float64) / t.double()).to(dtype)  # rounded once
        with CudaArithmetic():
            eager = _core.divide_into(dividend, t)
        torch._dynamo.reset()
        compiled = torch.compile(lambda a: _core.divide_into(dividend, a), backend=backend, fullgraph=True)(t)
        assert bits_equal(eager, quotient) and bits_equal(compiled, quotient), dividend
        assert dtype == torch.float16 or dividend == 0.5 or not bits_equal(dividend / t, quotient)
    with pytest.raises(ValueError, match="divide_into's dividend must be .* odd part"):
        _core.divide_into(0.1, t)
