"""Learned step size quantization (LSQ, LSQ+): fake_quantize_lsq and its backward.

The forward must be fake_quantize_affine's output bit for bit; the backward's input
gradient is exactly grad where inside the range; the scale and zero-point gradients
are checked against autograd of the float64 plain-PyTorch reference
(reference.fake_quantize_lsq), against hand-computed sums, and by gradcheck where the
LSQ gradient is the true derivative."""
import math

import pytest
import torch

import fakequant
import reference as ref
from conftest import DEVICES, DTYPES, assert_same, bits_equal
from fakequant.ops import fake_quantize_lsq

ops = torch.ops.fakequant


def random_input(shape, dtype, device, spread=3.0):
    return (torch.randn(shape, dtype=torch.float64) * spread).to(device, dtype)


def _param_shape(x, axis):
    shape = [1] * x.dim()
    if axis is not None:
        shape[axis] = -1
    return shape


def inside_of(x, scale, zero_point, axis, qmin, qmax):
    """The forward's mask as a bool tensor shaped like x (from the affine reference)."""
    return ref.fake_quantize_affine(x, scale, zero_point, axis, qmin, qmax)[1]


def reference_grads(x, scale, zero_point, axis, qmin, qmax, grad_factor, grad):
    """Autograd of the float64 reference: (d scale, d zero_point) as float64."""
    s = scale.detach().double().requires_grad_()
    z = zero_point.detach().double().requires_grad_()
    y = ref.fake_quantize_lsq(x.detach().double(), s, z, axis, qmin, qmax, grad_factor)
    gs, gz = torch.autograd.grad(y, (s, z), grad.double())
    return gs, gz


def sum_tolerance(x, scale, axis, grad, dtype):
    """How far float32 arithmetic (x / s in the compute type) may put each channel's sum
    from the float64 one: half an ulp of |x / s| per element, times |grad|."""
    if dtype == torch.float64:
        return 0.0
    v = (x.double() / scale.double().view(_param_shape(x, axis))).abs()
    dims = [d for d in range(x.dim()) if axis is None or d != axis % x.dim()]
    return float(((v + 1) * grad.double().abs()).sum(dims).max()) * 2.0**-23


RANGES = [(-128, 127, 0), (0, 255, 128), (-127, 127, 0), (-8, 7, 3), (0, 15, 0)]


def _cases(device, dtype):
    """(name, x, axis): per-tensor, per-channel along several axes, and layouts."""
    base = random_input((4, 6, 5, 7), dtype, device)
    yield "per-tensor", base, None
    for axis in (0, 1, -1):
        yield f"axis {axis}", base, axis
    cl = base.to(memory_format=torch.channels_last)
    yield "channels_last axis 1", cl, 1
    yield "channels_last per-tensor", cl, None
    yield "transposed axis 3", base.transpose(1, 3), 3
    yield "sliced axis 1", base[:, ::2, 1:, ::3], 1
    yield "offset axis 2", random_input((4 * 6 * 5 * 7 + 1,), dtype, device)[1:].view(4, 6, 5, 7), 2


# --- forward -----------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("qmin,qmax,zp", RANGES)
def test_forward_is_affine(device, dtype, qmin, qmax, zp):
    for name, x, axis in _cases(device, dtype):
        x = x.clone() if x.is_contiguous() else x
        if name == "per-tensor":
            x[0, 0, 0, :3] = torch.tensor([float("nan"), float("inf"), -float("inf")], dtype=dtype)
        c = 1 if axis is None else x.size(axis)
        scale = torch.rand(c, device=device) * 0.05 + 0.01
        z = torch.full((c,), zp, dtype=torch.int32, device=device)
        y = ops.fake_quantize_lsq(x, scale, z, axis, qmin, qmax, 0.5)
        ey = ops.fake_quantize_affine(x, scale, z, axis, qmin, qmax)[0]
        assert_same(y, ey)
        assert y.stride() == ey.stride(), name
        if not x.isinf().any():  # the reference's straight-through x / s is NaN at +-inf
            assert_same(y, ref.fake_quantize_lsq(x, scale, z, axis, qmin, qmax, 0.5))
        # the public function, with a float (learned) zero point
        zf = z.float().requires_grad_()
        assert_same(fake_quantize_lsq(x, scale, zf, axis, qmin, qmax), ey)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("axis", [None, 1])
def test_forward_is_one_pass_without_a_mask(device, axis):
    """The forward quantizes in one pass and writes no mask: no inner call of
    fake_quantize_affine (the forward once re-entered the dispatcher for it and
    dropped its packed mask) and no allocation but the output's."""
    x = torch.randn(64, 1000, device=device)
    c = 1 if axis is None else x.size(axis)
    scale = torch.full((c,), 0.02, device=device)
    z = torch.zeros(c, dtype=torch.int32, device=device)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        y = ops.fake_quantize_lsq(x, scale, z, axis, -128, 127, 1.0)
    names = [e.name for e in prof.events()]
    assert "fakequant::fake_quantize_lsq" in names
    assert not [n for n in names if n.startswith("fakequant::") and n != "fakequant::fake_quantize_lsq"], names
    mask_bytes = (y.numel() + 7) // 8
    sizes = [e.concrete_inputs[0] for e in prof.events()
             if e.name in ("aten::empty", "aten::empty_strided") and e.concrete_inputs]
    assert [mask_bytes] not in sizes and [y.numel()] not in sizes, sizes  # no packed or bool mask
    assert_same(y, ops.fake_quantize_affine(x, scale, z, axis, -128, 127)[0])


# --- backward: input gradient exact, parameter gradients against the reference ------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("qmin,qmax,zp", RANGES[::2] + [RANGES[3]])
def test_backward_against_reference(device, dtype, qmin, qmax, zp):
    for name, x, axis in _cases(device, dtype):
        c = 1 if axis is None else x.size(axis)
        # Power-of-two scales: x / s is exact in every compute type, so the op's
        # float32 terms are the float64 reference's and only the summation differs.
        scale = 2.0 ** -torch.randint(3, 7, (c,), device=device).float()
        z = torch.randint(qmin, qmax + 1, (c,), dtype=torch.int32, device=device) if zp else torch.zeros(c, dtype=torch.int32, device=device)
        grad = random_input(x.shape, dtype, device, 1.0)
        gi, gs, gz = ops.fake_quantize_lsq_backward(grad, x, scale, z, axis, qmin, qmax, 0.75)
        inside = inside_of(x, scale, z, axis, qmin, qmax)
        assert_same(gi, torch.where(inside, grad, torch.zeros_like(grad)))
        assert gs.dtype == gz.dtype == torch.float32 and gs.shape == scale.shape and gz.shape == z.shape
        es, ez = reference_grads(x, scale, z, axis, qmin, qmax, 0.75, grad)
        assert torch.allclose(gs.double(), es, rtol=1e-6, atol=1e-9), (name, gs, es)
        assert torch.allclose(gz.double(), ez, rtol=1e-6, atol=1e-9), (name, gz, ez)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("axis", [None, 0, 1, 2])
def test_backward_any_scale(device, dtype, axis):
    """Arbitrary scales and a float zero point (LSQ+), through autograd of the public
    function: within the float32 rounding of x / s for float32 inputs, 1e-6 for float64."""
    x = random_input((16, 24, 40), dtype, device).requires_grad_()
    c = 1 if axis is None else x.size(axis)
    scale = (torch.rand(c, device=device) * 0.02 + 0.01).requires_grad_()
    zp = torch.randint(-20, 20, (c,), device=device).float().requires_grad_()
    grad = random_input(x.shape, dtype, device, 1.0)
    y = fake_quantize_lsq(x, scale, zp, axis, -64, 63, grad_factor=0.5)
    gx, gs, gz = torch.autograd.grad(y, (x, scale, zp), grad)
    assert gs.dtype == scale.dtype and gz.dtype == zp.dtype
    inside = inside_of(x.detach(), scale.detach(), zp.detach(), axis, -64, 63)
    assert_same(gx, torch.where(inside, grad, torch.zeros_like(grad)))
    es, ez = reference_grads(x, scale, zp, axis, -64, 63, 0.5, grad)
    tol = sum_tolerance(x.detach(), scale.detach(), axis, grad, dtype) * 0.5
    assert torch.allclose(gs.double(), es, rtol=1e-6, atol=tol + 1e-9), (gs, es, tol)
    assert torch.allclose(gz.double(), ez, rtol=1e-6, atol=1e-9), (gz, ez)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_backward_exact_per_element(device, dtype):
    """Hand-computed sums: scale 0.5, zero point 1, range [-4, 3], so r must lie in
    [-5, 2]. Every value is exact in every dtype, so the sums are exact."""
    xs = [0.1875, -2.625, 1.0, 10.0, -10.0, 1.25, 0.75, -2.25, -2.75]
    gs = [1.0, 2.0, -1.0, 0.5, 3.0, 4.0, -2.0, 1.5, 0.25]
    # v = x / 0.5:  0.375 -> r 0, -5.25 -> -5, 2 -> 2, 20 -> above, -20 -> below,
    #               2.5 -> 2 (tie to even), 1.5 -> 2, -4.5 -> -4, -5.5 -> -6 (below)
    terms = [-0.375, 0.25, 0.0, None, None, -0.5, 0.5, 0.5, None]  # r - v inside
    bounds = {3: 2.0, 4: -5.0, 8: -5.0}  # quant_max - zp above, quant_min - zp below
    inside = [t is not None for t in terms]
    expected_s = sum(g * (t if t is not None else bounds[i]) for i, (g, t) in enumerate(zip(gs, terms)))
    expected_z = sum(g * -0.5 for g, inn in zip(gs, inside) if not inn)
    x = torch.tensor(xs, dtype=dtype, device=device)
    grad = torch.tensor(gs, dtype=dtype, device=device)
    scale = torch.tensor([0.5], device=device)
    zp = torch.tensor([1], dtype=torch.int32, device=device)
    gi, g_s, g_z = ops.fake_quantize_lsq_backward(grad, x, scale, zp, None, -4, 3, 2.0)
    assert gi.tolist() == [g if inn else 0.0 for g, inn in zip(gs, inside)]
    assert g_s.item() == 2.0 * expected_s and g_z.item() == 2.0 * expected_z
    assert g_s.shape == (1,) and g_z.shape == (1,)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_backward_nan_and_inf(device, dtype):
    """+-inf count as clamped (bound and -s); a NaN input makes its channel's scale and
    zero-point gradients NaN and gets no input gradient; other channels are unaffected."""
    x = torch.tensor([[0.3, float("inf"), -float("inf"), 0.1], [0.3, float("nan"), 0.0, 1.0]], dtype=dtype, device=device)
    grad = torch.ones_like(x)
    scale = torch.tensor([0.25, 0.25], device=device)
    zp = torch.tensor([0, 0], dtype=torch.int32, device=device)
    gi, gs, gz = ops.fake_quantize_lsq_backward(grad, x, scale, zp, 0, -8, 7, 1.0)
    assert gi.tolist()[0] == [1.0, 0.0, 0.0, 1.0] and gi[1, 1].item() == 0.0
    x0 = x[0].double()
    expected_s0 = (torch.round(x0[0] / 0.25) - x0[0] / 0.25) + 7 + (-8) + (torch.round(x0[3] / 0.25) - x0[3] / 0.25)
    assert abs(gs[0].item() - expected_s0.item()) < 1e-6
    assert gz[0].item() == -0.5
    assert gs[1].isnan() and gz[1].isnan()


@pytest.mark.parametrize("device", DEVICES)
def test_grad_layouts_and_empty(device):
    x = random_input((4, 6, 5, 7), torch.float32, device).to(memory_format=torch.channels_last)
    scale = torch.rand(6, device=device) * 0.05 + 0.01
    zp = torch.zeros(6, dtype=torch.int32, device=device)
    expanded = torch.ones((), device=device).expand(x.shape)
    dense = expanded.contiguous()
    a = ops.fake_quantize_lsq_backward(expanded, x, scale, zp, 1, -128, 127, 1.0)
    b = ops.fake_quantize_lsq_backward(dense, x, scale, zp, 1, -128, 127, 1.0)
    for u, v in zip(a, b):
        assert bits_equal(u, v)
    assert a[0].is_contiguous(memory_format=torch.channels_last), "grad_input is laid out like input"
    for shape, axis in (((0, 3), 1), ((0,), None), ((3, 0), 0)):
        e = torch.empty(shape, device=device)
        c = 1 if axis is None else e.size(axis)
        gi, gs, gz = ops.fake_quantize_lsq_backward(e, e, torch.ones(c, device=device), torch.zeros(c, device=device), axis, -8, 7, 1.0)
        assert gi.shape == shape and bits_equal(gs, torch.zeros(c, device=device)) and bits_equal(gz, gs)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("axis", [None, 0, 1])
def test_large_tensor_blocks_and_determinism(device, axis):
    """Many blocks of partial sums (per-tensor and per-channel, channels outermost and
    innermost); the same bits every call and with any number of threads."""
    x = random_input((96, 4099), torch.float32, device)
    c = 1 if axis is None else x.size(axis)
    scale = 2.0 ** -torch.randint(3, 7, (c,), device=device).float()
    zp = torch.randint(-3, 3, (c,), dtype=torch.int32, device=device)
    grad = random_input(x.shape, torch.float32, device, 1.0)
    out = ops.fake_quantize_lsq_backward(grad, x, scale, zp, axis, -100, 100, 1.0)
    es, ez = reference_grads(x, scale, zp, axis, -100, 100, 1.0, grad)
    assert torch.allclose(out[1].double(), es, rtol=1e-6, atol=1e-9)
    assert torch.allclose(out[2].double(), ez, rtol=1e-6, atol=1e-9)
    threads = torch.get_num_threads()
    try:
        for n in (1, threads, 3):
            torch.set_num_threads(n)
            again = ops.fake_quantize_lsq_backward(grad, x, scale, zp, axis, -100, 100, 1.0)
            for u, v in zip(out, again):
                assert bits_equal(u, v)
    finally:
        torch.set_num_threads(threads)


# --- the public function: grad_factor, LSQ+ zero point, learning --------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("axis", [None, 1])
def test_default_grad_factor(device, axis):
    x = random_input((8, 12, 10), torch.float32, device).requires_grad_()
    c = 1 if axis is None else x.size(axis)
    n = x.numel() // c
    scale = (torch.rand(c, device=device) * 0.05 + 0.01).requires_grad_()
    grads = {}
    for gf in (None, 1.0 / math.sqrt(n * 127), 1.0):
        y = fake_quantize_lsq(x, scale, 0, axis, -128, 127, grad_factor=gf)
        grads[gf] = torch.autograd.grad(y.sum(), scale)[0]
    expected = 1.0 / math.sqrt(n * 127)
    assert bits_equal(grads[None], grads[expected])
    assert torch.allclose(grads[None], grads[1.0] * expected, rtol=1e-6)
    # unsigned range with quant_max 0 would divide by 0: taken as 1
    y = fake_quantize_lsq(x, scale, 0, axis, 0, 0)
    assert torch.isfinite(torch.autograd.grad(y.sum(), scale)[0]).all()


@pytest.mark.parametrize("device", DEVICES)
def test_float_zero_point_is_rounded_and_clamped(device):
    x = random_input((50,), torch.float32, device)
    scale = torch.tensor(0.1, device=device)
    for zp, used in ((3.6, 4), (2.5, 2), (300.0, 255), (-7.0, 0)):
        z = torch.tensor(zp, device=device, requires_grad=True)
        y = fake_quantize_lsq(x, scale, z, None, 0, 255, grad_factor=1.0)
        assert_same(y, fakequant.fake_quantize_affine(x, scale, used, None, 0, 255))
        (gz,) = torch.autograd.grad(y.sum(), z)
        _, _, ez = ops.fake_quantize_lsq_backward(torch.ones_like(x), x, scale.view(1), torch.tensor([used], device=device), None, 0, 255, 1.0)
        assert gz.item() == ez.item()  # the straight-through estimator passes it on


@pytest.mark.parametrize("device", DEVICES)
def test_lsq_plus_learns_scale_and_zero_point(device):
    """SGD on data in [-2, 1] with a 4-bit unsigned range, from scale 0.1 and zero point 0
    (which represent [0, 1.5] only): the scale grows and the zero point moves up, and the
    error falls far below what any scale reaches with the zero point fixed at 0 (all
    negative values quantize to 0: a mean squared error of 8/9)."""
    g = torch.Generator().manual_seed(1)
    x = (torch.rand(4096, generator=g) * 3 - 2).to(device)
    scale = torch.tensor(0.1, device=device, requires_grad=True)
    zp = torch.tensor(0.0, device=device, requires_grad=True)
    opt = torch.optim.SGD([scale, zp], lr=1.0)

    def loss():
        return (fake_quantize_lsq(x, scale, zp, None, 0, 15, grad_factor=1.0) - x).pow(2).mean()

    start = loss().item()
    for _ in range(30):
        opt.zero_grad()
        loss().backward()
        opt.step()
    assert loss().item() < 0.1 * start and loss().item() < 0.1
    assert scale.item() > 0.3 and zp.item() > 1.0


# --- gradcheck ------------------------------------------------------------------------


def _away_from(x, edges, margin):
    for e in edges:
        x = torch.where((x - e).abs() < margin, x + 3 * margin, x)
    return x


@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck_input(device):
    # Steps of 1e-12, far below gradcheck's eps: the numerical Jacobian is the STE's.
    s = 2.0**-40
    x = (torch.rand(40, dtype=torch.float64, device=device) - 0.5) * 2**-7
    x = _away_from(x, [-(2**31) * s, (2**31 - 1) * s], 1e-4).requires_grad_()
    scale = torch.tensor([s], device=device)
    fn = lambda t: fake_quantize_lsq(t, scale, 0, None, -(2**31) + 1, 2**31 - 1)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x,), eps=1e-6, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("axis", [None, 1])
def test_gradcheck_scale(device, axis):
    """Where every element is 0 or clamped, y = clamp(...) * s is linear in s and the
    LSQ gradient (0 for x = 0, the range bound when clamped) is the true derivative."""
    x = torch.randint(-1, 2, (6, 3, 5), device=device).double() * 1000.0  # 0 or far outside
    c = 1 if axis is None else 3
    scale = (torch.rand(c, dtype=torch.float64, device=device) + 0.5).requires_grad_()
    zp = torch.randint(-3, 4, (c,), dtype=torch.int32, device=device)
    fn = lambda s: fake_quantize_lsq(x, s, zp, axis, -8, 7, grad_factor=1.0)  # noqa: E731
    # float32 scale inside: eps large enough that its rounding is negligible.
    assert torch.autograd.gradcheck(fn, (scale,), eps=1e-2, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("axis", [None, 0, 2])
def test_op_backward_equals_reference_autograd(device, axis):
    """The op's backward against torch.autograd.grad of the float64 reference, for the
    input, the scale and a float zero point, with a vector-Jacobian product."""
    x = random_input((5, 4, 9), torch.float64, device).requires_grad_()
    c = 1 if axis is None else x.size(axis)
    scale = (torch.rand(c, dtype=torch.float64, device=device) * 0.05 + 0.02).requires_grad_()
    zp = torch.randint(-10, 10, (c,), device=device).double().requires_grad_()
    grad = random_input(x.shape, torch.float64, device, 1.0)
    y = fake_quantize_lsq(x, scale, zp, axis, -32, 31, grad_factor=0.3)
    got = torch.autograd.grad(y, (x, scale, zp), grad)
    y_ref = ref.fake_quantize_lsq(x, scale, zp, axis, -32, 31, 0.3)
    assert_same(y, y_ref)
    expected = torch.autograd.grad(y_ref, (x, scale, zp), grad)
    for a, b in zip(got, expected):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-12)


# --- errors -----------------------------------------------------------------------------

x_err = torch.randn(4, 3, 5)
s1, z1 = torch.tensor([0.1]), torch.tensor([0], dtype=torch.int32)


def _lsq(**kw):
    args = dict(input=x_err, scale=s1, zero_point=z1, axis=None, quant_min=-128, quant_max=127, grad_factor=1.0)
    args.update(kw)
    return ops.fake_quantize_lsq(*args.values())


def _lsq_backward(**kw):
    args = dict(grad=torch.ones_like(x_err), input=x_err, scale=s1, zero_point=z1, axis=None,
                quant_min=-128, quant_max=127, grad_factor=1.0)
    args.update(kw)
    return ops.fake_quantize_lsq_backward(*args.values())


BAD = [
    (dict(scale=torch.tensor([0.0])), ValueError, "scale"),
    (dict(scale=torch.tensor([-0.5])), ValueError, "scale"),
    (dict(scale=torch.ones(2), zero_point=torch.zeros(2)), ValueError, "scale"),
    (dict(axis=1, scale=torch.ones(3), zero_point=torch.zeros(2)), ValueError, "zero_point"),
    (dict(axis=3, scale=torch.ones(3), zero_point=torch.zeros(3)), IndexError, "axis"),
    (dict(zero_point=torch.tensor([0.5])), ValueError, "zero_point"),
    (dict(input=torch.ones(3, dtype=torch.int32)), TypeError, "input"),
    (dict(quant_min=10, quant_max=5), ValueError, "quant_min"),
    (dict(grad_factor=float("nan")), ValueError, "grad_factor"),
]
BAD_BACKWARD = [
    (dict(grad=torch.ones(4, 3)), ValueError, "grad"),
    (dict(grad=torch.ones(4, 3, 5, dtype=torch.float64)), TypeError, "grad"),
    (dict(grad=torch.ones(4, 3, 5, dtype=torch.int64)), TypeError, "grad"),
    (dict(grad=torch.ones(4, 3, 5, device="meta")), ValueError, "grad"),
]


@pytest.mark.parametrize("kwargs,exc,name", BAD)
def test_bad_arguments(kwargs, exc, name):
    with pytest.raises(exc, match=name):
        _lsq(**kwargs)
    with pytest.raises(exc, match=name):
        _lsq_backward(**kwargs)


@pytest.mark.parametrize("kwargs,exc,name", BAD_BACKWARD)
def test_bad_backward_arguments(kwargs, exc, name):
    with pytest.raises(exc, match=name):
        _lsq_backward(**kwargs)


@pytest.mark.parametrize("call,exc,name", [
    (lambda: fake_quantize_lsq(x_err, 0.1, grad_factor=True), TypeError, "grad_factor"),
    (lambda: fake_quantize_lsq(x_err, 0.1, grad_factor=float("inf")), ValueError, "grad_factor"),
    (lambda: fake_quantize_lsq(x_err, -0.1), ValueError, "scale"),
    (lambda: fake_quantize_lsq(x_err, 0.1, 0.5), ValueError, "zero_point"),
    (lambda: fake_quantize_lsq(x_err, 0.1, quant_max="7"), TypeError, "quant_max"),
    (lambda: fake_quantize_lsq([1.0], 0.1), TypeError, "input"),
    (lambda: fake_quantize_lsq(x_err, 0.1, torch.tensor(float("nan"))), ValueError, "zero_point"),
])
def test_bad_public_arguments(call, exc, name):
    with pytest.raises(exc, match=name):
        call()


def test_fake_kernels_check_like_the_real_ones():
    x = torch.randn(4, 3, 5, device="meta")
    s, z = torch.ones(1, device="meta"), torch.zeros(1, dtype=torch.int32, device="meta")
    y = ops.fake_quantize_lsq(x, s, z, None, -8, 7, 1.0)
    assert y.shape == x.shape and y.device.type == "meta"
    gi, gs, gz = ops.fake_quantize_lsq_backward(x, x, s, z, None, -8, 7, 1.0)
    assert gi.shape == x.shape and gs.dtype == gz.dtype == torch.float32 and gs.shape == (1,)
    with pytest.raises(ValueError, match="grad"):
        ops.fake_quantize_lsq_backward(torch.ones(4, 3, device="meta"), x, s, z, None, -8, 7, 1.0)
    with pytest.raises(TypeError, match="input"):
        ops.fake_quantize_lsq(x.int(), s, z, None, -8, 7, 1.0)


# --- torch.compile --------------------------------------------------------------------


class _LearnedQuant(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(6, 8))
        self.scale = torch.nn.Parameter(torch.full((6,), 0.05))
        self.act_scale = torch.nn.Parameter(torch.tensor(0.1))
        self.act_zero_point = torch.nn.Parameter(torch.tensor(3.0))

    def forward(self, x):
        w = fake_quantize_lsq(self.weight, self.scale, 0, 0, -8, 7)
        x = fake_quantize_lsq(x, self.act_scale, self.act_zero_point, None, 0, 255)
        return (x @ w.t()).relu().sum()


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph(device):
    torch._dynamo.reset()
    eager = _LearnedQuant().to(device)
    compiled_model = _LearnedQuant().to(device)
    compiled_model.load_state_dict(eager.state_dict())
    compiled = torch.compile(compiled_model, fullgraph=True, backend="aot_eager", dynamic=False)
    x = random_input((5, 8), torch.float32, device, 1.0)
    out_e, out_c = eager(x), compiled(x)
    out_e.backward()
    out_c.backward()
    assert bits_equal(out_e, out_c)
    for (name, p), q in zip(eager.named_parameters(), compiled_model.parameters()):
        assert p.grad is not None and bits_equal(p.grad, q.grad), name
    assert eager.act_zero_point.grad.abs().sum() > 0 or eager.scale.grad.abs().sum() > 0
    torch._dynamo.reset()


def test_torch_compile_dynamic_shapes():
    torch._dynamo.reset()
    scale = torch.nn.Parameter(torch.tensor(0.1))

    def step(x):
        return fake_quantize_lsq(x, scale, 0, None, -8, 7).sum()

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager", dynamic=True)
    for n in (5, 9):
        x = torch.randn(n, 4)
        grads = []
        for fn in (compiled, step):
            out = fn(x)
            grads.append((out, torch.autograd.grad(out, scale)[0]))
        assert bits_equal(grads[0][0], grads[1][0]) and bits_equal(grads[0][1], grads[1][1])
    torch._dynamo.reset()
