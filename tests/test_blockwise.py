"""fake_quantize_blockwise (block-wise dynamic quantization along the last dimension)
against the plain-PyTorch reference, bit for bit: integer and E2M1/E4M3/E5M2 elements,
one- and two-level (NVFP4) scales, ragged blocks, layouts, NaN/inf, zero blocks, empty
tensors; the E2M1 rounding on every midpoint; the backward; errors; gradcheck;
torch.compile; other axes through the Python wrapper."""
import math
import os

import pytest
import torch

import fakequant
import reference as ref
from conftest import DEVICES, DTYPES, assert_same, bits_equal
from fakequant._core import BlockScales
from fakequant.ops import fake_quantize_blockwise

ops = torch.ops.fakequant

# (num_bits, unsigned, narrow_range, exponent_bits)
FORMATS = {
    "int8": (8, False, True, 0),
    "int8-wide": (8, False, False, 0),
    "uint8": (8, True, True, 0),
    "int4": (4, False, True, 0),
    "uint4-wide": (4, True, False, 0),
    "E2M1": (4, False, True, 2),
    "E3M2": (6, False, True, 3),
    "E2M3": (6, False, True, 2),
    "E4M3": (8, False, True, 4),
    "E5M2": (8, False, True, 5),
}

# (shape, block_size): uniform (block_size divides the last dimension: the
# compile-time sizes 16/32/64/128 and others), ragged, one block per row,
# block_size 1, rows of one element, several tiles.
GEOMETRIES = [
    ((6, 64), 16),
    ((3, 16), 16),  # an odd number of 16-blocks
    ((5, 4, 32), 32),
    ((2, 192), 64),
    ((3, 256), 128),
    ((4, 48), 24),
    ((5, 100), 32),  # ragged: 32, 32, 32, 4
    ((7, 33), 128),  # one block per row, shorter than block_size
    ((9, 37), 1),
    ((10, 1), 16),
    ((11, 7), 5),
    ((300, 70), 16),  # ragged, several tiles, parallel
    ((1000, 16), 16),
    # tiles of whole rows would be too long: amax first, then the elements
    ((3, 10001), 100),
    ((2, 70000), 70000),
]


def varied_input(shape, dtype, device, seed=0):
    """Normal values times magnitudes that vary over five decades, so that blocks
    get very different scales."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float64)
    x = x * torch.exp(torch.randn(shape, generator=g, dtype=torch.float64) * 2.5)
    return x.to(device, dtype)


def check(x, block_size, fmt, scale_amax=None, e8m0_scale=False, centered=False):
    """The op's (y, mask) equal the reference's bit for bit (MX scales and centered blocks too)."""
    num_bits, unsigned, narrow, ebits = fmt
    y, mask = ops.fake_quantize_blockwise(x, block_size, num_bits, unsigned, narrow, ebits, scale_amax, True,
                                          e8m0_scale, centered)
    ey, emask = ref.fake_quantize_blockwise(x, block_size, num_bits, unsigned, narrow, ebits, scale_amax,
                                            e8m0_scale, centered)
    assert_same(y, ey)
    assert mask.dtype == torch.uint8 and mask.shape == ((x.numel() + 7) // 8,)
    assert bits_equal(fakequant.unpack_mask(mask, y), emask)
    return y, mask


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", FORMATS.values(), ids=FORMATS.keys())
@pytest.mark.parametrize("two_level", [False, True], ids=["one-level", "two-level"])
def test_matches_reference(device, dtype, fmt, two_level):
    for i, (shape, block_size) in enumerate(GEOMETRIES):
        x = varied_input(shape, dtype, device, seed=i)
        # scale_amax of the whole tensor (NVFP4's rule) and a smaller one, under
        # which block scales saturate at 448 * g and elements clip.
        for sa in ([x.float().abs().amax(), x.float().abs().amax() / 300] if two_level else [None]):
            check(x, block_size, fmt, sa)


@pytest.mark.parametrize("device", DEVICES)
def test_nvfp4_as_documented(device):
    # NVFP4: blocks of 16 E2M1 values, block scales in E4M3 against amax / (6 * 448).
    x = varied_input((8, 64), torch.float32, device)
    sa = x.abs().amax()
    y = fake_quantize_blockwise(x, 16, num_bits=4, exponent_bits=2, scale_amax=sa)
    xb = x.reshape(8, 4, 16)
    g = sa / (6.0 * 448.0)
    s = ((xb.abs().amax(-1, keepdim=True) / 6.0) / g).to(torch.float8_e4m3fn).float() * g
    q = ref.round_e2m1(xb / s)
    assert bits_equal(y, (q * s).reshape(8, 64))
    assert bool(torch.isin(q.abs(), torch.tensor(ref.E2M1_VALUES, device=device)).all())


# (block scales, num_bits, exponent_bits, block_size): one level (int4, E4M3), NVFP4, MXFP4, MXFP8
RULES = {"int4": (None, 4, 0, 32), "E4M3": (None, 8, 4, 32), "NVFP4": (BlockScales.E4M3, 4, 2, 16),
         "MXFP4": (BlockScales.E8M0, 4, 2, 32), "MXFP8": (BlockScales.E8M0, 8, 4, 32)}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rule", RULES.values(), ids=RULES.keys())
def test_the_rule_gives_the_codes_and_scales(device, rule):
    # The one rule per format (reference.block_scales, element_codes), which the composite and the
    # serving exporter ask for codes and scales: codes * scales are the operator's outputs, and
    # the scales' stored codes give the scales back.
    scale_format, num_bits, exponent_bits, block = rule
    x = varied_input((8, 64), torch.float32, device)
    x[0, :block] = 0.0  # a degenerate block
    sa = x.abs().amax() if scale_format is BlockScales.E4M3 else None
    y = fake_quantize_blockwise(x, block, num_bits=num_bits, exponent_bits=exponent_bits, scale_amax=sa,
                                e8m0_scale=scale_format is BlockScales.E8M0)
    xb = x.reshape(8, 64 // block, block)
    scales = ref.block_scales(xb.abs().amax(-1, keepdim=True), num_bits, False, exponent_bits, scale_format, sa)
    codes, _ = ref.element_codes(xb / scales.scale, num_bits, False, True, exponent_bits)
    expected = torch.where(scales.degenerate, torch.zeros_like(codes), codes * scales.scale)
    assert bits_equal(y, expected.reshape(8, 64))
    assert bool(scales.degenerate[0, 0]) == (scale_format is not BlockScales.E8M0)  # E8M0: never degenerate
    if scale_format is BlockScales.E4M3:
        assert bits_equal(scales.code * scales.global_scale, scales.scale)
    elif scale_format is BlockScales.E8M0:
        assert scales.code.dtype == torch.uint8
        assert bits_equal(torch.ldexp(torch.ones_like(scales.scale), scales.code.int() - 127), scales.scale)
    else:
        assert scales.global_scale is None and bits_equal(scales.code, scales.scale)


# --- rounding of the element formats on every midpoint ------------------------------


def _positive_values(ebits):
    if ebits == 2:
        return torch.tensor(ref.E2M1_VALUES)
    dt = torch.float8_e4m3fn if ebits == 4 else torch.float8_e5m2
    v = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dt).float()
    return v[v.isfinite() & (v >= 0)].unique()


def _e2m1_brute_force(v):
    """Nearest of the 15 signed E2M1 values, ties to the even code, written out."""
    grid = torch.tensor(ref.E2M1_VALUES, dtype=torch.float64)
    out = []
    for t in v.double().flatten().tolist():
        a = min(abs(t), 6.0)
        d = [abs(a - g) for g in grid.tolist()]
        best = min(d)
        codes = [c for c in range(8) if d[c] == best]
        code = codes[0] if len(codes) == 1 else [c for c in codes if c % 2 == 0][0]
        out.append(math.copysign(grid[code].item(), t))
    return torch.tensor(out, dtype=torch.float32).reshape(v.shape)


def test_reference_e2m1_rounding_against_brute_force():
    vals = _positive_values(2)
    mids = (vals[1:] + vals[:-1]) / 2
    v = torch.cat([vals, mids, mids.nextafter(torch.tensor(0.0)), mids.nextafter(torch.tensor(9.0)),
                   torch.arange(-8 * 64, 8 * 64 + 1) / 64, torch.randn(2000) * 3,
                   torch.tensor([7.0, 1e30, 0.0, -0.0, 1e-40])])
    v = torch.cat([v, -v])
    assert bits_equal(ref.round_e2m1(v), _e2m1_brute_force(v))
    expected_ties = {0.25: 0.0, 0.75: 1.0, 1.25: 1.0, 1.75: 2.0, 2.5: 2.0, 3.5: 4.0, 5.0: 4.0}
    for t, e in expected_ties.items():
        assert ref.round_e2m1(torch.tensor([t, -t])).tolist() == [e, -e]
    assert ref.round_e2m1(torch.tensor([float("nan")])).isnan().all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("ebits", [2, 4, 5], ids=["E2M1", "E4M3", "E5M2"])
def test_float_elements_round_every_midpoint(device, ebits):
    # One block whose amax is the format's max: scale 1, so x / s is x. It holds
    # every positive value of the format, every midpoint (ties: to even), and the
    # neighbours of each midpoint, with both signs.
    vals = _positive_values(ebits)
    mids = (vals[1:] + vals[:-1]) / 2
    v = torch.cat([vals, mids, mids.nextafter(torch.tensor(0.0)), mids.nextafter(torch.tensor(1e9))])
    v = torch.cat([v, -v]).reshape(1, -1).to(device)
    num_bits = 4 if ebits == 2 else 8
    y, _ = check(v, v.numel(), (num_bits, False, True, ebits))
    expected = ref.round_to_float_format(v, ebits)
    assert_same(y, expected)
    if ebits == 2:
        assert bits_equal(y.cpu(), _e2m1_brute_force(v.cpu()))


# --- special values -----------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", ["int8", "E2M1", "E4M3"])
def test_nan_inf_and_degenerate_blocks(device, dtype, fmt):
    x = varied_input((6, 32), torch.float64, "cpu")
    x[0, 3] = math.nan  # block (0, 0): NaN everywhere
    x[1, 17] = math.inf  # block (1, 1): scale inf, NaN outputs (one level)
    x[2, 5] = -math.inf
    x[3, :16] = 0.0  # zero block
    x[3, 16:] = 1e-9  # amax <= 2^-24: 0
    x[4, :16] = -0.0
    x[4, 16:] = torch.tensor([2.0**-24, -(2.0**-24)]).repeat(8)  # exactly the threshold
    x[5, 16:] = x[5, 16:] * 1e-30
    x = x.to(device, dtype)
    for sa in (None, torch.tensor(5.0, device=device), torch.tensor(0.0, device=device)):
        y, mask = check(x, 16, FORMATS[fmt], sa)
        m = fakequant.unpack_mask(mask, y)
        assert (y[3] == 0).all() and m[3].all()
        assert (y[4] == 0).all() and m[4].all()
        if sa is not None and float(sa) == 0.0:  # g = 0: every block degenerate, NaN stays NaN
            assert y[0, 3].isnan() and (y[0, :3] == 0).all() and (y[1:] == 0).all()
            assert m.sum() == m.numel() - 1
        else:
            assert y[0, :16].isnan().all() and not m[0, :16].any()
        if sa is None:
            assert y[1, 16:].isnan().all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape,block_size", [((1, 100003), 16), ((2, 9999), 20000), ((131073,), 65537)])
def test_long_rows_and_blocks(device, shape, block_size):
    x = varied_input(shape, torch.float32, device)
    x.view(-1)[5] = math.nan
    x.view(-1)[-40:] = 0.0
    x.view(-1)[70000:70100] = 1e-12
    for fmt in ("int8", "E2M1"):
        check(x, block_size, FORMATS[fmt])
        check(x, block_size, FORMATS[fmt], x.nan_to_num().abs().amax())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(0,), (0, 16), (3, 0), (2, 0, 5)])
def test_empty(device, dtype, shape):
    x = torch.empty(shape, device=device, dtype=dtype)
    y, mask = ops.fake_quantize_blockwise(x, 16, 8, False, True, 0, None)
    assert y.shape == x.shape and y.dtype == dtype and mask.shape == (0,)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_zero_dim_is_one_block_of_one(device, dtype):
    for v in (2.5, -1e-30, 0.0, math.nan):
        x = torch.tensor(v, dtype=dtype, device=device)
        for fmt in ("int8", "E2M1"):
            y, _ = check(x, 32, FORMATS[fmt])
            assert y.shape == ()
    x = torch.tensor(2.5, dtype=dtype, device=device)
    assert_same(fake_quantize_blockwise(x, 4), ref.fake_quantize_blockwise(x, 4)[0])


# --- layouts ----------------------------------------------------------------------------


def _layouts(device):
    base = varied_input((4, 6, 5, 40), torch.float32, device)
    return {
        # rows (the last dimension) are runs of memory and the tensor is dense:
        # the output keeps input's strides
        "contiguous": (base, True),
        "permuted, last dim contiguous": (base.permute(2, 0, 1, 3), True),
        "size-1 last dim, any stride": (torch.empty_strided((4, 6, 5, 1), (30, 5, 1, 7), device=device)
                                        .copy_(base[..., :1]), True),
        # otherwise: a contiguous copy, a contiguous output
        "channels_last": (base.contiguous(memory_format=torch.channels_last), False),
        "transposed": (base.transpose(-1, -2), False),
        "sliced": (base[:, :, 1:4, 3:37], False),
        "strided rows": (base[..., ::2], False),
        "expanded": (base[:1, :1].expand(3, 6, 5, 40), False),
        "offset view": (base.reshape(-1)[7:7 + 30 * 33].view(30, 33), True),
    }


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(_layouts("cpu")))
def test_layouts(device, name):
    x, keeps = _layouts(device)[name]
    for block_size, fmt in ((16, "int8"), (7, "E2M1"), (32, "int4")):
        sa = x.abs().amax() if fmt == "E2M1" else None
        y, _ = check(x, block_size, FORMATS[fmt], sa)
        if keeps:
            assert y.stride() == x.stride()
        else:
            assert y.is_contiguous()


# --- backward ---------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_backward_is_grad_times_mask(device, dtype):
    for x0, fmt, sa in (
        (varied_input((6, 40), dtype, device), "int8", None),
        (varied_input((6, 5, 40), dtype, device).transpose(-1, -2), "int4", None),  # contiguous output
        (varied_input((6, 64), dtype, device), "E2M1", torch.tensor(0.01, device=device)),  # clipping
    ):
        x = x0.detach().requires_grad_()
        num_bits, unsigned, narrow, ebits = FORMATS[fmt]
        y = fake_quantize_blockwise(x, 16, num_bits, unsigned, narrow, ebits, sa)
        _, emask = ref.fake_quantize_blockwise(x0, 16, num_bits, unsigned, narrow, ebits, sa)
        g = torch.randn_like(y)
        (gx,) = torch.autograd.grad(y, x, g)
        assert_same(gx, torch.where(emask, g, torch.zeros_like(g)))
        if fmt == "E2M1":
            assert not emask.all()  # the case clips
        (gx,) = torch.autograd.grad(fake_quantize_blockwise(x, 16, num_bits, unsigned, narrow, ebits, sa).sum(), x)
        assert_same(gx, emask.to(dtype))  # an expanded gradient


@pytest.mark.parametrize("num_bits,exponent_bits", [(8, 0), (4, 0), (8, 4), (8, 5), (4, 2)])
def test_block_maxima_keep_their_gradient(num_bits, exponent_bits):
    """The mask marks what was not saturated: amax / fp32(amax / bound) often rounds just
    above bound in float32, and the block's own maximum must still get its gradient."""
    x = torch.rand(20000, 32) + 0.5
    y, mask = ops.fake_quantize_blockwise(x, 32, num_bits, False, True, exponent_bits, None)
    m = fakequant.unpack_mask(mask, y)
    xs = x / (x.abs().amax(-1, keepdim=True) / ref.blockwise_element_max(num_bits, False, exponent_bits))
    if exponent_bits != 2:  # (amax / fp32(amax / 6) never rounds above 6 here)
        assert bool((xs.abs() > ref.blockwise_element_max(num_bits, False, exponent_bits)).any())  # it arises
    assert bool(m.all())
    # two-level scales below the block amax do saturate: those elements get no gradient
    y, mask = ops.fake_quantize_blockwise(x * 3, 32, num_bits, False, True, exponent_bits, torch.tensor(1.0))
    assert not bool(fakequant.unpack_mask(mask, y).all())


# --- errors -----------------------------------------------------------------------------

x0 = torch.randn(4, 3, 32)
# (arguments, exception, the name in its message, whether metadata alone shows it:
# then the fake kernel, which runs on meta tensors and under torch.compile, raises too)
BAD = [
    (dict(block_size=0), ValueError, "block_size", True),
    (dict(block_size=-16), ValueError, "block_size", True),
    (dict(num_bits=1), ValueError, "num_bits", True),
    (dict(num_bits=17), ValueError, "num_bits", True),
    (dict(num_bits=4, exponent_bits=3), ValueError, "exponent_bits", True),
    (dict(num_bits=8, exponent_bits=2), ValueError, "exponent_bits", True),
    (dict(num_bits=6, exponent_bits=4), ValueError, "exponent_bits", True),
    (dict(exponent_bits=-1), ValueError, "exponent_bits", True),
    (dict(num_bits=4, exponent_bits=2, unsigned=True), ValueError, "unsigned", True),
    (dict(scale_amax=torch.tensor(-1.0)), ValueError, "scale_amax", False),
    (dict(scale_amax=torch.tensor(math.nan)), ValueError, "scale_amax", False),
    (dict(scale_amax=torch.tensor(math.inf)), ValueError, "scale_amax", False),
    (dict(scale_amax=torch.tensor(1e300, dtype=torch.float64)), ValueError, "scale_amax", False),  # inf in fp32
    (dict(scale_amax=torch.ones(2)), ValueError, "scale_amax", True),
    (dict(scale_amax=torch.ones(0)), ValueError, "scale_amax", True),
    (dict(scale_amax=torch.tensor(1)), TypeError, "scale_amax", True),
    (dict(scale_amax=torch.tensor(1.0, device="meta")), ValueError, "scale_amax", False),
    (dict(input=torch.ones(3, dtype=torch.int32)), TypeError, "input", False),
    (dict(input=torch.ones(3).to(torch.float8_e4m3fn)), TypeError, "input", False),
]


def _call(**kw):
    args = dict(input=x0, block_size=16, num_bits=8, unsigned=False, narrow_range=True, exponent_bits=0,
                scale_amax=None)
    args.update(kw)
    return ops.fake_quantize_blockwise(*args.values())


@pytest.mark.parametrize("kwargs,exc,name,metadata", BAD)
def test_bad_arguments(kwargs, exc, name, metadata):
    with pytest.raises(exc, match=name):
        _call(**kwargs)
    if metadata:
        meta = {k: (v.to("meta") if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}
        with pytest.raises(exc, match=name):
            _call(input=x0.to("meta"), **meta)


@pytest.mark.parametrize("kwargs,exc,name", [
    (dict(axis=2), IndexError, "axis"),
    (dict(axis=-3), IndexError, "axis"),
    (dict(axis=1.0), TypeError, "axis"),
    (dict(block_size=16.0), TypeError, "block_size"),
    (dict(block_size=True), TypeError, "block_size"),
    (dict(exponent_bits=None), TypeError, "exponent_bits"),
    (dict(scale_amax="1"), TypeError, "scale_amax"),
    (dict(input=[1.0, 2.0]), TypeError, "input"),
])
def test_bad_wrapper_arguments(kwargs, exc, name):
    args = dict(input=torch.randn(3, 32), block_size=16)
    args.update(kwargs)
    with pytest.raises(exc, match=name):
        fake_quantize_blockwise(**args)


def test_meta_tensors_give_shapes_and_layouts():
    for x, contiguous in ((torch.empty(4, 6, 40, device="meta").permute(1, 0, 2), False),
                          (torch.empty(4, 40, 6, device="meta").transpose(1, 2), True)):
        y, mask = ops.fake_quantize_blockwise(x, 16, 8, False, True, 0, None)
        assert y.shape == x.shape and mask.shape == ((x.numel() + 7) // 8,)
        assert y.is_contiguous() if contiguous else y.stride() == x.stride()


# --- gradcheck, torch.compile, other axes ----------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck(device):
    # One-level block scales depend on x through amax, a path the straight-through
    # estimator ignores by design, so gradcheck runs with two-level scales, which are
    # locally constant: every block has amax 1 and scale_amax = 448 / 440, so that
    # amax / elem_max / g = 440 rounds to 448 in E4M3 within +-1.8% (eps is 0.5%), and
    # the block's maximum lands at 440/448 of the range (inside). 16-bit steps (3e-5)
    # are far below eps: central differences see slope 1 where the mask is set.
    g = torch.Generator().manual_seed(0)
    x = (torch.rand(4, 32, generator=g, dtype=torch.float64) - 0.5) * 1.8
    x[:, 0] = 1.0
    x[:, 16] = -1.0
    x = x.to(device).requires_grad_()
    sa = torch.tensor(448.0 / 440.0, device=device)
    fn = lambda t: fake_quantize_blockwise(t, 16, num_bits=16, scale_amax=sa)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x,), eps=5e-3, atol=1e-2)
    assert torch.autograd.gradgradcheck(fn, (x,), eps=5e-3, atol=1e-2)


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph(device):
    sa = torch.tensor(3.0, device=device)

    def step(x, w):
        xq = fake_quantize_blockwise(x, 16, num_bits=4, exponent_bits=2, scale_amax=sa)
        wq = fake_quantize_blockwise(w, 32, axis=0)  # blocks along the input dimension of w.t()
        return (xq @ wq).relu().sum()

    x = varied_input((8, 48), torch.float32, device).requires_grad_()
    w = varied_input((48, 5), torch.float32, device, seed=1).requires_grad_()
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    out_c = compiled(x, w)
    gx_c, gw_c = torch.autograd.grad(out_c, (x, w))
    out_e = step(x, w)
    gx_e, gw_e = torch.autograd.grad(out_e, (x, w))
    assert bits_equal(out_c, out_e) and bits_equal(gx_c, gx_e) and bits_equal(gw_c, gw_e)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("axis", [0, 1, -2, -3])
def test_other_axes(device, axis):
    x = varied_input((20, 30, 12), torch.float32, device)
    y = fake_quantize_blockwise(x, 8, num_bits=4, axis=axis)
    ey, _ = ref.fake_quantize_blockwise(x.movedim(axis, -1), 8, 4)
    assert_same(y, ey.movedim(-1, axis))
    assert y.shape == x.shape
    # backward through the moved axis
    xr = x.detach().requires_grad_()
    g = torch.randn_like(x)
    (gx,) = torch.autograd.grad(fake_quantize_blockwise(xr, 8, num_bits=4, axis=axis), xr, g)
    _, emask = ref.fake_quantize_blockwise(x.movedim(axis, -1), 8, 4)
    assert_same(gx, torch.where(emask.movedim(-1, axis), g, torch.zeros_like(g)))


def test_wrapper_defaults_and_numbers():
    x = varied_input((3, 64), torch.float32, "cpu")
    assert_same(fake_quantize_blockwise(x, 32), ref.fake_quantize_blockwise(x, 32)[0])
    assert_same(fake_quantize_blockwise(x, 16, 4, exponent_bits=2, scale_amax=2.0),
                ref.fake_quantize_blockwise(x, 16, 4, exponent_bits=2, scale_amax=2.0)[0])
    assert_same(fake_quantize_blockwise(torch.tensor(1.5), 4, axis=0), ref.fake_quantize_blockwise(torch.tensor(1.5), 4)[0])


# --- CUDA: the kernel's own paths against the CPU kernel (skipped without a GPU) -----------

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

# Geometries that take each path of the CUDA kernel: a warp's mask bits as one aligned
# word (power-of-two blocks dividing the rows: groups of 1 to 32 lanes, 1 to 4 or more
# steps per block), or or-ed in with atomics (other sizes, ragged rows); blocks in
# registers or read twice (over 128 elements).
CUDA_GEOMETRIES = [
    ((64, 64), 1), ((64, 64), 4), ((100, 64), 16), ((33, 96), 32), ((9, 128), 64), ((7, 512), 128),
    ((5, 1024), 256), ((3, 4096), 4096),
    ((40, 60), 12), ((17, 100), 32), ((13, 33), 128), ((11, 1000), 300), ((2, 70001), 16), ((50, 7), 3),
]


@cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", ["int8", "uint4-wide", "E2M1", "E4M3", "E5M2"])
def test_cuda_equals_cpu(dtype, fmt):
    num_bits, unsigned, narrow, ebits = FORMATS[fmt]
    for i, (shape, block_size) in enumerate(CUDA_GEOMETRIES):
        x = varied_input(shape, dtype, "cpu", seed=i)
        x.view(-1)[::997] = math.nan
        for sa in (None, x.float().nan_to_num().abs().amax() / 4):
            yc, mc = ops.fake_quantize_blockwise(x, block_size, num_bits, unsigned, narrow, ebits, sa)
            yg, mg = ops.fake_quantize_blockwise(x.cuda(), block_size, num_bits, unsigned, narrow, ebits,
                                                 None if sa is None else sa.cuda())
            assert_same(yg.cpu(), yc)
            assert mg.shape == mc.shape and bits_equal(mg.cpu(), mc), (shape, block_size)


@cuda
def test_cuda_layouts_misaligned_and_offset_views():
    base = varied_input((4, 6, 5, 40), torch.float32, "cuda")
    for x in (base[..., 1:], base.reshape(-1)[3:3 + 33 * 64].view(33, 64), base.transpose(-1, -2),
              base.contiguous(memory_format=torch.channels_last)):
        for block_size in (16, 7, 32):
            yc, mc = ops.fake_quantize_blockwise(x.cpu(), block_size, 8, False, True, 0, None)
            yg, mg = ops.fake_quantize_blockwise(x, block_size, 8, False, True, 0, None)
            assert yg.stride() == yc.stride()
            assert_same(yg.cpu(), yc)
            assert bits_equal(mg.cpu(), mc)


@cuda
def test_cuda_invalid_scale_amax_gives_nan_with_checks_off():
    if os.environ.get("FAKEQUANT_CHECK_VALUES"):
        pytest.skip("value checks are switched on")
    x = torch.randn(8, 64, device="cuda")
    x[0] = 0.0  # a degenerate block is NaN too: the scale itself is invalid
    for bad in (-1.0, math.nan, math.inf):
        y, m = ops.fake_quantize_blockwise(x, 16, 4, False, True, 2, torch.tensor(bad, device="cuda"))
        assert bool(y.isnan().all()) and not bool(m.any()), bad


@cuda
def test_cuda_graph_capture_and_no_synchronisation():
    static_x = varied_input((64, 256), torch.float32, "cuda").requires_grad_()
    sa = torch.tensor(50.0, device="cuda")

    def step(x):
        y = fake_quantize_blockwise(x, 16, num_bits=4, exponent_bits=2, scale_amax=sa)  # aligned words
        y = fake_quantize_blockwise(y, 24)  # atomics
        (g,) = torch.autograd.grad((y * y).sum(), x)
        return y.detach(), g

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step(static_x)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step(static_x)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y, static_g = step(static_x)
    for seed in range(3):
        with torch.no_grad():
            static_x.copy_(varied_input((64, 256), torch.float32, "cuda", seed=seed + 10))
        sa.fill_(10.0 * (seed + 1))  # read on the device
        graph.replay()
        y, g = step(static_x)
        assert_same(static_y, y)
        assert_same(static_g, g)
