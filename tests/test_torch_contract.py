"""What code written for torch relies on beyond the numbers of the usual cases: float zero
points with fractions (torch.ao's float-qparams QAT of embeddings), the exception type of a
bad argument (RuntimeError, as torch raises), and torch.jit.script of fakequant.ao's modules.
"""
import copy
import warnings

import pytest
import torch
import torch.ao.quantization as tq

import fakequant
import fakequant.ao
from conftest import DEVICES, bits_equal, ort_session

CACHEMASK = torch.ops.aten.fake_quantize_per_channel_affine_cachemask
QAT_EMBEDDINGS = {torch.nn.Embedding: torch.ao.nn.qat.Embedding, torch.nn.EmbeddingBag: torch.ao.nn.qat.EmbeddingBag}


class Embeddings(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(20, 12)
        self.bag = torch.nn.EmbeddingBag(20, 12, mode="sum")

    def forward(self, ids):
        return self.emb(ids).sum(1) + self.bag(ids)


def _prepared(qconfig, base):
    model = copy.deepcopy(base)
    model.emb.qconfig = model.bag.qconfig = qconfig
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        tq.prepare_qat(model, mapping=QAT_EMBEDDINGS, inplace=True)
    return model


@pytest.mark.parametrize("qconfig_name", ["default_embedding_qat_qconfig", "default_embedding_qat_qconfig_4bit"])
def test_embedding_qat_with_float_qparams_matches_torch_bit_for_bit(qconfig_name):
    qconfig = getattr(tq, qconfig_name)
    torch.manual_seed(0)
    base = Embeddings()
    ref, ours = _prepared(qconfig, base), _prepared(fakequant.ao.use_fakequant(qconfig), base)
    assert isinstance(ours.emb.weight_fake_quant, fakequant.ao.FakeQuantize)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (ref, ours)]
    g = torch.Generator().manual_seed(1)
    for _ in range(4):
        ids = torch.randint(0, 20, (8, 4), generator=g)
        outputs = []
        for model, optimizer in zip((ref, ours), optimizers):
            optimizer.zero_grad()
            y = model(ids)
            y.square().mean().backward()
            outputs.append(y)
        assert bits_equal(outputs[1], outputs[0])
        for name in ("emb", "bag"):
            assert bits_equal(getattr(ours, name).weight.grad, getattr(ref, name).weight.grad)
        for optimizer in optimizers:
            optimizer.step()
    zero_point = ours.emb.weight_fake_quant.zero_point
    assert zero_point.is_floating_point() and bool((zero_point != zero_point.round()).any())  # fractions


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_fractional_zero_points_per_channel_follow_torch(device, dtype):
    g = torch.Generator().manual_seed(2)
    x = (torch.randn(5, 6, 7, generator=g) * 3).to(device, dtype)
    scale = (torch.rand(6, generator=g) * 0.05 + 0.01).to(device)
    zero_point = (torch.rand(6, generator=g) * 200).to(device)  # fractional
    expected = torch.fake_quantize_per_channel_affine(x, scale, zero_point, 1, 0, 255)
    got = fakequant.fake_quantize_per_channel_affine(x, scale, zero_point, 1, 0, 255)
    assert bits_equal(got, expected)
    y, mask = fakequant.fake_quantize_per_channel_affine_cachemask(x.float(), scale, zero_point, 1, 0, 255)
    y_ref, mask_ref = CACHEMASK(x.float(), scale, zero_point, 1, 0, 255)
    assert bits_equal(y, y_ref) and torch.equal(mask, mask_ref)
    # the gradient passes where the mask is set
    leaf = x.float().clone().requires_grad_()
    fakequant.fake_quantize_per_channel_affine(leaf, scale, zero_point, 1, 0, 255).sum().backward()
    assert torch.equal(leaf.grad, mask.float())


def test_fractional_zero_points_keep_nan_and_clamp_infinities():
    x = torch.tensor([[float("nan"), float("inf"), -float("inf"), -1e-9]])
    got, mask = fakequant.fake_quantize_per_channel_affine_cachemask(x, torch.tensor([0.1]), torch.tensor([3.3]), 0,
                                                                      0, 255)
    y_ref, mask_ref = CACHEMASK(x, torch.tensor([0.1]), torch.tensor([3.3]), 0, 0, 255)
    assert got[0, 0].isnan() and not mask[0, 0]
    # +-inf clamp to the ends of the range (the contract; torch's CPU kernel converts
    # rint(inf) to int64, which lands at the low end for +inf), with mask 0
    s, z = torch.tensor(0.1), torch.tensor(3.3)
    assert bits_equal(got[0, 1:3], torch.stack([(255 - z) * s, (0 - z) * s])) and not mask[0, 1:3].any()
    assert bits_equal(got[:, 3:], y_ref[:, 3:]) and torch.equal(mask[:, 3:], mask_ref[:, 3:])


@pytest.mark.parametrize("dynamo", [True, False])
def test_fractional_zero_points_export_exactly(tmp_path, dynamo):
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    torch.manual_seed(0)
    model = _prepared(fakequant.ao.use_fakequant(tq.default_embedding_qat_qconfig), Embeddings())
    ids = torch.randint(0, 20, (8, 4))
    model(ids)
    model.apply(tq.disable_observer).eval()
    path = tmp_path / "m.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (ids,), str(path), dynamo=dynamo, opset_version=17, input_names=["ids"])
    onnx.checker.check_model(onnx.load(str(path)), full_check=True)
    # the default session: embeddings (Gather), nothing for its int8 kernels (conftest.ort_session)
    session = ort_session(path, "default")
    with torch.no_grad():
        expected = model(ids)
    # the quantized weights are exact; the embedding-bag sum may add in another order
    got = torch.from_numpy(session.run(None, {"ids": ids.numpy()})[0])
    assert torch.allclose(got, expected, rtol=0, atol=1e-5)
    emb_only = torch.nn.Sequential(model.emb).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(emb_only, (ids,), str(path), dynamo=dynamo, opset_version=17, input_names=["ids"])
    session = ort_session(path, "default")
    with torch.no_grad():
        assert bits_equal(session.run(None, {"ids": ids.numpy()})[0], emb_only(ids))


X = torch.randn(4, 3)
BAD_CALLS = {  # name: (fakequant's call, torch's call): the same bad argument
    "zero point out of range": (lambda: fakequant.fake_quantize_per_tensor_affine(X, 0.1, 300, 0, 255),
                                lambda: torch.fake_quantize_per_tensor_affine(X, 0.1, 300, 0, 255)),
    "quant_min > quant_max": (lambda: fakequant.fake_quantize_per_tensor_affine(X, 0.1, 3, 5, 2),
                              lambda: torch.fake_quantize_per_tensor_affine(X, 0.1, 3, 5, 2)),
    "per-channel scale size": (lambda: fakequant.fake_quantize_per_channel_affine(
        X, torch.ones(2), torch.zeros(2, dtype=torch.int32), 1, 0, 255), lambda: torch.fake_quantize_per_channel_affine(
        X, torch.ones(2), torch.zeros(2, dtype=torch.int32), 1, 0, 255)),
    "integer input": (lambda: fakequant.fake_quantize_per_tensor_affine_cachemask(X.int(), 0.1, 3, 0, 255),
                      lambda: torch.ops.aten.fake_quantize_per_tensor_affine_cachemask(X.int(), 0.1, 3, 0, 255)),
    "learnable, quant_min > quant_max": (
        lambda: fakequant.ops._fake_quantize_learnable_per_tensor_affine(X, torch.ones(1), torch.zeros(1), 5, 2),
        lambda: torch._fake_quantize_learnable_per_tensor_affine(X, torch.ones(1), torch.zeros(1), 5, 2)),
}


@pytest.mark.parametrize("case", list(BAD_CALLS))
def test_bad_arguments_raise_what_torch_raises_too(case):
    ours, theirs = BAD_CALLS[case]
    with pytest.raises(RuntimeError):
        theirs()
    with pytest.raises(RuntimeError) as info:
        ours()
    assert isinstance(info.value, (ValueError, TypeError)), type(info.value).__mro__  # and fakequant's type
    assert str(info.value).startswith("fakequant:")


def test_a_float_zero_point_with_a_zero_scale_is_refused():
    # torch takes it (that channel's outputs are +-0); fakequant refuses it as every
    # invalid scale (the values of CPU tensors are checked)
    scale, zero_point = torch.tensor([0.1, 0.0, 0.2]), torch.tensor([1.5] * 3)
    assert not torch.fake_quantize_per_channel_affine(X, scale, zero_point, 1, 0, 255)[:, 1].any()
    with pytest.raises(RuntimeError, match="scale must be positive") as info:
        fakequant.fake_quantize_per_channel_affine(X, scale, zero_point, 1, 0, 255)
    assert isinstance(info.value, ValueError)


PER_CHANNEL = dict(observer=tq.MovingAveragePerChannelMinMaxObserver, quant_min=-128, quant_max=127,
                   dtype=torch.qint8, qscheme=torch.per_channel_symmetric, ch_axis=1)
SCRIPTED = {
    "fake_quantize": (fakequant.ao.FakeQuantize, {}),
    "fused": (fakequant.ao.FusedMovingAvgObsFakeQuantize, {}),
    "fake_quantize_per_channel": (fakequant.ao.FakeQuantize, PER_CHANNEL),
    "fused_per_channel": (fakequant.ao.FusedMovingAvgObsFakeQuantize, PER_CHANNEL),
    "float_qparams": (fakequant.ao.FakeQuantize, dict(
        observer=tq.MovingAveragePerChannelMinMaxObserver, qscheme=torch.per_channel_affine_float_qparams,
        ch_axis=0, quant_min=0, quant_max=255, dtype=torch.quint8)),
}


@pytest.mark.parametrize("name", list(SCRIPTED))
def test_torch_jit_script_of_ao_modules_computes_what_eager_does(name):
    cls, kwargs = SCRIPTED[name]
    eager = cls(**kwargs)
    scripted = torch.jit.script(copy.deepcopy(eager))
    g = torch.Generator().manual_seed(3)
    for step in range(3):
        _same_step(eager, scripted, (torch.randn(6, 4, 5, generator=g) * (step + 1)))
        assert bits_equal(scripted.scale, eager.scale) and torch.equal(scripted.zero_point, eager.zero_point)
    eager.disable_fake_quant()
    scripted.disable_fake_quant()
    x = torch.randn(6, 4, 5, generator=g)
    assert bits_equal(scripted(x), x) and bits_equal(eager(x), x)


# --- torch's words and argument types, where torch's own tests match on them ----------------

TORCH_ZERO_POINT_WORDS = "`zero_point` must be between `quant_min` and `quant_max`."  # (a regex, as torch's tests)
ZERO_POINT_OUT_OF_RANGE = {  # name: a replacement of torch's called with zero point -1 in [0, 255]
    "per channel": lambda x: fakequant.fake_quantize_per_channel_affine(
        x, torch.ones(3), torch.full((3,), -1, dtype=torch.int32), 1, 0, 255),
    "per channel, cachemask": lambda x: fakequant.fake_quantize_per_channel_affine_cachemask(
        x, torch.ones(3), torch.full((3,), -1, dtype=torch.int32), 1, 0, 255),
    "per tensor": lambda x: fakequant.fake_quantize_per_tensor_affine(x, 0.1, -1, 0, 255),
    "per tensor, cachemask": lambda x: fakequant.fake_quantize_per_tensor_affine_cachemask(x, 0.1, -1, 0, 255),
}


@pytest.mark.parametrize("empty", [False, True])
@pytest.mark.parametrize("case", list(ZERO_POINT_OUT_OF_RANGE))
def test_a_zero_point_out_of_range_says_what_torch_says(case, empty):
    # torch's test_fake_quant_per_channel_qparam_range(_empty_input) match torch's message
    x = torch.empty(0, 3) if empty else torch.randn(2, 3)
    with pytest.raises(RuntimeError, match=TORCH_ZERO_POINT_WORDS) as info:
        ZERO_POINT_OUT_OF_RANGE[case](x)
    message = str(info.value)
    assert isinstance(info.value, ValueError) and message.startswith("fakequant: zero_point")
    assert "[0, 255]" in message and "-1" in message  # fakequant's: the range and the value
    # fakequant's own operator keeps its own words
    with pytest.raises(ValueError) as info:
        fakequant.fake_quantize_affine(x, 0.1, -1, None, 0, 255)
    assert "zero_point must hold integers" in str(info.value) and "`zero_point`" not in str(info.value)


@pytest.mark.parametrize("scale_dtype", [torch.float64, torch.float16, torch.int32])
@pytest.mark.parametrize("zero_point_dtype", [torch.int32, torch.float32])
@pytest.mark.parametrize("cachemask", [False, True])
def test_per_channel_scale_of_a_dtype_torch_refuses_is_refused(scale_dtype, zero_point_dtype, cachemask):
    x = torch.randn(3, 4, 5)
    scale = torch.tensor([0.1, 0.2, 0.3, 0.4]).to(scale_dtype)
    zero_point = torch.tensor([1, 2, 3, 4]).to(zero_point_dtype)
    ours, theirs = ((fakequant.fake_quantize_per_channel_affine_cachemask, CACHEMASK) if cachemask
                    else (fakequant.fake_quantize_per_channel_affine, torch.fake_quantize_per_channel_affine))
    with pytest.raises(RuntimeError, match="Scale must be Float or BFloat16"):
        theirs(x, scale, zero_point, 1, 0, 255)
    with pytest.raises(RuntimeError, match="Scale must be Float or BFloat16") as info:
        ours(x, scale, zero_point, 1, 0, 255)
    assert isinstance(info.value, TypeError) and str(info.value).startswith("fakequant: scale")
    # fakequant's own operator takes any floating-point scale
    if scale_dtype.is_floating_point:
        assert bits_equal(fakequant.fake_quantize_affine(x, scale, zero_point, 1, 0, 255),
                          fakequant.fake_quantize_affine(x, scale.float(), zero_point, 1, 0, 255))
    # a bfloat16 scale is taken on every device: torch's check takes it and its CUDA kernel
    # computes with it; its CPU kernel fails an internal assert (the RuntimeError torch's
    # test_fake_quantize_per_channel_affine_scale_dtypes expects there; docs/torch-ao.md)
    bf16 = torch.tensor([0.1, 0.2, 0.3, 0.4]).bfloat16()
    assert bits_equal(ours(x, bf16, zero_point, 1, 0, 255)[0], ours(x, bf16.float(), zero_point, 1, 0, 255)[0])



def _same_step(eager, scripted, x):
    """One forward and backward of both modules on copies of x: the same output and gradient."""
    x, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    y, y2 = eager(x), scripted(x2)
    y.square().sum().backward()
    y2.square().sum().backward()
    assert bits_equal(y2, y) and bits_equal(x2.grad, x.grad)

@pytest.mark.parametrize("per_channel", [False, True])
def test_torch_jit_script_of_torch_ao_fused_module_with_fakequant_fused_op(monkeypatch, per_channel):
    # torch.ao's own FusedMovingAvgObsFakeQuantize, its torch.fused_moving_avg_obs_fake_quant
    # swapped for fakequant's (this test's patch; fakequant patches nothing): the scripted module
    # compiles, and computes what the eager one does, bit for bit
    monkeypatch.setattr(torch, "fused_moving_avg_obs_fake_quant", fakequant.ops.fused_moving_avg_obs_fake_quant)
    kwargs = dict(observer=tq.MovingAveragePerChannelMinMaxObserver, quant_min=-128, quant_max=127,
                  dtype=torch.qint8, qscheme=torch.per_channel_symmetric, ch_axis=0) if per_channel else {}
    eager = tq.FusedMovingAvgObsFakeQuantize(**kwargs)
    scripted = torch.jit.script(copy.deepcopy(eager))
    g = torch.Generator().manual_seed(4)
    for step in range(4):
        if step == 2:
            eager.disable_observer()
            scripted.disable_observer()
        _same_step(eager, scripted, (torch.randn(6, 4, 5, generator=g) * (step + 1)))
        for name in ("scale", "zero_point"):
            assert bits_equal(getattr(scripted, name), getattr(eager, name))
        for name in ("min_val", "max_val"):
            assert bits_equal(getattr(scripted.activation_post_process, name),
                              getattr(eager.activation_post_process, name))
    eager.disable_fake_quant()
    scripted.disable_fake_quant()
    x = torch.randn(6, 4, 5, generator=g)
    assert bits_equal(scripted(x), x) and bits_equal(eager(x), x)


def test_functional_fused_op_has_torchs_signature_and_return():
    import inspect

    ours = inspect.signature(fakequant.ops.fused_moving_avg_obs_fake_quant)
    assert list(ours.parameters)[1:] == ["observer_on", "fake_quant_on", "running_min", "running_max", "scale",
                                         "zero_point", "averaging_const", "quant_min", "quant_max", "ch_axis",
                                         "per_row_fake_quant", "symmetric_quant"]
    assert ours.parameters["per_row_fake_quant"].default is False
    assert ours.parameters["symmetric_quant"].default is False
    scripted = torch.jit.script(fakequant.ops.fused_moving_avg_obs_fake_quant)
    x = torch.randn(8, 3)
    on = torch.tensor([1], dtype=torch.uint8)
    buffers = [torch.tensor([float("inf")]), torch.tensor([float("-inf")]), torch.tensor([1.0]),
               torch.tensor([0], dtype=torch.int32)]
    theirs = [b.clone() for b in buffers]
    y = scripted(x, on, on, *buffers, 0.01, 0, 255, 0)
    t = torch.fused_moving_avg_obs_fake_quant(x, on, on, *theirs, 0.01, 0, 255, 0)
    assert isinstance(y, torch.Tensor) and y.shape == t.shape  # one tensor, as torch's
    for a, b in zip(buffers, theirs):
        assert bits_equal(a, b)
