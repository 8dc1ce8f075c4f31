"""torch.compile with Inductor equals eager, bit for bit: every differentiable op of
fakequant.ops and every dtype, outputs (sign of zero included; NaN where NaN) and
input gradients, on contiguous, channels-last and transposed inputs holding NaN,
+-inf, +-0, ties and values beyond the range; for both compiled paths
(fakequant._composite: the plain-PyTorch composites Inductor fuses, and the C++
operators called opaquely), with no graph break.
"""
import pytest
import torch

import fakequant
from conftest import DEVICES, DTYPES, assert_same
from fakequant import _composite

pytestmark = pytest.mark.slow  # minutes of Inductor compilation

SPECIAL = [float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e-30, -1e-30, 2.5, -2.5, 2.5 / 127 * 0.5,
           -2.5 / 127 * 0.5, 2.5 / 127 * 1.5, 1e4, -1e4, 3.0, -3.0]


def inputs(dtype, device):
    """One input per layout: 4-D contiguous, channels-last, and a transposed 2-D view."""
    g = torch.Generator().manual_seed(0)
    base = (torch.randn(2, 8, 6, 5, generator=g, dtype=torch.float64) * 2).to(dtype)
    flat = base.view(-1)
    flat[: len(SPECIAL)] = torch.tensor(SPECIAL, dtype=torch.float64).to(dtype)
    flat[-len(SPECIAL):] = torch.tensor(SPECIAL[::-1], dtype=torch.float64).to(dtype)
    base = base.to(device)
    return {"contiguous": base, "channels_last": base.to(memory_format=torch.channels_last),
            "transposed": base.reshape(16, 30).t()}


def per_channel(x, values):
    """A parameter of one value per index of dimension 1 (cycled), shaped to broadcast."""
    n = x.shape[1]
    shape = [1] * x.dim()
    shape[1] = n
    return torch.tensor([values[i % len(values)] for i in range(n)], device=x.device).reshape(shape)


def channel_vector(x, values, dtype=torch.float32):
    n = x.shape[1]
    return torch.tensor([values[i % len(values)] for i in range(n)], device=x.device, dtype=dtype)


# Each op as a function of its input: (name, fn). One compiled graph runs them all.
OPS = [
    ("amax per tensor", lambda x: fakequant.fake_quantize_amax(x, torch.tensor(2.5, device=x.device))),
    ("amax per channel, 4-bit unsigned", lambda x: fakequant.fake_quantize_amax(
        x, per_channel(x, [2.5, 0.0, 1e-30, 100.0]), 4, True)),
    ("amax 8-bit wide range", lambda x: fakequant.fake_quantize_amax(
        x, torch.tensor(3.0, device=x.device), 8, False, False)),
    ("fp8 E4M3", lambda x: fakequant.fake_quantize_fp8(x, torch.tensor(2.5, device=x.device))),
    ("fp8 E5M2 per channel", lambda x: fakequant.fake_quantize_fp8(x, per_channel(x, [2.5, 1000.0]), 5, 2)),
    ("fp6 E3M2", lambda x: fakequant.fake_quantize_fp8(x, torch.tensor(3.0, device=x.device), 3, 2)),
    ("affine per tensor", lambda x: fakequant.fake_quantize_per_tensor_affine(x, 0.02, 3, -128, 127)),
    ("affine per channel", lambda x: fakequant.fake_quantize_per_channel_affine(
        x, channel_vector(x, [0.02, 0.5, 1e-3]), channel_vector(x, [0, 7, 255], torch.int32), 1, 0, 255)),
    ("min/max", lambda x: fakequant.fake_quantize_min_max(
        x, torch.tensor(-1.0, device=x.device), torch.tensor(2.5, device=x.device), 4)),
    ("blockwise int4 blocks of 16", lambda x: fakequant.fake_quantize_blockwise(x, 16, 4)),
    ("blockwise NVFP4", lambda x: fakequant.fake_quantize_blockwise(
        x, 16, 4, exponent_bits=2, scale_amax=torch.tensor(100.0, device=x.device))),
    ("blockwise MXFP8", lambda x: fakequant.fake_quantize_blockwise(x, 32, 8, exponent_bits=4, e8m0_scale=True)),
    ("blockwise per token int8 centered", lambda x: fakequant.fake_quantize_blockwise(
        x, x.shape[-1], 8, narrow_range=False, centered=True)),
]


def run_all(xs):
    return [fn(x) for (_, fn), x in zip(OPS, xs)]


@pytest.mark.parametrize("path", _composite.PATHS)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_inductor_equals_eager(path, device, dtype):
    torch._dynamo.reset()
    previous = _composite.compiled_path()
    _composite.set_compiled_path(path)
    try:
        compiled = torch.compile(run_all, fullgraph=True, dynamic=False)
        for layout, x in inputs(dtype, device).items():
            xe = [x.detach().clone(memory_format=torch.preserve_format).requires_grad_() for _ in OPS]
            xc = [x.detach().clone(memory_format=torch.preserve_format).requires_grad_() for _ in OPS]
            ye, yc = run_all(xe), compiled(xc)
            g = torch.randn(x.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64).to(device, dtype)
            torch.autograd.backward(ye, [g] * len(OPS))
            torch.autograd.backward(yc, [g] * len(OPS))
            for (name, _), a, e, ga, gb in zip(OPS, yc, ye, xc, xe):
                try:
                    assert_same(a, e)
                    assert_same(ga.grad, gb.grad)
                except AssertionError as err:
                    raise AssertionError(f"{name}, {layout}: {err}") from None
    finally:
        _composite.set_compiled_path(previous)


@pytest.mark.parametrize("path", _composite.PATHS)
def test_no_graph_break_in_a_quantized_model(path):
    """A quantized model's training step compiles as one graph (0 breaks) on both paths."""
    torch._dynamo.reset()
    previous = _composite.compiled_path()
    _composite.set_compiled_path(path)
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                    torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 4))
        fakequant.quantize_model(model)
        x = torch.randn(2, 3, 8, 8)
        fakequant.calibrate(model, [x], num_batches=1, progress=False)
        explanation = torch._dynamo.explain(model)(x)
        assert explanation.graph_break_count == 0, explanation.break_reasons
        assert explanation.graph_count == 1
    finally:
        _composite.set_compiled_path(previous)


def test_composite_runs_only_under_compile():
    """Eager calls and torch.export keep the C++ operators (the ONNX lowerings need them)."""
    assert not _composite.active()

    class M(torch.nn.Module):
        def forward(self, x):
            return fakequant.fake_quantize_amax(x, torch.tensor(1.0))

    graph = torch.export.export(M(), (torch.randn(4),)).graph_module.code
    assert "fakequant.fake_quantize_amax" in graph


@pytest.mark.parametrize("path", _composite.PATHS)
def test_compiled_value_checks_raise(path):
    """A bad amax raises in compiled code too: the operator's ValueError (opaque), or the
    same message as a RuntimeError from torch._assert_async when the step runs (composite)."""
    torch._dynamo.reset()
    previous = _composite.compiled_path()
    _composite.set_compiled_path(path)
    try:
        f = torch.compile(lambda x, a: fakequant.fake_quantize_amax(x, a), fullgraph=True)
        with pytest.raises(ValueError if path == "opaque" else RuntimeError, match="amax must be finite and >= 0"):
            f(torch.randn(8), torch.tensor(-1.0))
    finally:
        _composite.set_compiled_path(previous)


def test_set_compiled_path_is_public_and_checked():
    assert fakequant.set_compiled_path is _composite.set_compiled_path
    assert fakequant.compiled_path() == "opaque"  # the default (benchmarks/bench_compiled_qat.py)
    with pytest.raises(ValueError, match="path"):
        fakequant.set_compiled_path("fused")
