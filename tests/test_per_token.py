"""Per-token (per-row) dynamic quantization, spelled as Model Optimizer spells it
(``type="dynamic", block_sizes={-1: None}``), and the named presets."""
import pytest
import torch

import fakequant
from fakequant.models import presets
from fakequant.nn import TensorQuantizer
from fakequant.tensor_quant import QuantDescriptor

from conftest import DEVICES, assert_same


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_bits", [8, 4, (4, 3), (5, 2)])
@pytest.mark.parametrize("shape", [(3, 5, 40), (7, 33), (1, 1)])
def test_per_token_matches_row_amax_reference(device, num_bits, shape):
    torch.manual_seed(0)
    x = torch.randn(shape, device=device) * torch.logspace(-3, 3, shape[-2] if len(shape) > 1 else 1,
                                                           device=device).reshape(-1, 1)
    q = TensorQuantizer(QuantDescriptor(num_bits=num_bits, type="dynamic", block_sizes={-1: None})).to(device)
    y = q(x)
    amax = x.abs().amax(-1, keepdim=True)
    if isinstance(num_bits, tuple):
        ref = fakequant.fake_quantize_fp8(x, amax, *num_bits)
    else:
        ref = fakequant.fake_quantize_amax(x, amax, num_bits, False, False)
    assert_same(y, ref)
    # the one-pass kernel, not a reduction plus a broadcast quantize
    assert type(q._path).__name__ == "_DynamicBlocks"


def test_per_token_gradient_is_one_where_not_saturated():
    x = torch.randn(6, 24, dtype=torch.float64, requires_grad=True)
    q = TensorQuantizer(QuantDescriptor(num_bits=8, block_sizes={-1: None, "type": "dynamic"}))
    q(x).sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))


def test_type_keyword_is_dynamic_and_checked():
    assert QuantDescriptor(type="dynamic").dynamic
    assert not QuantDescriptor(type="static").dynamic
    with pytest.raises(ValueError, match="type must be"):
        QuantDescriptor(type="per_token")
    with pytest.raises(ValueError, match="contradicts"):
        QuantDescriptor(type="static", dynamic=True)


def test_preset_names_and_errors():
    assert presets.get("w8a8") is presets.PRESETS["W8A8"]
    with pytest.raises(ValueError, match="preset must be one of"):
        presets.get("W3A3")
    with pytest.raises(TypeError, match="preset must be"):
        presets.get(8)
    model = torch.nn.Sequential(torch.nn.Linear(16, 4))
    with pytest.raises(ValueError, match="cannot be combined"):
        fakequant.quantize_model(model, quant_desc_input=QuantDescriptor(), preset="W8A8")


@pytest.mark.parametrize("name", ["W8A8", "W8A8_ASYM", "W4A8", "INT8", "FP8", "FP8_PER_CHANNEL", "NVFP4"])
def test_presets_convert_and_run(name):
    torch.manual_seed(0)
    model = fakequant.quantize_model(torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(),
                                                         torch.nn.Linear(32, 8)), preset=name)
    inp, wt = presets.get(name).descriptors()
    assert model[0].input_quantizer._num_bits == inp.num_bits
    assert model[0].weight_quantizer._num_bits == wt.num_bits
    x = torch.randn(5, 64)
    fakequant.calibrate(model, [x])
    out = model(x)
    out.sum().backward()
    assert torch.isfinite(out).all() and model[0].weight.grad is not None


# --- asymmetric: blocks quantized about their centre (Model Optimizer's "max_min" bias) ---

import reference as ref  # noqa: E402
from conftest import DTYPES, bits_equal  # noqa: E402
from test_blockwise import GEOMETRIES, check, varied_input  # noqa: E402

ops = torch.ops.fakequant
ASYM = {"type": "dynamic", "block_sizes": {-1: None}, "bias": {-1: None, "type": "dynamic", "method": "max_min"}}
# (num_bits, unsigned, narrow_range, exponent_bits, e8m0_scale)
CENTERED_FORMATS = {"int8": (8, False, False, 0, False), "int4": (4, False, True, 0, False),
                    "E4M3": (8, False, True, 4, False), "E2M1": (4, False, True, 2, False),
                    "MXINT8": (8, False, False, 0, True)}


def centered(x, block_size, fmt):
    num_bits, unsigned, narrow, ebits, e8m0 = fmt
    return check(x, block_size, (num_bits, unsigned, narrow, ebits), e8m0_scale=e8m0, centered=True)[0]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", CENTERED_FORMATS.values(), ids=CENTERED_FORMATS.keys())
def test_centered_blocks_match_reference(device, dtype, fmt):
    for i, (shape, block_size) in enumerate(GEOMETRIES):
        x = varied_input(shape, dtype, device, seed=i) + (3.0 if i % 2 else -1.0)  # off-centre rows
        centered(x, block_size, fmt)
        centered(x, shape[-1], fmt)  # per token


@pytest.mark.parametrize("device", DEVICES)
def test_centered_special_rows(device):
    rows = [torch.full((16,), 5.0), torch.zeros(16), -torch.zeros(16), torch.linspace(1, 10, 16),
            torch.randn(16).index_fill(0, torch.tensor([2]), float("nan")),
            torch.randn(16).index_fill(0, torch.tensor([2]), -float("inf")),
            torch.cat([torch.zeros(8), -torch.zeros(8)]), torch.full((16,), 1e-30)]
    x = torch.stack(rows).to(device)
    for fmt in CENTERED_FORMATS.values():
        y = centered(x, 16, fmt)
        assert bits_equal(y[0], x[0])  # a constant row is its own centre
        assert y[4].isnan().all() and y[5].isnan().all()
    # infinities at one end or both, with one and two scale levels (hypothesis found the
    # first: -inf with a large finite max gives the centre -inf and the amax NaN)
    inf = float("inf")
    ends = torch.tensor([[-inf, -8.0e-8, 6.0e4], [inf, 1.0, -2.0], [-inf, 0.5, inf], [inf, inf, 3.0]]).to(device)
    for fmt in CENTERED_FORMATS.values():
        num_bits, unsigned, narrow, ebits, e8m0 = fmt
        for sa in [None] if e8m0 else [None, torch.tensor(1.0, device=device)]:
            y = check(ends, 3, (num_bits, unsigned, narrow, ebits), sa, e8m0, True)[0]
            assert y.isnan().all()
    # by hand: [1 .. 10] int8 (narrow): centre 5.5, amax 4.5, scale 4.5 / 127
    y = fakequant.fake_quantize_blockwise(x[3:4], 16, 8, centered=True)
    s = torch.tensor(4.5) / 127
    expected = torch.round((x[3:4].cpu() - 5.5) / s) * s + 5.5
    assert bits_equal(y.cpu(), expected)
    assert (y - x[3:4]).abs().max() <= s / 2 + 1e-6


def test_centered_gradient_and_gradcheck():
    x = (torch.randn(3, 40, dtype=torch.float64) * 2 + 4).requires_grad_()
    y = fakequant.fake_quantize_blockwise(x, 40, 8, centered=True)
    (g,) = torch.autograd.grad(y.sum(), x)
    _, mask = ref.fake_quantize_blockwise(x.detach(), 40, 8, False, True, 0, None, False, True)
    assert bits_equal(g, mask.double())
    # gradcheck with locally constant centres and scales: each row's extremes are pinned at
    # 4 and 6 (centre 5, amax 1) by constant columns, the checked elements lie in [4.2, 5.8]
    # (eps far from the extremes), and 16-bit steps (3e-5) are far below eps
    z = (torch.rand(4, 30, dtype=torch.float64) * 1.6 + 4.2)
    ends = torch.tensor([[4.0, 6.0]], dtype=torch.float64).expand(4, 2)
    fn = lambda t: fakequant.fake_quantize_blockwise(torch.cat([ends, t], 1), 32, 16, centered=True)[:, 2:]  # noqa: E731
    for t in (z, z.t().contiguous().t()):
        t = t.clone().requires_grad_()
        assert torch.autograd.gradcheck(fn, (t,), eps=5e-3, atol=1e-2)
        assert torch.autograd.gradgradcheck(fn, (t,), eps=5e-3, atol=1e-2)
    torch.library.opcheck(ops.fake_quantize_blockwise.default,
                          (torch.cat([ends, z], 1).requires_grad_(), 32, 8, False, True, 0, None, True, False, True))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_bits", [8, (4, 3)])
def test_per_token_asymmetric_descriptor(device, num_bits):
    # Model Optimizer's spelling: per-token dynamic blocks and a dynamic max_min bias
    q = TensorQuantizer(QuantDescriptor(num_bits=num_bits, **ASYM)).to(device)
    x = varied_input((4, 6, 48), torch.float32, device) + 2.0
    nb, eb = (num_bits, 0) if isinstance(num_bits, int) else (8, 4)
    expected = ref.fake_quantize_blockwise(x, 48, nb, False, False, eb, None, False, True)[0]
    assert_same(q(x), expected)
    if num_bits == 8:  # int8: asymmetric beats symmetric on off-centre rows (about 2.4x less error here;
        # FP8 about a far-off centre loses its fine steps near zero, so it is the user's call)
        sym = TensorQuantizer(QuantDescriptor(num_bits=num_bits, type="dynamic", block_sizes={-1: None})).to(device)
        assert (q(x) - x).square().mean() < (sym(x) - x).square().mean()
    desc = QuantDescriptor(num_bits=num_bits, **ASYM)
    assert QuantDescriptor(**desc.dict()) == desc and "bias" in str(desc)


def test_bias_errors():
    with pytest.raises(ValueError, match="bias\\['method'\\]"):
        QuantDescriptor(bias={-1: None, "method": "median"})
    with pytest.raises(ValueError, match="at least one axis"):
        QuantDescriptor(bias={"type": "dynamic"})
    with pytest.raises(TypeError, match="bias must be a dict"):
        QuantDescriptor(bias=1)
    with pytest.raises(NotImplementedError, match="max_min"):
        TensorQuantizer(QuantDescriptor(num_bits=8, bias={-1: None, "type": "static"}))
    with pytest.raises(NotImplementedError, match="max_min"):
        TensorQuantizer(QuantDescriptor(num_bits=8, type="dynamic", block_sizes={-1: None},
                                        bias={0: None, "type": "dynamic", "method": "max_min"}))
    with pytest.raises(TypeError, match="centered"):
        fakequant.fake_quantize_blockwise(torch.randn(4, 8), 8, centered="yes")
