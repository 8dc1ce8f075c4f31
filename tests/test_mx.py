"""The OCP microscaling (MX) formats and the FP6 element formats.

fake_quantize_blockwise(..., e8m0_scale=True) against the plain-PyTorch reference bit for
bit (MXFP8 E4M3/E5M2, MXFP6 E3M2/E2M3, MXFP4, MXINT8, every dtype and geometry); the
E8M0 scale rule on hand-worked blocks; FP6 rounding on every midpoint, on its own
(fake_quantize_fp8) and as block elements; the backward; errors; the descriptors
(Model Optimizer's spelling) and presets."""
import math

import pytest
import torch

import fakequant
import reference as ref
from conftest import DEVICES, DTYPES, assert_same, bits_equal
from fakequant.models import presets
from fakequant.nn import TensorQuantizer
from fakequant.ops import fake_quantize_blockwise, fake_quantize_fp8
from fakequant.tensor_quant import QuantDescriptor
from test_blockwise import GEOMETRIES, check, varied_input

ops = torch.ops.fakequant

# name -> (num_bits, exponent_bits, narrow_range)
MX_FORMATS = {
    "MXFP8-E4M3": (8, 4, True),
    "MXFP8-E5M2": (8, 5, True),
    "MXFP6-E3M2": (6, 3, True),
    "MXFP6-E2M3": (6, 2, True),
    "MXFP4": (4, 2, True),
    "MXINT8": (8, 0, False),
    "MXINT8-narrow": (8, 0, True),
    "MXINT4": (4, 0, True),
}
FP6 = [(3, 2), (2, 3)]


def mx(x, fmt, block_size=32):
    num_bits, ebits, narrow = fmt
    return ops.fake_quantize_blockwise(x, block_size, num_bits, False, narrow, ebits, None, True, True)


def check_mx(x, fmt, block_size=32):
    num_bits, ebits, narrow = fmt
    return check(x, block_size, (num_bits, False, narrow, ebits), e8m0_scale=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", MX_FORMATS.values(), ids=MX_FORMATS.keys())
def test_mx_matches_reference(device, dtype, fmt):
    for i, (shape, block_size) in enumerate(GEOMETRIES):
        check_mx(varied_input(shape, dtype, device, seed=i), fmt, block_size)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", MX_FORMATS.values(), ids=MX_FORMATS.keys())
def test_mx_special_blocks(device, fmt):
    # zero, tiny (far below 2^-24: kept, unlike the one-level blocks), subnormal,
    # NaN, inf, huge, and mixed blocks
    tiny = torch.finfo(torch.float32).tiny
    rows = [
        torch.zeros(32), -torch.zeros(32), torch.randn(32) * 1e-30, torch.randn(32) * tiny / 64,
        torch.randn(32).index_fill(0, torch.tensor([3]), float("nan")),
        torch.randn(32).index_fill(0, torch.tensor([5]), float("inf")),
        torch.randn(32) * 3e38, torch.linspace(-8, 8, 32), torch.linspace(-7.99, 7.99, 32),
    ]
    x = torch.stack(rows).to(device)
    y, _ = check_mx(x, fmt)
    assert y[0].eq(0).all() and y[1].eq(0).all()
    assert y[4].isnan().all() and y[5].isnan().all()  # the block's scale is E8M0's NaN
    if fmt[1] != 0 or fmt[0] == 8:
        assert (y[2] != 0).any()  # a tiny block keeps its values (no 2^-24 cut-off)


@pytest.mark.parametrize("device", DEVICES)
def test_e8m0_scale_rule_by_hand(device):
    # MXFP4 (E2M1, emax 2): amax 7.9 has floor(log2) = 2, so the scale is 2^0 = 1 and 7.9
    # saturates to 6 (its mask bit 0); amax 8 gives the scale 2 and 8 is exactly 4 * 2.
    x = torch.tensor([[7.9] + [0.3] * 31, [8.0] + [0.3] * 31], device=device)
    y, mask = mx(x, MX_FORMATS["MXFP4"])
    m = fakequant.unpack_mask(mask, y)
    assert y[0, 0].item() == 6.0 and not m[0, 0] and y[0, 1].item() == 0.5  # 0.3 / 1 -> 0.5
    assert y[1, 0].item() == 8.0 and m[1, 0] and y[1, 1].item() == 0.0  # 0.3 / 2 = 0.15 -> 0
    # MXINT8: integers of 2^-6 times the scale 2^floor(log2 amax); amax 1.5 -> scale 2^-6
    x = torch.tensor([[1.5, 1.0, 0.01, -1.99] + [0.0] * 28], device=device)
    y, _ = mx(x, MX_FORMATS["MXINT8"])
    assert y[0, :4].tolist() == [1.5, 1.0, 0.015625, -1.984375]
    # MXFP8 E4M3 (emax 8): amax 1000 -> 2^(9 - 8) = 2; 1000 / 2 = 500 saturates to 448
    x = torch.tensor([[1000.0, 3.0] + [0.0] * 30], device=device)
    y, _ = mx(x, MX_FORMATS["MXFP8-E4M3"])
    assert y[0, :2].tolist() == [896.0, 3.0]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", MX_FORMATS.values(), ids=MX_FORMATS.keys())
def test_mx_scales_are_powers_of_two(device, fmt):
    x = varied_input((64, 128), torch.float32, device)
    y, _ = mx(x, fmt)
    # every output divided by its block's power-of-two scale is a value of the element format
    s = ref.e8m0_scale_of(x.reshape(64, 4, 32).abs().amax(-1, keepdim=True), ref.mx_emax(fmt[0], fmt[1]))
    mant, _ = torch.frexp(s)
    assert bool((mant == 0.5).all())
    q = (y.reshape(64, 4, 32) / s).double()
    if fmt[1] == 0:
        assert bool((q == q.round()).all()) and q.abs().max() <= 2 ** (fmt[0] - 1)
    else:
        values = torch.tensor(ref.format_values(fmt[1], fmt[0] - 1 - fmt[1]) if fmt[1] in (2, 3)
                              else [float(v) for v in torch.arange(256, dtype=torch.int32).to(torch.uint8).view(
                                  torch.float8_e4m3fn if fmt[1] == 4 else torch.float8_e5m2).float()
                                  if math.isfinite(v)], dtype=torch.float64, device=device)
        assert bool(torch.isin(q.abs(), values).all())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_mx_backward_is_the_mask(device, dtype):
    x = varied_input((16, 96), dtype, device).requires_grad_()
    y = fake_quantize_blockwise(x, 32, 4, exponent_bits=2, e8m0_scale=True)
    (g,) = torch.autograd.grad(y, x, torch.ones_like(y))
    _, mask = ref.fake_quantize_blockwise(x.detach(), 32, 4, False, True, 2, None, e8m0_scale=True)
    assert bits_equal(g, mask.to(dtype))
    assert not mask.all()  # the floor rule saturates some block maxima


@pytest.mark.parametrize("device", DEVICES)
def test_mx_gradcheck(device):
    # E8M0 scales are locally constant away from powers of two: every block's amax is 1.5
    # (scale exponent floor(log2 1.5) - 14 for 16-bit integers), and 16-bit steps (2^-14)
    # are far below eps, so central differences see slope 1 where the mask is set.
    g = torch.Generator().manual_seed(0)
    x = (torch.rand(4, 64, generator=g, dtype=torch.float64) - 0.5) * 2.4
    x[:, 0], x[:, 32] = 1.5, -1.5
    fn = lambda t: fake_quantize_blockwise(t, 32, 16, e8m0_scale=True)  # noqa: E731
    for t in (x, x.t().contiguous().t()):  # contiguous and another layout
        t = t.to(device).requires_grad_()
        assert torch.autograd.gradcheck(fn, (t,), eps=5e-3, atol=1e-2)
        assert torch.autograd.gradgradcheck(fn, (t,), eps=5e-3, atol=1e-2)


def test_mx_opcheck():
    x = torch.randn(4, 64)
    torch.library.opcheck(ops.fake_quantize_blockwise.default, (x, 32, 4, False, True, 2, None, True, True))
    torch.library.opcheck(ops.fake_quantize_blockwise.default, (x.double().requires_grad_(), 32, 8, False, False,
                                                                0, None, True, True))


def test_mx_errors():
    x = torch.randn(4, 32)
    with pytest.raises(ValueError, match="cannot be combined with e8m0_scale"):
        fake_quantize_blockwise(x, 32, 4, exponent_bits=2, scale_amax=1.0, e8m0_scale=True)
    with pytest.raises(ValueError, match="unsigned must be False with e8m0_scale"):
        fake_quantize_blockwise(x, 32, 8, unsigned=True, e8m0_scale=True)
    with pytest.raises(TypeError, match="e8m0_scale"):
        fake_quantize_blockwise(x, 32, 8, e8m0_scale=1)
    with pytest.raises(ValueError, match=r"\(6, 3\) for E3M2"):
        fake_quantize_blockwise(x, 32, 6, exponent_bits=4)
    # the C++ checks say the same
    with pytest.raises(ValueError, match="cannot be combined with e8m0_scale"):
        ops.fake_quantize_blockwise(x, 32, 4, False, True, 2, torch.tensor(1.0), True, True)
    with pytest.raises(ValueError, match=r"\(6, 3\) for E3M2"):
        ops.fake_quantize_blockwise(x, 32, 6, False, True, 4, None, True, False)


# --- FP6 ---------------------------------------------------------------------------------


def test_reference_fp6_grids():
    # E3M2: bias 3, max 28, smallest subnormal 1/16; E2M3: bias 1, max 7.5, subnormal 1/8
    e3m2, e2m3 = ref.format_values(3, 2), ref.format_values(2, 3)
    assert len(e3m2) == len(e2m3) == 32
    assert (e3m2[1], e3m2[4], e3m2[-1]) == (0.0625, 0.25, 28.0)
    assert (e2m3[1], e2m3[8], e2m3[-1]) == (0.125, 1.0, 7.5)
    assert fakequant._core.FLOAT_FORMATS[(3, 2)] == (28.0, 4) and fakequant._core.FLOAT_FORMATS[(2, 3)] == (7.5, 2)


def _midpoints(values):
    vals = torch.tensor(values, dtype=torch.float32)
    mids = (vals[1:] + vals[:-1]) / 2
    v = torch.cat([vals, mids, mids.nextafter(torch.tensor(0.0)), mids.nextafter(torch.tensor(1e9)),
                   torch.tensor([vals[-1] * 1.2, 1e30, 0.0])])
    return torch.cat([v, -v])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", FP6)
def test_fp6_rounds_every_midpoint(device, fmt):
    v = _midpoints(ref.format_values(*fmt)).to(device)
    fmax = ref.format_max(*fmt)
    # on its own: amax = max, so the scale is 1
    y, mask = ops.fake_quantize_fp8(v, torch.tensor(fmax, device=device), *fmt)
    expected = ref.round_to_format(v, *fmt)
    assert_same(y, expected)
    # ties to the even code, written out: halfway between codes 2k and 2k + 1 goes to 2k
    vals = ref.format_values(*fmt)
    for k in range(0, len(vals) - 1):
        tie = torch.tensor([(vals[k] + vals[k + 1]) / 2], device=device)
        got = ops.fake_quantize_fp8(tie, torch.tensor(fmax, device=device), *fmt)[0].item()
        assert got == vals[k if k % 2 == 0 else k + 1]
    # as block elements: one block whose amax is the max (scale 1)
    vb = v[v.abs() <= fmax]
    yb, _ = ops.fake_quantize_blockwise(vb.reshape(1, -1), vb.numel(), 1 + sum(fmt), False, True, fmt[0], None)
    assert_same(yb.reshape(-1), ref.round_to_format(vb, *fmt))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", FP6)
def test_fp6_on_its_own_matches_reference(device, dtype, fmt):
    x = varied_input((8, 3, 40), dtype, device)
    for amax in [x.float().abs().amax(), x.float().abs().amax((1, 2), keepdim=True), torch.tensor(0.0),
                 x.float().abs().amax() / 10]:
        y, packed = ops.fake_quantize_fp8(x, amax.to(device), *fmt)
        ey, emask = ref.fake_quantize_fp8(x, amax.to(device), *fmt)
        assert_same(y, ey)
        assert bits_equal(fakequant.unpack_mask(packed, y), emask.expand_as(y))
    xt = x.transpose(0, 2)  # another layout
    assert_same(fake_quantize_fp8(xt, 2.0, *fmt), ref.fake_quantize_fp8(xt, 2.0, *fmt)[0])


def test_fp6_errors():
    with pytest.raises(ValueError, match=r"\(3, 2\) for FP6 E3M2"):
        fake_quantize_fp8(torch.randn(4), 1.0, 3, 3)
    with pytest.raises(ValueError, match=r"\(3, 2\) for FP6 E3M2"):
        ops.fake_quantize_fp8(torch.randn(4), torch.tensor(1.0), 2, 1)  # E2M1 only in blocks


# --- descriptors and presets -------------------------------------------------------------


@pytest.mark.parametrize("num_bits", [(4, 3), (5, 2), (3, 2), (2, 3), (2, 1), 8])
def test_mx_descriptor_uses_the_kernel(num_bits):
    # Model Optimizer's spelling of the MX formats
    desc = QuantDescriptor(num_bits=num_bits, block_sizes={-1: 32, "type": "dynamic", "scale_bits": (8, 0)})
    q = TensorQuantizer(desc)
    x = varied_input((6, 64), torch.float32, "cpu")
    ebits, nb = (0, num_bits) if isinstance(num_bits, int) else (num_bits[0], 1 + sum(num_bits))
    assert_same(q(x), ref.fake_quantize_blockwise(x, 32, nb, False, False, ebits, None, e8m0_scale=True)[0])
    assert type(q._path).__name__ == "_DynamicBlocks"


def test_fp6_descriptor_per_tensor():
    q = TensorQuantizer(QuantDescriptor(num_bits=(3, 2), amax=4.0))
    x = torch.randn(5, 7)
    assert_same(q(x), ref.fake_quantize_fp8(x, torch.tensor(4.0), 3, 2)[0])


def test_scale_bits_errors():
    with pytest.raises(ValueError, match=r"scale_bits'\] must be \(4, 3\)"):
        TensorQuantizer(QuantDescriptor(num_bits=(4, 3), block_sizes={-1: 32, "type": "dynamic",
                                                                      "scale_bits": (5, 2)}))


@pytest.mark.parametrize("name", ["MXFP8", "MXFP4"])
def test_mx_presets_convert_and_train(name):
    torch.manual_seed(0)
    model = fakequant.quantize_model(torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.GELU(),
                                                         torch.nn.Linear(32, 8)), preset=name)
    x = torch.randn(5, 64)
    fakequant.calibrate(model, [x])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    w0 = model[0].weight.detach().clone()
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    assert torch.isfinite(loss) and not torch.equal(w0, model[0].weight)
    inp, wt = presets.get(name).descriptors()
    assert wt.block_sizes["scale_bits"] == (8, 0)
