"""FP8 fake quantization (fake_quantize_fp8, scaled_e4m3) against the reference, which
uses torch's own float8 casts: bit for bit on each device, dtype and format, with exact
ties, saturation, NaN/inf, amax 0, FP8 subnormals, layouts; the mask and backward;
errors; gradcheck; torch.compile."""
import math

import pytest
import torch

import fakequant
import reference as ref
from conftest import DEVICES, DTYPES, assert_compiled_step_matches_eager, bits_equal
from fakequant import tensor_quant
from fakequant.ops import fake_quantize_fp8, fp8_max

ops = torch.ops.fakequant

FORMATS = [(4, 3), (5, 2)]
FP8_DTYPE = {(4, 3): torch.float8_e4m3fn, (5, 2): torch.float8_e5m2}
BITS = {torch.float64: torch.int64, torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}


def assert_bits(actual, expected):
    """Bit-identical (the sign of zero included), NaN where NaN; same dtype and shape."""
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    nan = actual.isnan()
    assert bits_equal(nan, expected.isnan())
    a = actual.masked_fill(nan, 0).contiguous().view(BITS[actual.dtype])
    e = expected.masked_fill(nan, 0).contiguous().view(BITS[expected.dtype])
    if not torch.equal(a, e):
        bad = (a != e).nonzero()[:5].tolist()
        raise AssertionError(f"{int((a != e).sum())} elements differ, e.g. at {bad}")


def check(x, amax, fmt):
    """The op's (y, mask) equal the reference's; returns y and the unpacked mask."""
    y, packed = ops.fake_quantize_fp8(x, amax, *fmt)
    ey, emask = ref.fake_quantize_fp8(x, amax, *fmt)
    assert_bits(y, ey)
    assert y.stride() == torch.empty_like(x).stride()
    assert packed.dtype == torch.uint8 and packed.shape == ((x.numel() + 7) // 8,)
    mask = fakequant.unpack_mask(packed, y)
    assert bits_equal(mask, emask.expand_as(mask))
    return y, mask


def random_input(shape, dtype, device, spread=3.0):
    return (torch.randn(shape, dtype=torch.float64) * spread).to(device, dtype)


def fp8_values(fmt, device="cpu"):
    """Every finite value of the format, ascending, as float64 (-0 dropped)."""
    v = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(FP8_DTYPE[fmt]).double()
    v = v[torch.isfinite(v)]
    return torch.unique(v).to(device)  # unique sorts and merges +-0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_per_tensor(device, dtype, fmt):
    x = random_input((7, 33, 5), dtype, device)
    for amax in (2.5, 448.0, 1e-3, 0.37, 1e4):  # some saturate, some land in FP8 subnormals
        y, mask = check(x, torch.tensor(amax, device=device), fmt)
        assert bool(mask.any()) or amax < 0.01
    # amax in other float dtypes reads as float32
    check(x, torch.tensor(2.5, dtype=torch.float64, device=device), fmt)
    check(x, torch.tensor([2.5], dtype=torch.bfloat16, device=device), fmt)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("amax_shape", [(8, 1, 1, 1), (1, 3, 1, 1), (1, 1, 1, 6), (8, 1, 1, 6), (3, 1, 1), (6,), (8, 3, 5, 6)])
def test_per_channel(device, dtype, fmt, amax_shape):
    x = random_input((8, 3, 5, 6), dtype, device)
    amax = torch.rand(amax_shape, device=device) * 3 + 0.1
    amax.view(-1)[0] = 0.0  # a channel with amax 0 quantizes to 0
    y, _ = check(x, amax, fmt)
    zero = (amax == 0).expand_as(x)
    assert bool((y[zero] == 0).all())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_layouts(device, dtype, fmt):
    x = random_input((4, 3, 5, 6), dtype, device)
    amax_c = torch.rand(1, 3, 1, 1, device=device) + 0.5
    xcl = x.to(memory_format=torch.channels_last)  # channels innermost: amax varies per element
    y, _ = check(xcl, amax_c, fmt)
    assert y.is_contiguous(memory_format=torch.channels_last)
    assert_bits(y.contiguous(), check(x, amax_c, fmt)[0])
    xt = random_input((7, 9), dtype, device).t()
    check(xt, torch.rand(9, 1, device=device) + 0.5, fmt)  # per row of the transposed view
    check(xt, torch.rand(9, 7, device=device) + 0.5, fmt)  # amax steps by 7 along memory
    check(xt, torch.tensor(2.0, device=device), fmt)
    sliced = random_input((6, 20), dtype, device)[1:, ::3]  # not dense
    check(sliced, torch.rand(5, 1, device=device) + 0.5, fmt)
    check(x[:, 1], torch.tensor(1.0, device=device), fmt)  # dense, offset, not contiguous
    big = random_input((3, 70001), dtype, device)  # several tiles, ragged end
    check(big, torch.rand(3, 1, device=device) + 1, fmt)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_exact_ties_round_half_to_even(device, dtype, fmt):
    # With a power-of-two scale, midpoints between consecutive FP8 values times s are
    # exact in every dtype and x / s is a tie: it rounds to the value whose code is even.
    fmax = fp8_max(*fmt)
    s = 2.0**-4 if fmt == (4, 3) else 2.0**-1
    v = fp8_values(fmt)
    mid = (v[1:] + v[:-1]) / 2
    x = (mid * s).to(dtype)
    assert bits_equal(x.double(), mid * s), "midpoints must be exact in the dtype"
    codes = mid.float().to(FP8_DTYPE[fmt]).view(torch.uint8)  # torch's rounding of each tie
    assert bool((codes % 2 == 0).all()), "ties go to even codes"
    amax = torch.tensor(fmax * s, device=device)
    y, mask = check(x.to(device), amax, fmt)
    expected = (codes.view(FP8_DTYPE[fmt]).double() * s).to(dtype)
    assert_bits(y.cpu(), expected)
    assert bool(mask.all())
    # The neighbours of each tie (one ulp of the dtype away) go to the nearer value.
    up = torch.nextafter(x, torch.full_like(x, math.inf))
    check(up.to(device), amax, fmt)
    # Near-ties with a scale that is not a power of two.
    s2 = 0.0371
    xs = (mid * s2).to(dtype).to(device)
    check(xs, torch.tensor(fmax * s2, device=device), fmt)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_saturation_nan_inf(device, dtype, fmt):
    fmax = fp8_max(*fmt)
    amax = 3.0
    big = torch.finfo(dtype).max
    vals = [math.nan, math.inf, -math.inf, amax * 1.01, -amax * 1.5, big, -big, amax, -amax, 0.5]
    x = torch.tensor(vals, dtype=dtype, device=device)
    y, mask = check(x, torch.tensor(amax, device=device), fmt)
    s = torch.tensor(amax / fmax, dtype=torch.float32)  # float32 division, as the contract
    top = float((torch.tensor(fmax, dtype=torch.float64 if dtype == torch.float64 else torch.float32) * s).to(dtype))
    assert math.isnan(float(y[0]))
    assert y[1:7].tolist() == [top, -top, top, -top, top, -top]
    assert float(y[7]) == top and float(y[8]) == -top
    assert mask.tolist() == [False, False, False, False, False, False, False, True, True, True]
    # Everything between max and max + half an FP8 step (and beyond) saturates.
    v = fp8_values(fmt)
    step = float(v[-1] - v[-2])
    xs = torch.tensor([fmax + step * f for f in (0.25, 0.5, 0.75, 1, 4)], dtype=torch.float64)
    y, _ = check(xs.to(device, dtype), torch.tensor(fmax, device=device), fmt)
    assert bool((y == fmax).all())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_amax_zero_and_tiny(device, dtype, fmt):
    x = torch.tensor([0.0, 1e-3, -5.0, math.nan, math.inf, -math.inf, -0.0], dtype=dtype, device=device)
    for amax in (0.0, 2.0**-25, 2.0**-24):
        y, mask = check(x, torch.tensor(amax, device=device), fmt)
        assert [float(v) for v in y[[0, 1, 2, 4, 5, 6]]] == [0.0] * 6
        assert math.isnan(float(y[3])), "NaN in gives NaN out"
        assert mask.tolist() == [True, False, False, False, False, False, True]
    check(x, torch.tensor(2.0**-23, device=device), fmt)  # just above: quantizes
    check(x, torch.tensor(2.0**-25, dtype=torch.float64, device=device), fmt)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_subnormals(device, dtype, fmt):
    fmax = fp8_max(*fmt)
    v = fp8_values(fmt)
    tiny = float(v[v > 0][0])  # the smallest FP8 subnormal
    # x / s across the FP8 subnormals and the first normals (s = 1), and below half
    # the smallest subnormal (to +-0).
    k = torch.arange(-80, 81, dtype=torch.float64)
    x = (k * tiny / 8).to(dtype).to(device)
    y, _ = check(x, torch.tensor(fmax, device=device), fmt)
    assert bool((y[(k.abs() <= 4).to(device)] == 0).all())  # up to half the smallest subnormal (a tie, to 0)
    assert bool((y[(k.abs() > 4).to(device)] != 0).all())
    # random values around the subnormals, with scales that are not powers of two
    r = (torch.randn(4000, dtype=torch.float64) * tiny * 8).to(dtype).to(device)
    for amax in (fmax * 0.3, fmax * 7.1, 2.0**-20):
        check(r * (amax / fmax), torch.tensor(amax, device=device), fmt)
    # subnormal inputs of the dtype itself (and float16 outputs that are subnormal)
    sub = torch.tensor([torch.finfo(dtype).tiny / 4, -torch.finfo(dtype).tiny / 2, 2.0**-20, -(2.0**-22)], dtype=dtype)
    for amax in (2.0**-23, 2.0**-10, 1.0):
        check(sub.to(device), torch.tensor(amax, device=device), fmt)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_empty_and_zero_dim(device, dtype, fmt):
    for shape, amax_shape in (((0, 3), (3,)), ((5, 0), (5, 1)), ((0,), ())):
        x = torch.empty(shape, dtype=dtype, device=device)
        y, packed = ops.fake_quantize_fp8(x, torch.ones(amax_shape, device=device), *fmt)
        assert y.shape == x.shape and y.dtype == dtype and packed.shape == (0,)
    check(torch.tensor(1.3, dtype=dtype, device=device), torch.tensor(2.0, device=device), fmt)


# --- backward ---------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_backward_is_grad_times_mask(device, dtype, fmt):
    x = random_input((4, 3, 5, 6), dtype, device).to(memory_format=torch.channels_last).requires_grad_()
    amax = torch.rand(1, 3, 1, 1, device=device) + 1.0
    y = fake_quantize_fp8(x, amax, *fmt)
    _, emask = ref.fake_quantize_fp8(x.detach(), amax, *fmt)
    assert_bits(y.detach(), ref.fake_quantize_fp8(x.detach(), amax, *fmt)[0])
    g = torch.randn(4, 3, 5, 6, device=device).to(dtype)  # contiguous, unlike y
    g[0, 0, 0, 0] = math.nan
    (gx,) = torch.autograd.grad(y, x, g, retain_graph=True)
    expected = torch.where(emask, g, torch.zeros_like(g))
    assert_bits(gx.contiguous(), expected)
    # an expanded gradient (from a sum)
    (gx,) = torch.autograd.grad(y.sum(), x)
    assert_bits(gx.contiguous(), emask.to(dtype))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_gradcheck(device, fmt):
    # A fake quantizer is a staircase: gradcheck's central differences see the
    # straight-through gradient only where x - eps and x + eps are both values of the
    # format (times s), so x sits halfway between two points of a grid of FP8 values:
    # every multiple of 2^-3 (E4M3) or 2^-2 (E5M2) in [-2, 2] is one. Outside
    # [-amax, amax] both points saturate: the derivative and the mask are 0.
    grid = 2.0**-3 if fmt == (4, 3) else 2.0**-2
    eps = grid / 2
    n = int(2 / grid)
    k = torch.randint(-n, n, (40,), dtype=torch.float64)
    for s in (1.0, 2.0**-5):
        amax = fp8_max(*fmt) * s
        inside = (k * grid + eps) * s
        outside = torch.tensor([1.5, -3.0, 1e3], dtype=torch.float64) * amax
        x = torch.cat([inside, outside]).to(device).requires_grad_()
        fn = lambda t: fake_quantize_fp8(t, amax, *fmt)  # noqa: E731
        assert torch.autograd.gradcheck(fn, (x,), eps=eps * s, atol=1e-7, rtol=1e-7)
        assert torch.autograd.gradgradcheck(fn, (x,), eps=eps * s, atol=1e-7, rtol=1e-7)
    # per-channel amax: s = 1/4 and 1/8, so that the perturbation eps / 4 is eps and
    # 2 eps = grid in x / s; row 1 sits on the grid, its neighbours one grid point away.
    x = torch.stack([(k * grid + eps) / 4, k.clamp(-n + 1, n - 1) * grid / 8]).to(device).requires_grad_()
    amax = torch.tensor([[fp8_max(*fmt) / 4], [fp8_max(*fmt) / 8]], device=device)
    fn = lambda t: fake_quantize_fp8(t, amax, *fmt)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x,), eps=eps / 4, atol=1e-7, rtol=1e-7)


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph(device):
    amax_w = torch.tensor([[1.0], [2.0], [3.0]], device=device)

    def qat_step(x, w):
        xq = fake_quantize_fp8(x, 2.0)
        wq = fake_quantize_fp8(w, amax_w, 5, 2)
        return fake_quantize_fp8(xq @ wq.t(), torch.tensor(4.0, device=device)).relu().sum()

    assert_compiled_step_matches_eager(qat_step, device)
    # the operator alone compiles to the same bits
    xs = random_input((64, 9), torch.float32, device)
    f = torch.compile(lambda t: fake_quantize_fp8(t, 2.0), fullgraph=True, dynamic=False)
    assert_bits(f(xs), ref.fake_quantize_fp8(xs, 2.0)[0])


# --- errors -------------------------------------------------------------------------


x0 = torch.randn(4, 3, 5)
BAD = [
    (dict(exponent_bits=3, mantissa_bits=4), ValueError, "exponent_bits"),
    (dict(exponent_bits=4, mantissa_bits=2), ValueError, "mantissa_bits"),
    (dict(exponent_bits=5, mantissa_bits=3), ValueError, "exponent_bits"),
    (dict(exponent_bits=2, mantissa_bits=1), ValueError, "exponent_bits"),
    (dict(exponent_bits=8, mantissa_bits=0), ValueError, "exponent_bits"),
    (dict(amax=torch.tensor(-1.0)), ValueError, "amax"),
    (dict(amax=torch.tensor([1.0, -0.5, 1.0])), ValueError, "amax"),
    (dict(amax=torch.tensor(math.nan)), ValueError, "amax"),
    (dict(amax=torch.tensor(math.inf)), ValueError, "amax"),
    (dict(amax=torch.tensor(1e300, dtype=torch.float64)), ValueError, "amax"),  # inf as float32
    (dict(amax=torch.ones(4)), ValueError, "amax"),  # does not broadcast to (4, 3, 5)
    (dict(amax=torch.ones(2, 4, 3, 5)), ValueError, "amax"),
    (dict(amax=torch.tensor(1)), TypeError, "amax"),
    (dict(amax=torch.tensor(1.0, device="meta")), ValueError, "amax"),
    (dict(input=torch.ones(3, dtype=torch.int32)), TypeError, "input"),
    (dict(input=torch.ones(3, dtype=torch.complex64)), TypeError, "input"),
    (dict(input=torch.ones(3).to(torch.float8_e4m3fn)), TypeError, "input"),
]


@pytest.mark.parametrize("kw,exc,name", BAD)
def test_errors_name_the_argument(kw, exc, name):
    args = dict(input=x0, amax=torch.tensor(1.0), exponent_bits=4, mantissa_bits=3)
    args.update(kw)
    with pytest.raises(exc, match=name):
        ops.fake_quantize_fp8(*args.values())
    with pytest.raises(exc, match=name):
        fake_quantize_fp8(*args.values())


def test_wrapper_errors():
    with pytest.raises(TypeError, match="exponent_bits"):
        fake_quantize_fp8(x0, 1.0, 4.0, 3)
    with pytest.raises(TypeError, match="mantissa_bits"):
        fake_quantize_fp8(x0, 1.0, 4, True)
    with pytest.raises(TypeError, match="amax"):
        fake_quantize_fp8(x0, "1.0")
    with pytest.raises(TypeError, match="input"):
        fake_quantize_fp8([1.0], 1.0)
    with pytest.raises(ValueError, match="amax"):
        fake_quantize_fp8(x0, -2.0)
    with pytest.raises(ValueError, match="exponent_bits"):
        fp8_max(4, 4)
    # the fake kernel (meta tensors, torch.compile tracing) checks the format too
    with pytest.raises(ValueError, match="exponent_bits"):
        ops.fake_quantize_fp8(torch.empty(3, device="meta"), torch.tensor(1.0, device="meta"), 3, 4)
    assert fp8_max() == 448.0 and fp8_max(5, 2) == 57344.0
    y, m = ops.fake_quantize_fp8(torch.empty(2, 3, device="meta"), torch.tensor(1.0, device="meta"))
    assert y.shape == (2, 3) and m.shape == (1,) and m.dtype == torch.uint8


# --- scaled_e4m3 (pytorch-quantization / modelopt calling convention) ----------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_scaled_e4m3(device, dtype):
    x = random_input((6, 40), dtype, device)
    amax = torch.tensor(2.5, device=device)
    y = tensor_quant.scaled_e4m3(x, amax)
    assert_bits(y, ref.fake_quantize_fp8(x, amax)[0])
    assert_bits(tensor_quant.scaled_e4m3(x, amax, 4, 3), y)
    assert_bits(tensor_quant.scaled_e4m3(x, 2.5), y)  # a number
    assert_bits(tensor_quant.scaled_e4m3(x, amax, E=5, M=2), ref.fake_quantize_fp8(x, amax, 5, 2)[0])
    per_row = x.abs().amax(-1, keepdim=True)
    assert_bits(tensor_quant.scaled_e4m3(x, per_row), ref.fake_quantize_fp8(x, per_row)[0])
    # amax None: scale 1, plain rounding to E4M3 with saturation
    xc = x * 100
    ct = torch.float64 if dtype == torch.float64 else torch.float32
    plain = xc.to(ct).clamp(-448, 448).to(torch.float8_e4m3fn).to(dtype)
    assert_bits(tensor_quant.scaled_e4m3(xc), plain)
    assert_bits(tensor_quant.ScaledE4M3Function.apply(xc), plain)
    assert_bits(tensor_quant.ScaledE4M3Function.apply(x, amax, 4, 3), y)


@pytest.mark.parametrize("device", DEVICES)
def test_scaled_e4m3_backward_and_function_protocol(device):
    x = random_input((5, 16), torch.float32, device).requires_grad_()
    amax = torch.tensor(2.0, device=device)
    inside = x.detach().abs() <= 2.0
    (g,) = torch.autograd.grad(tensor_quant.scaled_e4m3(x, amax).sum(), x)
    assert bits_equal(g, inside.float())
    # forward/backward of the Function itself (as a tracer would use them)
    apply = torch.autograd.Function.apply.__func__
    y = apply(tensor_quant.ScaledE4M3Function, x, amax, 4, 3)
    assert_bits(y.detach(), ref.fake_quantize_fp8(x.detach(), amax)[0])
    grad = torch.randn_like(y)
    grad[0, 0] = math.nan
    (g,) = torch.autograd.grad(y, x, grad)
    assert_bits(g, torch.where(inside, grad, torch.zeros_like(grad)))
    z = apply(tensor_quant.ScaledE4M3Function, x, None, 4, 3)
    (g,) = torch.autograd.grad(z.sum(), x)
    assert bool((g == 1).all())  # |x| <= 448 everywhere


def test_scaled_e4m3_errors():
    with pytest.raises(ValueError, match="exponent_bits"):
        tensor_quant.scaled_e4m3(torch.randn(3), 1.0, 3, 4)
    with pytest.raises(ValueError, match="exponent_bits"):
        tensor_quant.scaled_e4m3(torch.randn(3), None, 3, 4)
    with pytest.raises(ValueError, match="amax"):
        tensor_quant.scaled_e4m3(torch.randn(3), torch.tensor(-1.0))
    with pytest.raises(TypeError, match="amax"):
        tensor_quant.scaled_e4m3(torch.randn(3), "1")
    with pytest.raises(TypeError, match="inputs"):
        tensor_quant.scaled_e4m3([1.0, 2.0])
