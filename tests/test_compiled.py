"""torch.compile with Inductor equals eager, bit for bit: every differentiable op of
fakequant.ops and every dtype, outputs (sign of zero included; NaN where NaN) and
input gradients, on contiguous, channels-last and transposed inputs holding NaN,
+-inf, +-0, ties and values beyond the range; for both compiled paths
(fakequant.composite.compiled: the plain-PyTorch composites Inductor fuses, and the C++
operators called opaquely), with no graph break.
"""
import pytest
import torch

import fakequant
import op_table
from conftest import DEVICES, DTYPES, assert_same
from fakequant.composite import compiled as _composite

pytestmark = pytest.mark.slow  # minutes of Inductor compilation

# Each public call of the op table (tests/op_table.py) as a function of its input: (name, fn).
# One compiled graph runs them all.
OPS = op_table.compiled_calls()


LAYOUTS = ("contiguous", "channels_last", "transposed")


def inputs(dtype, device, layouts=LAYOUTS):
    """One input per layout: 4-D contiguous, channels-last, and a transposed 2-D view, holding
    NaN, +-inf, +-0, ties and values beyond the range (op_table.sample_input)."""
    return dict(op_table.samples(dtype, device, layouts, special=True))


def run_all(xs):
    return [fn(x) for (_, fn), x in zip(OPS, xs)]


@pytest.mark.parametrize("path", _composite.PATHS)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_inductor_equals_eager(path, device, dtype):
    check_inductor_equals_eager(path, device, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_backward_on_the_cpu_equals_eager(dtype, monkeypatch):
    """The opaque path with the operators' backward fused into Inductor's kernels
    (FUSED_BACKWARD_DEVICE_TYPES: CUDA's default, which test_inductor_equals_eager runs where a
    GPU is) on the CPU: every op, layout and dtype bit for bit eager."""
    monkeypatch.setattr(_composite, "FUSED_BACKWARD_DEVICE_TYPES", ("cpu",))
    check_inductor_equals_eager("opaque", "cpu", dtype)


def _mask_backward_calls(step):
    with torch.profiler.profile() as prof:
        step()
    return sum(e.count for e in prof.key_averages() if e.key == "fakequant::mask_backward")


@pytest.mark.parametrize("fused", [False, True])
def test_fused_backward_calls_no_mask_backward(fused, monkeypatch):
    monkeypatch.setattr(_composite, "FUSED_BACKWARD_DEVICE_TYPES", ("cpu",) if fused else ())
    check_mask_backward_calls("cpu", fused)


def check_mask_backward_calls(device, fused):
    """Where the backward is fused, the compiled step calls no mask_backward (its selection is
    in Inductor's kernels) and saves the packed mask (uint8, a bit an element); where not, a
    call an operator. The gradients are eager's, bit for bit, either way."""
    torch._dynamo.reset()
    x = torch.randn(2, 8, 6, 5, device=device).to(memory_format=torch.channels_last).requires_grad_()
    w = torch.randn(8, 6, 5, device=device, requires_grad=True)

    def f(x, w):
        a = fakequant.fake_quantize_amax(x * 1.5, 2.0)  # an activation's quantizer
        b = fakequant.fake_quantize_blockwise(w, 16, num_bits=4, exponent_bits=2)  # NVFP4 weights
        return (a * b).sum()

    compiled_f = torch.compile(f, fullgraph=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        loss = compiled_f(x, w)
    assert any(t.dtype == torch.uint8 and t.numel() == (x.numel() + 7) // 8 for t in saved), \
        [(t.dtype, t.shape) for t in saved]
    assert not any(t.dtype == torch.bool and t.numel() in (x.numel(), w.numel()) for t in saved)
    calls = _mask_backward_calls(lambda: loss.backward())
    assert calls == 0 if fused else calls >= 2  # (the profiler records an operator at more than one level)
    gx, gw = x.grad, w.grad
    x.grad = w.grad = None
    f(x, w).backward()
    assert_same(gx, x.grad)
    assert_same(gw, w.grad)


def check_inductor_equals_eager(path, device, dtype, layouts=LAYOUTS):
    torch._dynamo.reset()
    previous = _composite.compiled_path()
    _composite.set_compiled_path(path)
    try:
        compiled = torch.compile(run_all, fullgraph=True, dynamic=False)
        for layout, x in inputs(dtype, device, layouts).items():
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
    assert not _composite.active(torch.randn(4))

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
