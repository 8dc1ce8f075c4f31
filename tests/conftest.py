"""Shared test parameters: every op test runs on each device and dtype here; the slow
marker (tests skipped unless FAKEQUANT_SLOW_TESTS=1: `make slow`, `make check`)."""
import os

import pytest
import torch

SLOW = os.environ.get("FAKEQUANT_SLOW_TESTS") == "1"


def pytest_collection_modifyitems(config, items):
    """Tests marked slow (minutes of inductor compilation, ONNX exports of whole models,
    several processes importing transformers) run only with FAKEQUANT_SLOW_TESTS=1."""
    if SLOW:
        return
    skip = pytest.mark.skip(reason="slow: FAKEQUANT_SLOW_TESTS=1 (make slow)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# FAKEQUANT_CUDA_ARITHMETIC=1 (make cuda-arithmetic): every test under CUDA's arithmetic on the
# CPU (tests/cuda_arithmetic.py), so that an expected value or a library path that would come
# out differently on a GPU fails here.
CUDA_ARITHMETIC = os.environ.get("FAKEQUANT_CUDA_ARITHMETIC") == "1"


@pytest.fixture(autouse=True)
def _cuda_arithmetic():
    if not CUDA_ARITHMETIC:
        yield
        return
    from cuda_arithmetic import CudaArithmetic

    with CudaArithmetic():
        yield


_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(t, nan):
    """t's bit patterns as integers, NaN replaced by 0 (NaN payloads are not compared)."""
    return t.masked_fill(nan, 0).view(_BITS[t.element_size()])


def assert_same(actual, expected):
    """Bit-identical values (the sign of zero included; NaN where NaN, any payload),
    same dtype and shape."""
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    a, e = actual.detach().cpu(), expected.detach().cpu()
    if not a.is_floating_point():
        assert torch.equal(a, e)
        return
    nan = a.isnan()
    assert torch.equal(nan, e.isnan())
    ok = _bits(a, nan) == _bits(e, nan)
    if not bool(ok.all()):
        bad = (~ok).nonzero()[:3].tolist()
        raise AssertionError(f"{int((~ok).sum())} of {a.numel()} elements differ, e.g. at {bad}: "
                             f"{[a[tuple(i)].item() for i in bad]} vs {[e[tuple(i)].item() for i in bad]}")


def bits_equal(a, b):
    """torch.equal that tells -0.0 from +0.0 (and takes NaN as equal to NaN): same
    shape, and equal values with equal signs (tensors, or arrays such as ONNX Runtime's)."""
    a, b = torch.as_tensor(a).detach().cpu(), torch.as_tensor(b).detach().cpu()
    if a.shape != b.shape:
        return False
    if not (a.is_floating_point() or b.is_floating_point()):
        return torch.equal(a, b)
    nan = a.isnan()
    if not torch.equal(nan, b.isnan()):
        return False
    a, b = a.masked_fill(nan, 0), b.masked_fill(nan, 0)
    return torch.equal(a, b) and torch.equal(a.signbit(), b.signbit())


def assert_compiled_step_matches_eager(qat_step, device):
    """qat_step(x, w) -> scalar, compiled with fullgraph=True: the same value and gradients
    as eager (a small QAT step through several operators)."""
    x = torch.randn(8, 5, device=device, requires_grad=True)
    w = torch.randn(3, 5, device=device, requires_grad=True)
    compiled = torch.compile(qat_step, fullgraph=True, dynamic=False)
    out_c = compiled(x, w)
    gx_c, gw_c = torch.autograd.grad(out_c, (x, w))
    out_e = qat_step(x, w)
    gx_e, gw_e = torch.autograd.grad(out_e, (x, w))
    assert torch.allclose(out_c, out_e) and torch.allclose(gx_c, gx_e) and torch.allclose(gw_c, gw_e)
