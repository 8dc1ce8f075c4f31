"""One tiny-amax rule on every path (docs/design.md, "numerics"): an amax <= 2^-24
(AMAX_EPSILON) quantizes every element to +0 (NaN stays NaN), the input's gradient
passes where |x| <= amax, and a learned range gets no gradient from the scale there.

Each path is driven to amax = 2^-30, 0 and 2^-24 (degenerate) and to the float32 just
above 2^-24 (the first ordinary amax): the operators, the plain-PyTorch rules, the
composites under torch.compile, a learned amax with PACT's and with LSQ's gradient,
torch's native fake quantization (``use_fb_fake_quant``) and the ONNX lowering run in
ONNX Runtime. Each must give the amax operator's output bit for bit, and its gradients.
"""
import contextlib

import pytest
import torch

import fakequant
from fakequant import _core, ops
from fakequant.composite import compiled as _composite, rules as reference
from fakequant.nn import TensorQuantizer
from fakequant.tensor_quant import QuantDescriptor

from conftest import bits_equal, ort_session

EPS = _core.AMAX_EPSILON
ABOVE = float(torch.nextafter(torch.tensor(EPS), torch.tensor(1.0)))  # the first ordinary amax
DEGENERATE = [2.0**-30, 0.0, EPS]
AMAXES = DEGENERATE + [ABOVE]


def _inputs(amax):
    """Elements at, inside and outside +-amax, both zeros, NaN and +-inf."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(96, generator=g) * 1e-7
    x[:10] = torch.tensor([0.0, -0.0, amax, -amax, amax / 2, -amax / 2, 3.0, float("nan"), float("inf"),
                           -float("inf")])
    return x


def _grad_out(n):
    return torch.arange(1.0, n + 1.0)


def _op(x, amax):
    """The amax operator's output and input gradient: the rule every path must follow."""
    x = x.clone().requires_grad_()
    y = ops.fake_quantize_amax(x, torch.tensor(amax), 8, False, True)
    y.backward(_grad_out(x.numel()))
    return y.detach(), x.grad


@pytest.mark.parametrize("amax", AMAXES)
def test_degenerate_amax_quantizes_to_zero_in_the_operators_and_the_rules(amax):
    x = _inputs(amax)
    y, gx = _op(x, amax)
    if amax <= EPS:
        expected = torch.where(x.isnan(), x, torch.zeros_like(x))
        assert bits_equal(y, expected)
        assert torch.equal(gx != 0, (x.abs() <= amax))
    a = torch.tensor(amax)
    ry, rmask = reference.fake_quantize_amax(x, a, 8, False, True)
    assert bits_equal(ry, y)
    assert torch.equal(torch.where(rmask, _grad_out(x.numel()), 0.0), gx)
    for fmt in ((4, 3), (5, 2)):
        fy = ops.fake_quantize_fp8(x, a, *fmt)
        assert bits_equal(fy, reference.fake_quantize_fp8(x, a, *fmt)[0])
        if amax <= EPS:  # (a float grid keeps the sign of a zero input: -0.0 stays -0.0)
            assert torch.equal(fy.isnan(), x.isnan()) and bool((fy[~x.isnan()] == 0).all())
    # Block-wise: a block whose max |x| is the amax.
    blocks = torch.where(x.abs() <= amax, x, torch.zeros_like(x)).reshape(6, 16)
    by = ops.fake_quantize_blockwise(blocks, 16, 8, False, True)
    assert bits_equal(by, reference.fake_quantize_blockwise(blocks, 16, 8, False, True)[0])
    if amax <= EPS:
        assert bits_equal(by, torch.zeros_like(blocks))


@pytest.mark.parametrize("amax", AMAXES)
def test_the_composites_under_torch_compile_follow_the_rule(amax):
    x = _inputs(amax)
    y, gx = _op(x, amax)

    def f(t, a):
        return ops.fake_quantize_amax(t, a, 8, False, True)

    previous = _composite.compiled_path()
    _composite.set_compiled_path("composite")
    try:
        torch._dynamo.reset()
        xc = x.clone().requires_grad_()
        yc = torch.compile(f, backend="aot_eager", fullgraph=True)(xc, torch.tensor(amax))
        yc.backward(_grad_out(x.numel()))
    finally:
        _composite.set_compiled_path(previous)
        torch._dynamo.reset()
    assert bits_equal(yc, y)
    assert bits_equal(xc.grad, gx)


@contextlib.contextmanager
def _learn_amax_method(method):
    previous = TensorQuantizer.learn_amax_method
    TensorQuantizer.learn_amax_method = method
    try:
        yield
    finally:
        TensorQuantizer.learn_amax_method = previous


def _learned(method, amax, x):
    """A learned range at +-amax (PACT's or LSQ's gradient): output, input gradient,
    the clipped input and the gradients of the two learned bounds."""
    with _learn_amax_method(method):
        q = TensorQuantizer(QuantDescriptor(num_bits=8, learn_amax=True, amax=1.0))
        q.enable_clip()
        with torch.no_grad():
            q.clip.clip_value_min.fill_(-amax)
            q.clip.clip_value_max.fill_(amax)
        finite = torch.where(x.isfinite(), x, torch.zeros_like(x))  # (LSQ's gradient needs finite inputs)
        xl = finite.clone().requires_grad_()
        y = q(xl)
        y.backward(_grad_out(x.numel()))
        with torch.no_grad():
            clipped = q.clip(finite)
    return y.detach(), xl.grad, clipped, (q.clip.clip_value_min.grad, q.clip.clip_value_max.grad)


@pytest.mark.parametrize("amax", AMAXES)
def test_a_learned_amax_follows_the_rule_with_pact_and_with_lsq(amax):
    x = _inputs(amax)
    pact = _learned("pact", amax, x)
    lsq = _learned("lsq", amax, x)
    # The value is the amax operator's on the clipped input, for both methods.
    expected = ops.fake_quantize_amax(pact[2], torch.tensor(amax), 8, False, True)
    assert bits_equal(pact[0], expected)
    assert bits_equal(lsq[0], expected)
    # The input's gradient: the clip stage's, then the operator's mask, the same for both.
    assert bits_equal(lsq[1], pact[1])
    for g in pact[3] + lsq[3]:
        assert g is not None and bool(g.isfinite().all())
    if amax <= EPS:
        # No gradient from the scale: the learned bounds get the clip stage's gradient only.
        assert bits_equal(lsq[3][0], pact[3][0]) and bits_equal(lsq[3][1], pact[3][1])
    else:
        assert not bits_equal(lsq[3][1], pact[3][1])  # LSQ's scale gradient is in the path


@pytest.mark.parametrize("amax", DEGENERATE)
@pytest.mark.parametrize("per_channel", [False, True], ids=["per_tensor", "per_channel"])
def test_torch_native_fake_quantization_follows_the_rule(amax, per_channel):
    x = _inputs(amax)
    x = torch.where(x.isfinite(), x, torch.zeros_like(x)).reshape(6, 16)  # torch's kernels: finite inputs
    values = torch.tensor([amax, 1.0, amax, 0.5, 2.0, amax]).reshape(6, 1) if per_channel else torch.tensor(amax)
    q = TensorQuantizer(QuantDescriptor(num_bits=8, axis=0 if per_channel else None, amax=values))
    native = TensorQuantizer.use_fb_fake_quant
    TensorQuantizer.use_fb_fake_quant = True
    try:
        xn = x.clone().requires_grad_()
        y = q(xn)
        y.backward(_grad_out(x.numel()).reshape(x.shape))
    finally:
        TensorQuantizer.use_fb_fake_quant = native
    degenerate = (values <= EPS).expand(x.shape)
    assert bits_equal(y[degenerate], torch.zeros_like(x)[degenerate])
    xo = x.clone().requires_grad_()
    ops.fake_quantize_amax(xo, values, 8, False, True).backward(_grad_out(x.numel()).reshape(x.shape))
    assert bits_equal(xn.grad[degenerate], xo.grad[degenerate])


@pytest.mark.parametrize("learn_amax", [False, True], ids=["amax", "learned"])
def test_the_onnx_lowering_follows_the_rule(tmp_path, learn_amax):
    pytest.importorskip("onnxruntime")
    values = torch.tensor([2.0**-30, 0.0, EPS, ABOVE, 1.0, 0.25]).reshape(6, 1)
    if learn_amax:  # one learned range per tensor: one model per amax
        cases = [(a, QuantDescriptor(num_bits=8, learn_amax=True, amax=1.0)) for a in AMAXES]
    else:
        cases = [(values, QuantDescriptor(num_bits=8, axis=0, amax=values))]
    for amax, desc in cases:
        x = _inputs(float(values.min()) if learn_amax else EPS)
        x = torch.where(x.isfinite(), x, torch.zeros_like(x)).reshape(6, 16) * torch.tensor(
            [1.0, 1.0, 1.0, 1.0, 1e7, 1e7]).reshape(6, 1)
        q = TensorQuantizer(desc).eval()
        if learn_amax:
            q.enable_clip()
            with torch.no_grad():
                q.clip.clip_value_min.fill_(-amax)
                q.clip.clip_value_max.fill_(amax)
        with torch.no_grad():
            expected = q(x)
        path = tmp_path / "q.onnx"
        fakequant.onnx.export(q, (x,), str(path))
        session = ort_session(path, "default")  # (one quantizer: nothing for the int8 kernels)
        (got,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
        assert bits_equal(torch.from_numpy(got), expected), amax
        if not learn_amax:
            assert bits_equal(expected[:3], torch.zeros(3, 16))
