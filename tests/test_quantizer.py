"""TensorQuantizer: numerics, switches, calibration, learned amax, state_dict."""
import math

import pytest
import torch

from fakequant import calib, ops
from fakequant import nn as quant_nn
from fakequant.nn import TensorQuantizer, _input_amax
from fakequant.tensor_quant import QuantDescriptor

import reference
from conftest import DEVICES, DTYPES, bits_equal


def desc(**kwargs):
    return QuantDescriptor(**kwargs)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_static_per_tensor(device, dtype):
    q = TensorQuantizer(desc(num_bits=8, amax=2.0)).to(device)
    x = (torch.randn(3, 4, 5, device=device) * 2).to(dtype)
    ref, _ = reference.fake_quantize_amax(x, torch.tensor(2.0), 8, False, False)  # descriptor default: full range
    torch.testing.assert_close(q(x), ref, rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_static_per_channel_and_narrow_unsigned(device):
    amax = torch.tensor([0.5, 1.0, 3.0]).reshape(3, 1, 1)
    q = TensorQuantizer(desc(num_bits=4, axis=0, amax=amax, unsigned=True, narrow_range=True)).to(device)
    x = torch.rand(3, 2, 6, device=device) * 4
    ref, _ = reference.fake_quantize_amax(x, amax.to(device), 4, True, True)
    assert bits_equal(q(x), ref)


@pytest.mark.parametrize("device", DEVICES)
def test_dynamic_amax_per_tensor_and_axis(device):
    x = torch.randn(4, 6, device=device)
    q = TensorQuantizer(desc(num_bits=8)).to(device)
    assert q.amax is None
    ref, _ = reference.fake_quantize_amax(x, x.abs().max(), 8, False, False)
    assert bits_equal(q(x), ref)
    q1 = TensorQuantizer(desc(num_bits=8, axis=1))
    amax = x.abs().amax(dim=0, keepdim=True)
    assert bits_equal(q1(x), reference.fake_quantize_amax(x, amax, 8, False, False)[0])
    q2 = TensorQuantizer(desc(num_bits=8, axis=-1))  # negative axes name the same axis
    assert bits_equal(q2(x), q1(x))


def test_dynamic_descriptor_ignores_stored_amax():
    x = torch.randn(100) * 3
    q = TensorQuantizer(desc(amax=0.1, dynamic=True))
    assert bits_equal(q(x), reference.fake_quantize_amax(x, x.abs().max(), 8, False, False)[0])


def test_scale_amax():
    x = torch.randn(50)
    q = TensorQuantizer(desc(amax=2.0, scale_amax=0.5))
    assert bits_equal(q(x), reference.fake_quantize_amax(x, torch.tensor(1.0), 8, False, False)[0])


def test_gradient_clipped_ste():
    q = TensorQuantizer(desc(amax=1.0))
    x = torch.linspace(-2, 2, 41, requires_grad=True)
    q(x).sum().backward()
    assert bits_equal(x.grad, (x.detach().abs() <= 1.0).float())


def test_switches():
    x = torch.randn(20) * 3
    q = TensorQuantizer(desc(amax=1.0))
    quantized = q(x)
    q.disable()
    assert q(x) is x and q.extra_repr() == "disabled"
    q.enable()
    q.disable_quant()
    assert bits_equal(q(x), x)
    q.enable_quant()
    assert bits_equal(q(x), quantized)
    assert TensorQuantizer(desc(amax=1.0), disabled=True)(x) is x
    assert bits_equal(TensorQuantizer(desc(amax=1.0), if_quant=False)(x), x)


def test_calibration_stage_max():
    q = TensorQuantizer(desc(axis=0))
    q.enable_calib()
    q.disable_quant()
    a, b = torch.randn(3, 5), torch.randn(3, 5) * 4
    assert bits_equal(q(a), a)
    q(b)
    q.load_calib_amax()
    expected = torch.maximum(a.abs().amax(1, keepdim=True), b.abs().amax(1, keepdim=True))
    assert bits_equal(q.amax, expected) and q.amax.shape == (3, 1)
    q.disable_calib()
    q.enable_quant()
    assert bits_equal(q(a), reference.fake_quantize_amax(a, expected, 8, False, False)[0])
    q.load_calib_amax("max")  # the only method of a max calibrator
    with pytest.raises(TypeError, match="MaxCalibrator"):
        q.load_calib_amax("entropy")


def test_calibration_histogram_and_strict():
    q = TensorQuantizer(desc(calib_method="histogram"), if_calib=True, if_quant=False)
    assert isinstance(q._calibrator, calib.HistogramCalibrator)
    with pytest.raises(RuntimeError, match="strict=False"):
        q.load_calib_amax("percentile")
    with pytest.warns(UserWarning, match="not collected"):
        q.load_calib_amax("percentile", strict=False)
    assert q.amax is None  # still dynamic
    q(torch.randn(10000))
    q.load_calib_amax("percentile", percentile=99.0)
    assert 2.0 < q.amax.item() < 3.0 and q.amax.shape == ()


def test_amax_setter_and_step_size():
    q = TensorQuantizer(desc(num_bits=8))
    assert q.step_size is None
    q.amax = 2.54
    assert q.amax.dtype == torch.float32 and q.step_size.item() == pytest.approx(0.02)
    q.amax = torch.tensor(1.27)
    assert q.amax.item() == pytest.approx(1.27)
    with pytest.raises(ValueError, match="shape"):
        q.amax = [1.0, 2.0]
    q.amax = None
    assert q.amax is None and "_amax" not in q.state_dict()
    with pytest.raises(TypeError):
        q.amax = "a"


def test_num_bits_unsigned_narrow_setters_and_maxbound():
    q = TensorQuantizer(desc(num_bits=8, amax=1.0))
    assert q.maxbound == 127
    q.num_bits = 4
    q.unsigned = True
    assert q.maxbound == 15 and q._calibrator.num_bits == 4 and q._calibrator.unsigned
    q.narrow_range = True
    x = torch.rand(30)
    assert bits_equal(q(x), reference.fake_quantize_amax(x, torch.tensor(1.0), 4, True, True)[0])
    with pytest.raises(ValueError):
        q.num_bits = 40
    with pytest.raises(TypeError):
        q.unsigned = 1
    with pytest.raises(TypeError):
        q.narrow_range = None
    assert TensorQuantizer(desc(num_bits=(4, 3))).maxbound == 448.0


def test_real_quantization_and_scale():
    q = TensorQuantizer(desc(num_bits=8, amax=2.0, fake_quant=False, narrow_range=True))
    x = torch.randn(10)
    y = q(x)
    ref, _ = reference.quantize_amax(x, torch.tensor(2.0), 8, False, True)
    assert bits_equal(y, ref)
    assert q.scale.item() == pytest.approx(127 / 2.0)


def test_pre_quant_scale():
    q = TensorQuantizer(desc(amax=1.0))
    assert q.pre_quant_scale is None
    q.pre_quant_scale = torch.tensor([0.5, 2.0])
    x = torch.randn(3, 2)
    assert bits_equal(q(x), reference.fake_quantize_amax(x * torch.tensor([0.5, 2.0]), torch.tensor(1.0),
                                                         8, False, False)[0])
    assert "_pre_quant_scale" in q.state_dict() and "pre_quant_scale" in q.extra_repr()
    with pytest.raises(ValueError, match="shape"):
        q.pre_quant_scale = torch.ones(3)
    h = q(x.half())
    assert h.dtype == torch.float16


@pytest.mark.parametrize("method", ["pact", "lsq"])
def test_learned_amax_clip_gradients(method, monkeypatch):
    monkeypatch.setattr(TensorQuantizer, "learn_amax_method", method)
    q = TensorQuantizer(desc(num_bits=8, learn_amax=True, amax=1.0))
    assert q._if_clip and isinstance(q.clip, quant_nn.Clip)
    assert set(dict(q.named_parameters())) == {"clip.clip_value_min", "clip.clip_value_max"}
    x = torch.tensor([-2.0, -1.0, -0.3, 0.2, 1.0, 3.0], requires_grad=True)
    y = q(x)
    assert bits_equal(y, reference.fake_quantize_amax(x.detach().clamp(-1, 1), torch.tensor(1.0), 8, False,
                                                       False)[0])
    y.backward(torch.arange(1.0, 7.0))
    # PACT: the input gets the gradient strictly inside the range, each bound the sum where it clipped.
    assert bits_equal(x.grad, torch.tensor([0.0, 0.0, 3.0, 4.0, 0.0, 0.0]))
    assert q.clip.clip_value_min.grad.item() == 1.0 + 2.0
    lsq = 0.0
    if method == "lsq":
        # LSQ adds d(quantization error)/d(amax): g * sum(grad * (rint(x/s) - x/s)) / bound
        # over the values inside the range (after the clip), g = 1 / sqrt(numel * bound).
        xc = x.detach().double().clamp(-1, 1)
        s = torch.tensor(1.0, dtype=torch.float32).double() / 127
        inside = (xc / s).round().abs() <= 127
        lsq = float((torch.arange(1.0, 7.0, dtype=torch.float64) * ((xc / s).round() - xc / s))[inside].sum())
        lsq /= (6 * 127) ** 0.5 * 127
        assert lsq != 0.0
    assert q.clip.clip_value_max.grad.item() == pytest.approx(5.0 + 6.0 + lsq, rel=1e-6)
    q.disable_clip()
    assert not q.clip.clip_value_max.requires_grad
    q.enable_clip()
    assert q.clip.clip_value_max.requires_grad


def test_init_learn_amax():
    q = TensorQuantizer(desc(learn_amax=True))
    with pytest.raises(RuntimeError, match="amax"):
        q.init_learn_amax()
    q.amax = 3.0
    q.init_learn_amax()
    assert q.clip.clip_value_min.item() == -3.0 and q.clip.clip_value_max.item() == 3.0
    with pytest.raises(RuntimeError, match="learn_amax"):
        TensorQuantizer(desc(amax=1.0)).init_learn_amax()
    with pytest.raises(ValueError, match="learn_amax"):
        TensorQuantizer(desc(amax=1.0), if_clip=True)


def test_clip_module_fixed_bounds():
    clip = quant_nn.Clip(-1.0, torch.tensor([0.5, 2.0]))
    x = torch.tensor([[-3.0, 3.0], [0.7, 0.7]])
    assert bits_equal(clip(x), torch.tensor([[-1.0, 2.0], [0.5, 0.7]]))
    assert clip.state_dict() == {}
    with pytest.raises(ValueError, match="one value"):
        quant_nn.Clip(-1.0, torch.tensor([1.0, 2.0]), learn_max=True)


def test_block_quantization_static_and_dynamic():
    x = torch.randn(4, 8) * torch.arange(1.0, 9.0)
    dyn = TensorQuantizer(desc(num_bits=4, block_sizes={-1: 4, "type": "dynamic"}))
    blocks = x.reshape(4, 2, 4)
    amax = blocks.abs().amax(-1, keepdim=True)
    expected = reference.fake_quantize_amax(blocks, amax, 4, False, False)[0].reshape(4, 8)
    assert bits_equal(dyn(x), expected)
    static = TensorQuantizer(desc(num_bits=4, block_sizes={-1: 4}))
    static.enable_calib()
    static.disable_quant()
    static(x)
    static.load_calib_amax()
    assert static.amax.shape == (4, 2, 1)
    static.disable_calib()
    static.enable_quant()
    assert bits_equal(static(x), expected)
    assert bits_equal(static(x * 0.5), reference.fake_quantize_amax(blocks * 0.5, amax, 4, False, False)[0]
                       .reshape(4, 8))
    with pytest.raises(ValueError, match="divide"):
        static(torch.randn(4, 6))
    # dynamic blocks run in one kernel pass, the last block of a row may be shorter
    x6 = torch.randn(4, 6)
    assert bits_equal(dyn(x6), reference.fake_quantize_blockwise(x6, 4, 4, False, False)[0])
    per_row = TensorQuantizer(desc(block_sizes={-1: None, "type": "dynamic"}))  # per-token dynamic
    assert bits_equal(per_row(x), reference.fake_quantize_amax(x, x.abs().amax(-1, keepdim=True), 8, False,
                                                                 False)[0])


@pytest.mark.parametrize("fmt,dtype", [((4, 3), torch.float8_e4m3fn), ((5, 2), torch.float8_e5m2)])
def test_fp8_quantizer(fmt, dtype):
    q = TensorQuantizer(desc(num_bits=fmt, amax=1.0))
    x = torch.randn(64) * 2
    s = torch.tensor(1.0) / q.maxbound
    assert q.maxbound == {(4, 3): 448.0, (5, 2): 57344.0}[fmt]
    assert bits_equal(q(x), (x / s).clamp(-q.maxbound, q.maxbound).to(dtype).float() * s)


def test_extra_repr():
    q = TensorQuantizer(desc(num_bits=4, axis=0, amax=[[1.0], [2.0]], narrow_range=True, unsigned=True))
    r = q.extra_repr()
    assert "unsigned 4bit narrow fake axis=0 amax=[1.0000, 2.0000](2)" in r and "MaxCalibrator" in r
    assert "amax=dynamic" in TensorQuantizer().extra_repr()


def test_state_dict_round_trip():
    q = TensorQuantizer(desc(axis=0))
    q.enable_calib()
    q(torch.randn(5, 3))
    q.load_calib_amax()
    q.pre_quant_scale = torch.full((1, 3), 0.5)
    sd = q.state_dict()
    assert set(sd) == {"_amax", "_pre_quant_scale"}
    fresh = TensorQuantizer(desc(axis=0))
    fresh.load_state_dict(sd)
    assert bits_equal(fresh.amax, q.amax) and bits_equal(fresh.pre_quant_scale, q.pre_quant_scale)
    learned = TensorQuantizer(desc(learn_amax=True, amax=2.0))
    sd = learned.state_dict()
    assert set(sd) == {"_amax", "clip.clip_value_min", "clip.clip_value_max"}
    other = TensorQuantizer(desc(learn_amax=True))
    other.load_state_dict(sd)
    assert other.clip.clip_value_max.item() == 2.0 and other.amax.item() == 2.0


def test_state_dict_amax_shape_can_change():
    q = TensorQuantizer(desc(amax=1.0))
    q.load_state_dict({"_amax": torch.tensor([[1.0], [2.0]])})
    assert q.amax.shape == (2, 1)


def test_amax_stays_float32_under_dtype_casts():
    q = TensorQuantizer(desc(amax=0.1))
    for dtype in (torch.float16, torch.bfloat16, torch.float64):
        assert q.to(dtype).amax.dtype == torch.float32 and q.amax.item() == desc(amax=0.1).amax.item()
    x = torch.randn(10, dtype=torch.float64)
    assert bits_equal(q(x), reference.fake_quantize_amax(x, torch.tensor(0.1), 8, False, False)[0])
    m = torch.nn.Sequential(quant_nn.Linear(4, 4, quant_desc_input=desc(amax=0.1))).half()
    assert m[0].weight.dtype == torch.float16 and m[0].input_quantizer.amax.dtype == torch.float32


def test_flat_per_channel_amax_is_laid_along_axis():
    q = TensorQuantizer(desc(axis=0))
    q.amax = torch.tensor([1.0, 2.0, 4.0])
    x = torch.randn(3, 5) * 3
    assert bits_equal(q(x), reference.fake_quantize_amax(x, torch.tensor([1.0, 2.0, 4.0]).reshape(3, 1), 8,
                                                          False, False)[0])


def test_use_fb_fake_quant_matches_torch():
    q = TensorQuantizer(desc(axis=0, amax=[[1.0], [2.0]]))
    x = torch.randn(2, 7) * 2
    try:
        TensorQuantizer.use_fb_fake_quant = True
        y = q(x)
    finally:
        TensorQuantizer.use_fb_fake_quant = False
    expected = torch.fake_quantize_per_channel_affine(x, torch.tensor([1.0, 2.0]) / 127, torch.zeros(2, dtype=torch.int32),
                                                      0, -128, 127)
    assert bits_equal(y, expected)


def test_invalid_constructor_arguments():
    with pytest.raises(TypeError, match="quant_desc"):
        TensorQuantizer({"num_bits": 8})
    with pytest.raises(TypeError, match="disabled"):
        TensorQuantizer(desc(), disabled=1)
    with pytest.raises(NotImplementedError, match="scale_bits"):
        TensorQuantizer(desc(block_sizes={-1: 16, "scale_bits": (4, 3)}))


def test_compile_fullgraph_matches_eager():
    q = TensorQuantizer(desc(num_bits=8, axis=0, amax=[[1.0], [0.5], [2.0]]))
    x = torch.randn(3, 16, requires_grad=True)
    eager = q(x)
    eager.sum().backward()
    grad = x.grad.clone()
    x.grad = None
    compiled = torch.compile(q, fullgraph=True, backend="aot_eager")
    out = compiled(x)
    out.sum().backward()
    assert bits_equal(out, eager) and bits_equal(x.grad, grad)


def test_ops_and_quantizer_agree_on_default_range():
    # pytorch-quantization's descriptor defaults to narrow_range=False while its
    # fake_tensor_quant defaults to True: the quantizer follows the descriptor.
    x = torch.tensor([-1.5, -0.999, 1.0])
    assert TensorQuantizer(desc(amax=1.0))(x)[0].item() == pytest.approx(-128 / 127)
    assert ops.fake_quantize_amax(x, 1.0)[0].item() == -1.0
    assert math.isclose(TensorQuantizer(desc(amax=1.0, narrow_range=True))(x)[0].item(), -1.0)


def test_learned_amax_lsq_learns_a_range_that_pact_cannot(monkeypatch):
    """amax far too large for 4 bits: the quantization error's LSQ gradient pulls it in;
    PACT (clipped values only) has nothing clipped, so amax stays put."""
    x = torch.randn(4096, generator=torch.Generator().manual_seed(0))
    final = {}
    for method in ("pact", "lsq"):
        monkeypatch.setattr(TensorQuantizer, "learn_amax_method", method)
        q = TensorQuantizer(desc(num_bits=4, learn_amax=True, amax=12.0))
        opt = torch.optim.Adam(q.parameters(), lr=0.2)
        err0 = float(((q(x) - x).detach() ** 2).mean())
        for _ in range(60):
            opt.zero_grad()
            ((q(x) - x) ** 2).mean().backward()
            opt.step()
        final[method] = (q.clip.clip_value_max.item(), float(((q(x) - x).detach() ** 2).mean()), err0)
    assert final["pact"][0] == 12.0
    amax, err, err0 = final["lsq"]
    assert 2.0 < amax < 6.0 and err < err0 / 4, final


def test_nvfp4_and_fp8_block_quantizers():
    """NVFP4: E2M1 values in blocks of 16, E4M3 block scales under a per-tensor scale from
    the calibrated amax (or the input's, while uncalibrated); FP8 blocks likewise."""
    x = torch.randn(8, 40, generator=torch.Generator().manual_seed(1)) * 3
    nvfp4 = TensorQuantizer(desc(num_bits=(2, 1), block_sizes={-1: 16, "type": "dynamic", "scale_bits": (4, 3)}))
    assert nvfp4.maxbound == 6.0
    assert bits_equal(nvfp4(x), reference.fake_quantize_blockwise(x, 16, 4, False, True, 2, x.abs().amax())[0])
    nvfp4.amax = 5.0
    assert bits_equal(nvfp4(x), reference.fake_quantize_blockwise(x, 16, 4, False, True, 2, torch.tensor(5.0))[0])
    fp8 = TensorQuantizer(desc(num_bits=(4, 3), block_sizes={0: 4, "type": "dynamic"}))
    expected = reference.fake_quantize_blockwise(x.t(), 4, 8, False, True, 4)[0].t()
    assert bits_equal(fp8(x), expected)
    with pytest.raises(ValueError, match="scale_bits"):
        TensorQuantizer(desc(num_bits=4, block_sizes={-1: 16, "type": "dynamic", "scale_bits": 8}))
    with pytest.raises(ValueError, match="E2M1"):
        desc(num_bits=(2, 1))


@pytest.mark.parametrize("desc", [
    QuantDescriptor(),
    QuantDescriptor(amax=2.0),
    QuantDescriptor(axis=0, amax=[[1.0], [2.0], [3.0], [4.0]]),
    QuantDescriptor(block_sizes={-1: 4}),  # static blocks, dynamic amax
    QuantDescriptor(block_sizes={-1: 4, "type": "dynamic"}),
    QuantDescriptor(block_sizes={0: 2, -1: 4}),
    QuantDescriptor(num_bits=(4, 3), amax=3.0),
    QuantDescriptor(calib_method="histogram", axis=0),
    QuantDescriptor(learn_amax=True, amax=2.0),
], ids=repr)
def test_forward_changes_no_module_state(desc):
    """A forward (quantizing, calibrating or both) leaves the quantizer's buffers, its
    calibrator's configuration and its schemes as they were; only the calibrator's
    statistics grow."""
    q = TensorQuantizer(desc)
    x = torch.randn(4, 8)
    for calibrating in (False, True):
        if calibrating:
            q.enable_calib()
        buffers = dict(q._buffers)
        config = (q._path, q._values, q._num_bits, q._axis, q._calibrator._axis, q._calibrator._num_bits,
                  q._calibrator._unsigned)
        names = set(vars(q))
        q(x)
        q(x)
        assert {k: id(v) for k, v in q._buffers.items()} == {k: id(v) for k, v in buffers.items()}
        assert (q._path, q._values, q._num_bits, q._axis, q._calibrator._axis, q._calibrator._num_bits,
                q._calibrator._unsigned) == config
        assert set(vars(q)) == names
    if desc.block_sizes is not None and desc.block_sizes.get("type") != "dynamic":
        q.load_calib_amax()  # one amax per block, laid out as before
        blocked, inner = _input_amax.blocked_view(q.spec, x)
        assert q.amax.shape == blocked.abs().amax(tuple(inner), keepdim=True).shape


def test_real_quantization_writes_only_scale():
    q = TensorQuantizer(QuantDescriptor(amax=2.0, fake_quant=False))
    state = {k: v for k, v in vars(q).items() if k != "_scale"}
    outputs = q(torch.randn(10))
    assert torch.equal(q.scale, torch.tensor(127 / 2.0)) and outputs.dtype == torch.float32
    assert {k: v for k, v in vars(q).items() if k != "_scale"} == state


# --- a dynamic amax is computed, not given: NaN and inf propagate -------------------------


def _with_bad_value(device, bad):
    x = torch.randn(3, 8, device=device) * 2
    x[1, 2] = bad
    return x


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("kwargs", [dict(), dict(fake_quant=False), dict(num_bits=(4, 3)), dict(num_bits=(5, 2)),
                                    dict(amax=1.0, dynamic=True), dict(unsigned=True, narrow_range=True)])
def test_dynamic_amax_per_tensor_propagates_nan_and_inf(device, bad, kwargs):
    # The amax computed from an input holding NaN (inf) is NaN (inf): not user input, so it
    # is not checked; every output is NaN, as in pytorch-quantization 2.2.1, on every device
    # (the CPU used to raise ValueError, CUDA gave NaN) and whatever FAKEQUANT_CHECK_VALUES says.
    x = _with_bad_value(device, bad).requires_grad_()
    q = TensorQuantizer(desc(**kwargs)).to(device)
    y = q(x)
    assert y.shape == x.shape and bool(y.isnan().all())
    y.sum().backward()
    assert bits_equal(x.grad, torch.zeros_like(x))  # an invalid amax gives a zero mask


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_dynamic_amax_per_channel_propagates_nan_where_it_applies(device, bad):
    x = _with_bad_value(device, bad)
    q = TensorQuantizer(desc(axis=0)).to(device)
    y = q(x)
    assert bool(y[1].isnan().all())
    good = x[[0, 2]]
    expected, _ = reference.fake_quantize_amax(good, good.abs().amax(1, keepdim=True), 8, False, False)
    assert bits_equal(y[[0, 2]], expected)
    # static blocks with amax computed per block: the block holding the value only
    qb = TensorQuantizer(desc(block_sizes={-1: 4})).to(device)
    yb = qb(x)
    assert bool(yb[1, :4].isnan().all()) and not bool(yb[1, 4:].isnan().any()) and not bool(yb[[0, 2]].isnan().any())


@pytest.mark.parametrize("device", DEVICES)
def test_dynamic_nvfp4_scale_amax_propagates_nan(device):
    # the per-tensor amax under NVFP4's E4M3 block scales, computed from the input
    q = TensorQuantizer(desc(num_bits=(2, 1), block_sizes={-1: 16, "type": "dynamic", "scale_bits": (4, 3)}))
    x = torch.randn(2, 32, device=device)
    x[0, 3] = math.nan
    assert bool(q.to(device)(x).isnan().all())


def test_given_or_calibrated_amax_keeps_raising_on_nan():
    x = torch.randn(3, 8)
    for bad in (math.nan, math.inf, -1.0):
        q = TensorQuantizer(desc(amax=2.0))
        q.amax = torch.tensor(bad)  # the user's value
        with pytest.raises(ValueError, match="amax"):
            q(x)
        with pytest.raises(ValueError, match="amax"):
            QuantDescriptor(amax=bad)
        with pytest.raises(ValueError, match="amax"):
            ops.fake_quantize_amax(x, bad)
        with pytest.raises(ValueError, match="amax"):
            ops.fake_quantize_fp8(x, torch.tensor(bad))
    # an input holding NaN under a given amax: NaN where it is, as the contract says
    q = TensorQuantizer(desc(amax=2.0))
    y = q(_with_bad_value("cpu", math.nan))
    assert int(y.isnan().sum()) == 1


@pytest.mark.parametrize("device", DEVICES)
def test_ops_check_values_false_gives_nan_and_zero_mask(device):
    # check_values=False: the operators' own switch for an amax fakequant computed itself
    x = torch.randn(4, 5, device=device)
    for bad in (math.nan, math.inf, -1.0):
        amax = torch.tensor(bad, device=device)
        for y, m in (ops.fake_quantize_amax(x, amax, return_mask=True, check_values=False),
                     ops.quantize_amax(x, amax, return_mask=True, check_values=False)[::2],
                     ops.fake_quantize_fp8(x, amax, return_mask=True, check_values=False)):
            assert bool(y.isnan().all()) and not bool(m.any()), bad
        y, m = torch.ops.fakequant.fake_quantize_blockwise(x, 5, 4, False, True, 2, amax, False)
        assert bool(y.isnan().all()) and not bool(m.any()), bad
    with pytest.raises(TypeError, match="check_values"):
        ops.fake_quantize_amax(x, 1.0, check_values=0)


def test_calibrate_dynamic_blocks_with_a_ragged_last_block():
    # 72 = 2 blocks of 32 and a ragged one of 8: the forward takes it, and so must calibration.
    # Dynamic blocks collect the per-tensor amax, which NVFP4's E4M3 block scales are relative to.
    import fakequant

    x = torch.randn(5, 72) * 3
    int4 = QuantDescriptor(num_bits=4, block_sizes={-1: 32, "type": "dynamic"})
    lin = quant_nn.Linear(72, 4, quant_desc_input=int4, quant_desc_weight=QuantDescriptor(axis=0))
    before = lin.input_quantizer(x)
    fakequant.calibrate(lin, [x], progress=False)
    assert torch.equal(lin.input_quantizer(x), before)  # still dynamic: the same blocks
    nvfp4 = QuantDescriptor(num_bits=(2, 1), block_sizes={-1: 16, "type": "dynamic", "scale_bits": (4, 3)})
    lin = quant_nn.Linear(72, 4, quant_desc_input=nvfp4, quant_desc_weight=QuantDescriptor(axis=0))
    calib_batch = torch.randn(5, 72) * 5
    fakequant.calibrate(lin, [calib_batch], progress=False)
    amax = lin.input_quantizer.amax
    assert amax.numel() == 1 and torch.equal(amax.reshape(()), calib_batch.abs().max())
    expected = ops.fake_quantize_blockwise(x, 16, 4, False, True, 2, amax.reshape(()))
    assert torch.equal(lin.input_quantizer(x), expected)


def test_spec_and_pytorch_quantization_private_names():
    import dataclasses
    import pickle

    from fakequant.tensor_quant import QuantSpec

    q = TensorQuantizer(QuantDescriptor(num_bits=8, axis=0, calib_method="histogram"))
    assert q.spec == QuantSpec(num_bits=8, axis=0) and (q._num_bits, q._axis, q._unsigned) == (8, 0, False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        q.spec.num_bits = 4
    # the setters replace the spec, checked, and the calibrator follows
    q.num_bits, q.unsigned, q.narrow_range = 4, True, True
    assert q.spec == QuantSpec(num_bits=4, unsigned=True, narrow_range=True, axis=0)
    assert (q._calibrator.num_bits, q._calibrator.unsigned, q._calibrator.narrow_range) == (4, True, True)
    q._num_bits = 6  # (pytorch-quantization's private name: the same setter)
    assert q.num_bits == 6 and q._calibrator.num_bits == 6
    with pytest.raises(TypeError, match="narrow_range"):
        q.narrow_range = 1
    with pytest.raises(ValueError, match="num_bits"):
        q.num_bits = 1
    # pickled as the fields pytorch-quantization's quantizers pickle, no spec object
    state = q.__getstate__()
    assert "_spec" not in state and state["_num_bits"] == 6 and state["_axis"] == 0
    back = pickle.loads(pickle.dumps(q))
    assert back.spec == q.spec
    x = torch.randn(3, 5)
    assert bits_equal(back(x), q(x))
