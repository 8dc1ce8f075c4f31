"""Every operator against the plain-PyTorch reference of the contract (reference.py),
on each device and dtype: random data, exact ties, NaN/inf, layouts, empty tensors."""
import math

import pytest
import torch

import fakequant
import reference as ref
from conftest import DEVICES, DTYPES, assert_same, bits_equal

ops = torch.ops.fakequant


def random_input(shape, dtype, device, spread=3.0):
    return (torch.randn(shape, dtype=torch.float64) * spread).to(device, dtype)


def mask_of(packed, y):
    return fakequant.unpack_mask(packed, y)


# --- affine ------------------------------------------------------------------------


AFFINE_RANGES = [(-128, 127, 0), (0, 255, 128), (-127, 127, 0), (-8, 7, 3), (0, 15, 0)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("qmin,qmax,zp", AFFINE_RANGES)
def test_affine_per_tensor(device, dtype, qmin, qmax, zp):
    x = random_input((7, 33, 5), dtype, device)
    scale = torch.tensor([0.0173], device=device)
    zero_point = torch.tensor([zp], dtype=torch.int32, device=device)
    y, mask = ops.fake_quantize_affine(x, scale, zero_point, None, qmin, qmax)
    ey, emask = ref.fake_quantize_affine(x, scale, zero_point, None, qmin, qmax)
    assert_same(y, ey)
    assert mask.dtype == torch.uint8 and mask.shape == ((x.numel() + 7) // 8,)
    assert bits_equal(mask_of(mask, y), emask)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("axis", [0, 1, 2, -1, -3])
def test_affine_per_channel(device, dtype, axis):
    x = random_input((6, 10, 9), dtype, device)
    c = x.size(axis)
    scale = torch.rand(c, device=device) * 0.05 + 0.001
    zero_point = torch.randint(-20, 20, (c,), dtype=torch.int32, device=device)
    y, mask = ops.fake_quantize_affine(x, scale, zero_point, axis, -128, 127)
    ey, emask = ref.fake_quantize_affine(x, scale, zero_point, axis % x.dim(), -128, 127)
    assert_same(y, ey)
    assert bits_equal(mask_of(mask, y), emask)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_affine_float_zero_point_and_double_scale(device, dtype):
    x = random_input((4, 50), dtype, device)
    scale = torch.tensor([0.01, 0.02, 0.03, 0.04], dtype=torch.float64, device=device)
    zero_point = torch.tensor([0.0, 3.0, -5.0, 10.0], device=device)
    y, _ = ops.fake_quantize_affine(x, scale, zero_point, 0, -128, 127)
    ey, _ = ref.fake_quantize_affine(x, scale.float(), zero_point, 0, -128, 127)
    assert_same(y, ey)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_affine_exact_ties_round_half_to_even(device, dtype):
    # With a power-of-two scale, x = (k + 0.5) * s is exact and x / s is a tie.
    s = 2.0**-3
    k = torch.arange(-140, 140, dtype=torch.float64)
    x = ((k + 0.5) * s).to(device, dtype)
    y, mask = ops.fake_quantize_affine(
        x, torch.tensor([s], device=device), torch.tensor([0], device=device), None, -128, 127
    )
    expected_q = torch.clamp(torch.round(k + 0.5), -128, 127)  # half to even
    assert bits_equal(y.double().cpu(), (expected_q + 0.0) * s)  # +0.0 where q is -0.0
    assert_same(y, ref.fake_quantize_affine(x, s, 0, None, -128, 127)[0])
    assert bits_equal(mask_of(mask, y).cpu(), (torch.round(k + 0.5) >= -128) & (torch.round(k + 0.5) <= 127))
    # 2.5 -> 2, 3.5 -> 4, -2.5 -> -2
    assert bits_equal(torch.round(torch.tensor([2.5, 3.5, -2.5])), torch.tensor([2.0, 4.0, -2.0]))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_affine_ties_any_scale(device, dtype):
    # Near-ties for a scale that is not a power of two follow the reference too.
    s = 0.0371
    k = torch.arange(-130, 130, dtype=torch.float32)
    x = ((k + 0.5) * s).to(device, dtype)
    y, mask = ops.fake_quantize_affine(x, torch.tensor([s], device=device), torch.tensor([0], device=device), None, -128, 127)
    ey, emask = ref.fake_quantize_affine(x, s, 0, None, -128, 127)
    assert_same(y, ey)
    assert bits_equal(mask_of(mask, y), emask)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_affine_nan_and_inf(device, dtype):
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, 1.0, -1.0], dtype=dtype, device=device)
    s = 0.5
    y, mask = ops.fake_quantize_affine(x, torch.tensor([s], device=device), torch.tensor([0], device=device), None, -128, 127)
    assert math.isnan(float(y[0]))
    assert float(y[1]) == 127 * s and float(y[2]) == -128 * s
    assert mask_of(mask, y).tolist() == [False, False, False, True, True, True]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("zp", [2, -5, 2**24 + 1])
def test_affine_range_wider_than_float32(device, zp):
    """int32 ranges: (q - zp) is exact integer arithmetic, never rounded through q (a
    fuzz find: 62131734 + 2 - 2 is 62131736 in float32), and bounds that float32 cannot
    hold round inward so the mask stays exact."""
    s = torch.tensor([1e-3], device=device)
    z = torch.tensor([zp], dtype=torch.int32, device=device)
    x = torch.tensor([62131.7344, 66135.2188], device=device)
    y, _ = ops.fake_quantize_affine(x, s, z, None, -(2**31), 2**31 - 1, False)
    r = torch.round(x / s)
    assert bits_equal(y, r * s)
    # quant_min - zp = -2^26 - 3 - zp is not a float32 value: x on either side of it.
    qmin, qmax = -(2**26) - 3, 2**26 + 3
    lo, hi = qmin - zp, qmax - zp
    edges = torch.tensor([lo - 8, lo - 4, lo, lo + 4, lo + 8, hi - 8, hi, hi + 8], dtype=torch.float64)
    x = (edges * 1e-3).to(torch.float32).to(device)
    y, mask = ops.fake_quantize_affine(x, s, z, None, qmin, qmax, False)
    r = torch.round(x / s).double()
    assert bits_equal(mask, (r >= lo) & (r <= hi))
    q = (y / s).double()
    assert bool(((q >= lo) & (q <= hi)).all())  # clamped values stay inside the range
    ey, emask = ref.fake_quantize_affine(x, s, z, None, qmin, qmax)
    assert_same(y, ey)
    assert bits_equal(mask, emask)


def _layouts(device, dtype):
    base = random_input((4, 6, 5, 7), dtype, device)
    yield "channels_last", base.to(memory_format=torch.channels_last)
    yield "transposed", base.transpose(1, 3)
    yield "sliced", base[:, ::2, 1:, ::3]
    yield "expanded", random_input((1, 6, 1, 7), dtype, device).expand(4, 6, 5, 7)
    yield "offset", random_input((4 * 6 * 5 * 7 + 1,), dtype, device)[1:].view(4, 6, 5, 7)  # not 16-byte aligned


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("axis", [None, 1, 3])
def test_affine_layouts(device, dtype, axis):
    for name, x in _layouts(device, dtype):
        c = 1 if axis is None else x.size(axis)
        scale = torch.rand(c, device=device) * 0.05 + 0.01
        zp = torch.randint(-5, 5, (c,), device=device)
        y, mask = ops.fake_quantize_affine(x, scale, zp, axis, -128, 127)
        ey, emask = ref.fake_quantize_affine(x, scale, zp, axis, -128, 127)
        assert_same(y, ey)
        assert bits_equal(mask_of(mask, y), emask), name
        if x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous():
            assert y.is_contiguous(memory_format=torch.channels_last), "output keeps channels_last"
        if name == "transposed":
            assert y.stride() == x.stride(), "dense inputs keep their strides"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_empty_tensors(device, dtype):
    for shape, axis in [((0,), None), ((3, 0, 2), 0), ((3, 0, 2), 1)]:
        x = torch.empty(shape, dtype=dtype, device=device)
        c = 1 if axis is None else shape[axis]
        y, mask = ops.fake_quantize_affine(x, torch.ones(c, device=device), torch.zeros(c, device=device), axis, -128, 127)
        assert y.shape == x.shape and mask.numel() == 0
        y, mask = ops.fake_quantize_amax(x, torch.tensor(1.0, device=device), 8, False, True)
        assert y.shape == x.shape and mask.numel() == 0
        g = ops.mask_backward(torch.empty_like(x), mask)
        assert g.shape == x.shape


@pytest.mark.parametrize("device", DEVICES)
def test_zero_dim_input(device):
    x = torch.tensor(0.37, device=device)
    y, mask = ops.fake_quantize_amax(x, torch.tensor(1.0, device=device), 8, False, True)
    assert y.dim() == 0
    assert_same(y, ref.fake_quantize_amax(x, 1.0)[0])
    assert mask.tolist() == [1]


# --- amax family -------------------------------------------------------------------


AMAX_SETTINGS = [(8, False, True), (8, False, False), (8, True, False), (4, False, True), (2, False, False), (16, True, True)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_bits,unsigned,narrow", AMAX_SETTINGS)
def test_amax_per_tensor(device, dtype, num_bits, unsigned, narrow):
    x = random_input((5, 64), dtype, device)
    if unsigned:
        x = x.abs()
    amax = torch.tensor(2.5, device=device)
    for fn, rfn in ((ops.fake_quantize_amax, ref.fake_quantize_amax), (ops.quantize_amax, ref.quantize_amax)):
        y, mask = fn(x, amax, num_bits, unsigned, narrow)
        ey, emask = rfn(x, amax, num_bits, unsigned, narrow)
        assert_same(y, ey)
        assert bits_equal(mask_of(mask, y), emask)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "amax_shape",
    [(8, 1, 1, 1), (1, 3, 1, 1), (1, 1, 1, 6), (8, 1, 1, 6), (3, 1, 1), (6,), (8, 3, 5, 6), ()],
)
def test_amax_broadcast_shapes(device, dtype, amax_shape):
    x = random_input((8, 3, 5, 6), dtype, device)
    amax = torch.rand(amax_shape, device=device) * 3 + 0.1
    if len(amax_shape) and amax.numel() > 1:
        amax.view(-1)[0] = 0.0  # a channel with amax 0 quantizes to 0
    y, mask = ops.fake_quantize_amax(x, amax, 8, False, True)
    ey, emask = ref.fake_quantize_amax(x, amax, 8, False, True)
    assert_same(y, ey)
    assert bits_equal(mask_of(mask, y), emask)


@pytest.mark.parametrize("device", DEVICES)
def test_amax_elementwise_on_transposed_input(device):
    # Parameters that step by neither 0 nor 1 along the innermost memory dimension.
    x = random_input((7, 9), torch.float32, device).t()
    amax = torch.rand(9, 7, device=device) + 0.5
    y, mask = ops.fake_quantize_amax(x, amax, 8, False, False)
    ey, emask = ref.fake_quantize_amax(x, amax, 8, False, False)
    assert_same(y, ey)
    assert bits_equal(mask_of(mask, y), emask)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_amax_zero_and_tiny(device, dtype):
    x = torch.tensor([0.0, 1e-3, -5.0, float("nan"), float("inf")], dtype=dtype, device=device)
    for amax in (0.0, 2.0**-25, 2.0**-24):
        y, mask = ops.fake_quantize_amax(x, torch.tensor(amax, device=device), 8, False, True)
        assert y[:3].tolist() == [0.0, 0.0, 0.0] and float(y[4]) == 0.0
        assert math.isnan(float(y[3])), "NaN in gives NaN out"
        assert_same(y, ref.fake_quantize_amax(x, amax)[0])
    q, scale = fakequant.quantize_amax(x[:3], 0.0)
    assert float(scale) == 1.0 and q.tolist() == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_amax_nan_inf_and_mask(device, dtype):
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), 1.0, -1.0, 1.5], dtype=dtype, device=device)
    y, mask = ops.fake_quantize_amax(x, torch.tensor(1.0, device=device), 8, False, True)
    assert math.isnan(float(y[0]))
    assert float(y[1]) == float(y[3]) == -float(y[2]) == float(y[5]) > 0.99  # saturate at 127 * s
    assert_same(y, ref.fake_quantize_amax(x, 1.0)[0])
    assert mask_of(mask, y).tolist() == [False, False, False, True, True, False]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_amax_exact_ties(device, dtype):
    # amax = 127 * 2^-4 gives s = 2^-4 exactly: x = (k + 0.5) s are ties.
    s = 2.0**-4
    k = torch.arange(-130, 130, dtype=torch.float64)
    x = ((k + 0.5) * s).to(device, dtype)
    y, _ = ops.fake_quantize_amax(x, torch.tensor(127 * s, device=device), 8, False, False)
    assert bits_equal(y.double().cpu(), (torch.clamp(torch.round(k + 0.5), -128, 127) + 0.0) * s)


# --- min/max --------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_bits", [8, 4])
def test_min_max(device, dtype, num_bits):
    x = random_input((6, 40), dtype, device)
    for lo, hi in [(-2.0, 3.0), (0.5, 4.0), (-6.0, -1.0)]:
        mn, mx = torch.tensor(lo, device=device), torch.tensor(hi, device=device)
        y, mask = ops.fake_quantize_min_max(x, mn, mx, num_bits)
        ey, emask = ref.fake_quantize_min_max(x, mn, mx, num_bits)
        assert_same(y, ey)
        assert bits_equal(mask_of(mask, y), emask)
    # per-row ranges, broadcast
    mn = -torch.rand(6, 1, device=device) - 0.5
    mx = torch.rand(1, 1, device=device) + 0.5
    y, mask = ops.fake_quantize_min_max(x, mn, mx, num_bits)
    ey, emask = ref.fake_quantize_min_max(x, mn, mx, num_bits)
    assert_same(y, ey)
    assert bits_equal(mask_of(mask, y), emask)


# --- backward ---------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_backward_is_grad_times_mask(device, dtype):
    for name, x in _layouts(device, dtype):
        xr = x.detach().requires_grad_()
        y = fakequant.fake_quantize_amax(xr, 2.0)
        grad = random_input(y.shape, dtype, device)
        (gx,) = torch.autograd.grad(y, xr, grad)
        _, emask = ref.fake_quantize_amax(x, 2.0)
        assert_same(gx, torch.where(emask, grad, torch.zeros_like(grad)))


@pytest.mark.parametrize("device", DEVICES)
def test_backward_nan_gradient_is_masked(device):
    x = torch.tensor([0.1, 5.0], device=device, requires_grad=True)
    y = fakequant.fake_quantize_amax(x, 1.0)
    (gx,) = torch.autograd.grad(y, x, torch.tensor([float("nan"), float("nan")], device=device))
    assert math.isnan(float(gx[0])) and float(gx[1]) == 0.0


@pytest.mark.parametrize("device", DEVICES)
def test_backward_expanded_grad(device):
    # y.sum() sends back an expanded (stride 0) gradient; the packed mask still lines up.
    x = random_input((4, 6, 5, 7), torch.float32, device).to(memory_format=torch.channels_last).requires_grad_()
    y = fakequant.fake_quantize_amax(x, 2.0)
    y.sum().backward()
    assert bits_equal(x.grad, ref.fake_quantize_amax(x.detach(), 2.0)[1].float())


@pytest.mark.parametrize("device", DEVICES)
def test_pass_through_backward(device):
    x = torch.tensor([0.5, 3.0, -7.0], device=device, requires_grad=True)
    y = fakequant.fake_quantize_amax(x, 1.0, pass_through=True)
    y.backward(torch.ones_like(y))
    assert x.grad.tolist() == [1.0, 1.0, 1.0]
    assert_same(y.detach(), ref.fake_quantize_amax(x.detach(), 1.0)[0])


@pytest.mark.parametrize("device", DEVICES)
def test_min_max_and_quantize_backward(device):
    x = torch.tensor([-3.0, -1.0, 0.2, 2.0, 4.0], device=device, requires_grad=True)
    y = fakequant.fake_quantize_min_max(x, -2.0, 3.0)
    (g,) = torch.autograd.grad(y.sum(), x)
    assert g.tolist() == [0.0, 1.0, 1.0, 1.0, 0.0]
    q, scale = fakequant.quantize_amax(x, 2.0)
    (g,) = torch.autograd.grad(q.sum(), x)
    assert g.tolist() == [0.0, 1.0, 1.0, 1.0, 0.0]
    assert float(scale) == 127 / 2.0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_mask_backward_bool_and_packed(device, dtype):
    grad = random_input((3, 17), dtype, device)
    mask = torch.rand(3, 17, device=device) > 0.4
    expected = torch.where(mask, grad, torch.zeros_like(grad))
    assert_same(ops.mask_backward(grad, mask), expected)
    assert_same(fakequant.fake_quant_grad(grad, mask.t().contiguous().t()), expected)  # any layout
    bits = (mask.flatten().to(torch.uint8).view(-1).tolist() + [0] * 7)
    packed = torch.tensor(
        [sum(b << j for j, b in enumerate(bits[i : i + 8])) for i in range(0, 3 * 17, 8)],
        dtype=torch.uint8,
        device=device,
    )
    assert_same(ops.mask_backward(grad, packed), expected)


# --- torch-compatible and ONNX Runtime training functions ----------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_drop_in_per_tensor_matches_torch(device, dtype):
    x = random_input((64, 65), dtype, device).requires_grad_()
    scale, zp = 0.0213, 5
    y = fakequant.fake_quantize_per_tensor_affine(x, scale, zp, -128, 127)
    try:
        t = torch.fake_quantize_per_tensor_affine(x, scale, zp, -128, 127)
    except RuntimeError as e:  # torch < 2.5 has no bfloat16 kernel
        pytest.skip(f"torch's own op refuses {dtype}: {e}")
    # torch multiplies by 1/scale: one step apart at near-ties only.
    assert float((y - t).detach().abs().max()) <= scale * 1.001
    assert float((y != t).float().mean()) < 0.01
    gy, = torch.autograd.grad(y.sum(), x)
    gt, = torch.autograd.grad(t.sum(), x)
    assert float((gy != gt).float().mean()) < 0.01
    y2 = fakequant.fake_quantize_per_tensor_affine(x, torch.tensor(scale, device=device), torch.tensor(zp, device=device), -128, 127)
    assert bits_equal(y, y2)


@pytest.mark.parametrize("device", DEVICES)
def test_drop_in_per_channel_matches_torch(device):
    x = random_input((8, 3, 4, 4), torch.float32, device).requires_grad_()
    scale = torch.rand(3, device=device) * 0.05 + 0.01
    zp = torch.randint(0, 10, (3,), dtype=torch.int32, device=device)
    y = fakequant.fake_quantize_per_channel_affine(x, scale, zp, 1, 0, 255)
    t = torch.fake_quantize_per_channel_affine(x, scale, zp, 1, 0, 255)
    assert float((y - t).detach().abs().max()) <= float(scale.max()) * 1.001
    assert float((y != t).float().mean()) < 0.01
    assert_same(y.detach(), ref.fake_quantize_affine(x.detach(), scale, zp, 1, 0, 255)[0])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_onnxruntime_training_contract(device, dtype):
    x = random_input((5, 9), dtype, device)
    y, mask = fakequant.fake_quant(x, 0.05, 3, -128, 127)
    ey, emask = ref.fake_quantize_affine(x, 0.05, 3, None, -128, 127)
    assert mask.dtype == torch.bool and mask.shape == x.shape
    assert_same(y, ey)
    assert bits_equal(mask, emask)
    dy = random_input((5, 9), dtype, device)
    assert_same(fakequant.fake_quant_grad(dy, mask), torch.where(emask, dy, torch.zeros_like(dy)))


@pytest.mark.parametrize("device", DEVICES)
def test_affine_wrapper_is_differentiable(device):
    x = torch.linspace(-3, 3, 13, device=device, requires_grad=True)
    y = fakequant.fake_quantize_affine(x, 0.02, 0, None, -128, 127)
    (g,) = torch.autograd.grad(y.sum(), x)
    assert bits_equal(g, ref.fake_quantize_affine(x.detach(), 0.02, 0, None, -128, 127)[1].float())


def _available_memory_bytes():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


@pytest.mark.skipif(_available_memory_bytes() < 14 * 2**30, reason="needs about 9 GiB of free memory")
def test_more_than_2_to_31_elements():
    # 64-bit indexing: elements past 2^31 are quantized, masked and unmasked in place.
    n = 2**31 + 13
    x = torch.zeros(n, dtype=torch.float16)
    tail = torch.tensor([0.3, -7.0, 1.26, float("nan"), 0.5, -0.5, 2.0, 9.0, -1.1, 0.0, 1.0, 0.1, -0.26], dtype=torch.float16)
    x[-13:] = tail
    y, mask = ops.fake_quantize_amax(x, torch.tensor(2.0), 8, False, True)
    assert mask.numel() == (n + 7) // 8
    ey, emask = ref.fake_quantize_amax(tail, 2.0)
    assert_same(y[-13:], ey)
    assert not bool(y[: 2**20].any())
    bits = ((mask[-2:].unsqueeze(-1) >> torch.arange(8, dtype=torch.uint8)) & 1).flatten().bool()
    # n % 8 == 5: the last byte holds the last 5 elements, the byte before the 8 ahead of them
    assert bits_equal(bits[:13], emask)
    del y
    g = ops.mask_backward(x, mask)
    assert_same(g[-13:], torch.where(emask, tail, torch.zeros_like(tail)))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_integer_grids_give_positive_zero(device, dtype):
    """x in (-s/2, 0] rounds to q = -0.0; ONNX Runtime's DequantizeLinear gives +0.0 for
    it, and so does every op with an integer grid. The float grids (FP8, float blocks)
    keep the sign of a zero, as ONNX Runtime's float8 QuantizeLinear/DequantizeLinear do."""
    x = torch.tensor([-0.0, -1e-3, -0.04, 0.0, 1e-3], dtype=dtype, device=device)  # s = 0.1
    s, z = torch.tensor([0.1], device=device), torch.tensor([0], device=device)
    amax = torch.tensor(12.7, device=device)
    block = torch.cat([x, torch.tensor([12.7], dtype=dtype, device=device)])  # its amax gives s = 0.1
    outputs = {
        "affine": ops.fake_quantize_affine(x, s, z, None, -128, 127)[0],
        "affine, bool mask": ops.fake_quantize_affine(x, s, z, None, -128, 127, False)[0],
        "amax": ops.fake_quantize_amax(x, amax, 8, False, True)[0],
        "amax 0": ops.fake_quantize_amax(x, torch.tensor(0.0, device=device), 8, False, True)[0],
        "quantize_amax": ops.quantize_amax(x, amax, 8, False, True)[0],
        "min_max": ops.fake_quantize_min_max(x, torch.tensor(-12.8, device=device),
                                             torch.tensor(12.7, device=device), 8)[0],
        "lsq": ops.fake_quantize_lsq(x, s, z, None, -128, 127, 1.0),
        "blockwise int8": ops.fake_quantize_blockwise(block, 6, 8, False, True, 0, None)[0][:-1],
    }
    for name, y in outputs.items():
        assert bool((y == 0).all()) and not bool(y.signbit().any()), (name, y)
    tiny = torch.tensor([-1e-6, -0.0, 1e-6], dtype=dtype, device=device)
    for fmt, fmax in (((4, 3), 448.0), ((5, 2), 57344.0)):  # s = 1
        y = ops.fake_quantize_fp8(tiny, torch.tensor(fmax, device=device), *fmt)[0]
        assert bool((y == 0).all()) and y.signbit().tolist() == [True, True, False], (fmt, y)
