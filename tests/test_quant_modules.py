"""quant_modules (monkey patching, quantize_model), calibrate(), checkpoints, import paths, helpers."""
import io

import pytest
import torch
from torch import nn

import fakequant
from fakequant import calib, quant_modules, utils
from fakequant import nn as quant_nn
from fakequant.nn import TensorQuantizer
from fakequant.optim import helper
from fakequant.tensor_quant import QuantDescriptor

import reference
from conftest import bits_equal  # noqa: E402


def small_net():
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4),
    )


def quantizers(model):
    return [m for m in model.modules() if isinstance(m, TensorQuantizer)]


# --- initialize / deactivate ------------------------------------------------------------


def test_initialize_and_deactivate():
    original = nn.Conv2d
    try:
        quant_modules.initialize()
        assert nn.Conv2d is quant_nn.QuantConv2d and nn.Linear is quant_nn.QuantLinear
        assert nn.LSTM is quant_nn.QuantLSTM and nn.AdaptiveAvgPool2d is quant_nn.QuantAdaptiveAvgPool2d
        assert nn.MaxPool2d is not quant_nn.QuantMaxPool2d  # not in pytorch-quantization's map
        net = small_net()
        assert isinstance(net[0], quant_nn.QuantConv2d) and isinstance(net[8], quant_nn.QuantLinear)
        quant_modules.initialize(float_module_list=["Linear"])  # again: replaces the patching
        assert nn.Linear is torch.nn.modules.linear.Linear and nn.Conv2d is quant_nn.QuantConv2d
    finally:
        quant_modules.deactivate()
    assert nn.Conv2d is original and nn.Linear is torch.nn.modules.linear.Linear
    quant_modules.deactivate()  # no-op when inactive
    assert nn.Conv2d is original


def test_initialize_as_context_manager_and_custom_modules():
    with quant_modules.initialize(custom_quant_modules=[(torch.nn, "MaxPool2d", quant_nn.QuantMaxPool2d)]):
        net = small_net()
    assert nn.Conv2d is torch.nn.modules.conv.Conv2d and nn.MaxPool2d is torch.nn.modules.pooling.MaxPool2d
    assert isinstance(net[3], quant_nn.QuantMaxPool2d)
    with pytest.raises(RuntimeError):
        with quant_modules.initialize():
            raise RuntimeError("boom")
    assert nn.Conv2d is torch.nn.modules.conv.Conv2d


def test_initialize_rejects_bad_arguments():
    with pytest.raises(TypeError, match="float_module_list"):
        quant_modules.initialize(float_module_list="Linear")
    with pytest.raises(ValueError, match="no attribute"):
        quant_modules.initialize(custom_quant_modules=[(torch.nn, "Nope", quant_nn.QuantLinear)])
    with pytest.raises(TypeError, match="custom_quant_modules"):
        quant_modules.initialize(custom_quant_modules=[("Linear", quant_nn.QuantLinear)])
    assert nn.Conv2d is torch.nn.modules.conv.Conv2d  # nothing was patched


# --- quantize_model ---------------------------------------------------------------------


def test_quantize_model_keeps_weights_and_outputs():
    net = small_net().eval()
    x = torch.randn(2, 3, 8, 8)
    expected = net(x)
    weight = net[0].weight
    hook_calls = []
    net[4].register_forward_hook(lambda *a: hook_calls.append(1))
    out = fakequant.quantize_model(net)
    assert out is net and isinstance(net[0], quant_nn.QuantConv2d) and isinstance(net[8], quant_nn.QuantLinear)
    assert isinstance(net[6], quant_nn.QuantAdaptiveAvgPool2d) and type(net[3]) is nn.MaxPool2d
    assert net[0].weight is weight and not net[0].training
    assert len(quantizers(net)) == 2 + 2 + 1 + 2
    for q in quantizers(net):
        q.disable()
    torch.testing.assert_close(net(x), expected)
    assert hook_calls == [1]
    for q in quantizers(net):
        q.enable()
    assert not torch.equal(net(x), expected)
    assert fakequant.quantize_model(net) is net and len(quantizers(net)) == 7  # idempotent


def test_quantize_model_options():
    net = small_net()
    fakequant.quantize_model(net, quant_desc_input=QuantDescriptor(num_bits=6), exclude=["8"],
                             float_module_list=["AdaptiveAvgPool2d"],
                             custom_quant_modules=[(torch.nn, "MaxPool2d", quant_nn.QuantMaxPool2d)])
    assert type(net[8]) is nn.Linear and type(net[6]) is nn.AdaptiveAvgPool2d
    assert isinstance(net[3], quant_nn.QuantMaxPool2d) and net[0].input_quantizer.num_bits == 6
    lstm = fakequant.quantize_model(nn.LSTM(3, 4, num_layers=2, bidirectional=True))
    assert isinstance(lstm, quant_nn.QuantLSTM) and len(lstm._input_quantizers) == 4
    y, _ = lstm(torch.randn(5, 2, 3))
    assert y.shape == (5, 2, 8)
    with pytest.raises(TypeError, match="quant_desc_input"):
        fakequant.quantize_model(small_net(), quant_desc_input=8)
    with pytest.raises(TypeError, match="exclude"):
        fakequant.quantize_model(small_net(), exclude="fc")


def test_quantize_model_optimizer_stays_valid():
    net = small_net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    fakequant.quantize_model(net)
    before = net[0].weight.detach().clone()
    net(torch.randn(2, 3, 8, 8)).sum().backward()
    opt.step()
    assert not torch.equal(before, net[0].weight)


# --- calibrate -------------------------------------------------------------------------


def test_calibrate_max_and_histogram():
    torch.manual_seed(0)
    net = fakequant.quantize_model(small_net())
    net[0].input_quantizer._calibrator = calib.HistogramCalibrator(8, None, False)
    data = [(torch.randn(4, 3, 8, 8), torch.zeros(4)) for _ in range(5)]
    net.train()
    running_mean = net[1].running_mean.clone()
    fakequant.calibrate(net, data, num_batches=3, method="percentile", percentile=99.9, progress=False)
    assert net.training and bits_equal(net[1].running_mean, running_mean)  # ran in eval mode
    for q in quantizers(net):
        assert q.amax is not None and q._if_quant and not q._if_calib and not q._disabled
    assert bits_equal(net[0].weight_quantizer.amax, net[0].weight.detach().abs().amax((1, 2, 3), keepdim=True))
    first_batches = torch.cat([d[0] for d in data[:3]])
    assert net[0].input_quantizer.amax.item() < first_batches.abs().max().item()
    net(torch.randn(2, 3, 8, 8)).sum().backward()  # QAT step after calibration


def test_calibrate_restores_state_on_error_and_checks_arguments():
    net = fakequant.quantize_model(small_net())
    net[8].input_quantizer.disable()

    def bad_forward(model, batch):
        raise RuntimeError("bad batch")

    with pytest.raises(RuntimeError, match="bad batch"):
        fakequant.calibrate(net, [torch.randn(1, 3, 8, 8)], forward_fn=bad_forward, progress=False)
    assert net[8].input_quantizer._disabled and not net[0].input_quantizer._if_calib
    with pytest.raises(ValueError, match="method"):
        fakequant.calibrate(net, [], method="kl")
    with pytest.raises(ValueError, match="num_batches"):
        fakequant.calibrate(net, [torch.randn(1, 3, 8, 8)], num_batches=0)
    with pytest.raises(ValueError, match="no TensorQuantizer"):
        fakequant.calibrate(small_net(), [torch.randn(1, 3, 8, 8)])
    with pytest.raises(ValueError, match="no batch"):
        fakequant.calibrate(net, [], progress=False)


def test_calibrate_initialises_learned_ranges():
    net = nn.Sequential(quant_nn.Linear(4, 3, quant_desc_input=QuantDescriptor(learn_amax=True)))
    x = torch.randn(8, 4)
    fakequant.calibrate(net, [x], progress=False)
    clip = net[0].input_quantizer.clip
    assert clip.clip_value_max.item() == x.abs().max().item() == -clip.clip_value_min.item()


def test_calibrate_dict_batches_and_unused_quantizers():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.used = quant_nn.Linear(4, 4)
            self.unused = quant_nn.Linear(4, 4)

        def forward(self, x):
            return self.used(x)

    net = Net()
    with pytest.warns(UserWarning, match="collected no data"):
        utils.calibrate(net, [{"x": torch.randn(2, 4)}], progress=False)
    assert net.used.input_quantizer.amax is not None and net.unused.input_quantizer.amax is None
    assert net.unused.weight_quantizer.amax is None


# --- the README's QAT flow -------------------------------------------------------------------


def test_readme_qat_snippet():
    from fakequant import nn as quant_nn  # noqa: F811
    from fakequant import quant_modules  # noqa: F811

    # 1. drop-in layers, or patch torch.nn before building the model
    layer = quant_nn.Conv2d(3, 8, 3, padding=1)
    assert isinstance(layer, torch.nn.Conv2d)
    quant_modules.initialize()
    try:
        model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                                    torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 10))
    finally:
        quant_modules.deactivate()
    loader = [(torch.randn(8, 3, 16, 16), torch.randint(0, 10, (8,))) for _ in range(4)]
    # 2. calibrate
    fakequant.calibrate(model, loader, num_batches=2, progress=False)
    # 3. fine-tune
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for images, labels in loader:
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert torch.isfinite(loss)


# --- checkpoints -----------------------------------------------------------------------------


def test_state_dict_round_trip_of_calibrated_model():
    net = fakequant.quantize_model(small_net())
    fakequant.calibrate(net, [torch.randn(2, 3, 8, 8)], progress=False)
    buf = io.BytesIO()
    torch.save(net.state_dict(), buf)
    fresh = fakequant.quantize_model(small_net())  # no amax yet: dynamic
    buf.seek(0)
    fresh.load_state_dict(torch.load(buf, map_location="cpu"))
    x = torch.randn(2, 3, 8, 8)
    assert bits_equal(fresh(x), net(x))
    assert set(fresh.state_dict()) == set(net.state_dict())


def test_load_pytorch_quantization_checkpoint_on_cpu():
    """A state_dict laid out as pytorch-quantization writes it (0-d per-tensor amax,
    (C, 1, 1, 1) per-channel weight amax, learned clip range) loads on a CPU-only run."""
    weight = torch.randn(4, 3, 3, 3)
    checkpoint = {
        "conv.weight": weight,
        "conv.bias": torch.randn(4),
        "conv._input_quantizer._amax": torch.tensor(2.5),
        "conv._weight_quantizer._amax": weight.abs().amax((1, 2, 3), keepdim=True),
        "fc.weight": torch.randn(5, 4),
        "fc.bias": torch.randn(5),
        "fc._input_quantizer.clip.clip_value_min": torch.tensor(-1.5),
        "fc._input_quantizer.clip.clip_value_max": torch.tensor(1.5),
        "fc._weight_quantizer._amax": torch.full((5, 1), 0.8),
        "lstm.weight_ih_l0": torch.randn(8, 3), "lstm.weight_hh_l0": torch.randn(8, 2),
        "lstm.bias_ih_l0": torch.randn(8), "lstm.bias_hh_l0": torch.randn(8),
        "lstm._input_quantizers.0._amax": torch.tensor(1.0),
        "lstm._weight_quantizers.0._amax": torch.full((8, 1), 0.5),
    }
    buf = io.BytesIO()
    torch.save(checkpoint, buf)
    buf.seek(0)
    loaded = torch.load(buf, map_location="cpu")

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = quant_nn.Conv2d(3, 4, 3)
            self.fc = quant_nn.Linear(4, 5, quant_desc_input=QuantDescriptor(learn_amax=True))
            self.lstm = quant_nn.LSTM(3, 2)

    net = Net()
    net.load_state_dict(loaded)
    assert net.conv.input_quantizer.amax.item() == 2.5 and net.conv.input_quantizer.amax.device.type == "cpu"
    assert net.fc.input_quantizer.clip.clip_value_max.item() == 1.5
    x = torch.randn(1, 3, 5, 5)
    expected = torch.nn.functional.conv2d(
        reference.fake_quantize_amax(x, torch.tensor(2.5), 8, False, False)[0],
        reference.fake_quantize_amax(weight, checkpoint["conv._weight_quantizer._amax"], 8, False, False)[0],
        checkpoint["conv.bias"])
    torch.testing.assert_close(net.conv(x), expected)
    assert net.lstm(torch.randn(2, 1, 3))[0].shape == (2, 1, 2)


# --- ONNX export switch, import paths, helpers ----------------------------------------------------


def test_enable_onnx_export_is_exception_safe():
    q = TensorQuantizer(QuantDescriptor(amax=1.0))
    with pytest.raises(RuntimeError, match="export failed"):
        with fakequant.enable_onnx_export():
            assert TensorQuantizer._enable_onnx_export and TensorQuantizer.use_fb_fake_quant
            q(torch.randn(3))
            raise RuntimeError("export failed")
    assert not TensorQuantizer._enable_onnx_export and not TensorQuantizer.use_fb_fake_quant
    with quant_modules.enable_onnx_export():
        with pytest.raises(RuntimeError, match="calibrated"):
            TensorQuantizer()(torch.randn(3))


def test_pytorch_quantization_import_paths():
    from fakequant.calib.histogram import HistogramCalibrator, calibrate_weights  # noqa: F401
    from fakequant.calib.max import MaxCalibrator  # noqa: F401
    from fakequant.nn.functional import ClipFunction, clip  # noqa: F401
    from fakequant.nn.modules import _utils
    from fakequant.nn.modules.clip import Clip
    from fakequant.nn.modules.quant_conv import QuantConv2d
    from fakequant.nn.modules.tensor_quantizer import TensorQuantizer as TQ
    from fakequant.tensor_quant import QUANT_DESC_8BIT_PER_TENSOR  # noqa: F401
    from fakequant.utils import reduce_amax  # noqa: F401

    assert TQ is TensorQuantizer and QuantConv2d is quant_nn.QuantConv2d and Clip is quant_nn.Clip
    assert _utils.QuantMixin is quant_nn.QuantMixin
    assert fakequant.QuantDescriptor is fakequant.tensor_quant.QuantDescriptor


def test_reduce_amax():
    x = torch.randn(3, 4, 5)
    assert utils.reduce_amax(x).shape == () and utils.reduce_amax(x) == x.abs().max()
    assert bits_equal(utils.reduce_amax(x, axis=(0, 2)), x.abs().amax((0, 2), keepdim=True))
    assert bits_equal(utils.reduce_amax(x, axis=1, keepdims=False), x.abs().amax(1))
    assert bits_equal(utils.reduce_amax(x, axis=-1), x.abs().amax(-1, keepdim=True))
    with pytest.raises(ValueError, match="out of range"):
        utils.reduce_amax(x, axis=3)
    with pytest.raises(TypeError, match="axis"):
        utils.reduce_amax(x, axis="0")
    assert not utils.reduce_amax(x.requires_grad_()).requires_grad


def test_optim_helpers():
    net = small_net()
    fakequant.quantize_model(net)
    groups = helper.group_parameters(net, [["^0\\."], ["^8\\."]], lrs=[0.1, 0.01])
    assert len(groups[0]["params"]) == 2 and groups[1]["lr"] == 0.01
    helper.freeze_parameters(net, ["^1\\."])
    assert not net[1].weight.requires_grad
    with pytest.raises(ValueError, match="lrs"):
        helper.group_parameters(net, [["a"]], lrs=[1, 2])
    net[0].weight_quantizer.amax = net[0].weight.detach().abs().amax((1, 2, 3), keepdim=True)
    expected = net[0].weight_quantizer(net[0].weight).detach()
    helper.quant_weight_inplace(net)
    assert bits_equal(net[0].weight.detach(), expected)


def test_pytorch_quantization_tutorial_flow():
    """pytorch-quantization's documented calibration recipe, with only the imports swapped."""
    from fakequant import calib as pq_calib
    from fakequant import nn as pq_nn
    from fakequant import quant_modules as pq_modules
    from fakequant.tensor_quant import QuantDescriptor as Desc

    saved = pq_nn.QuantConv2d.default_quant_desc_input, pq_nn.QuantLinear.default_quant_desc_input
    try:
        quant_desc_input = Desc(calib_method="histogram")
        pq_nn.QuantConv2d.set_default_quant_desc_input(quant_desc_input)
        pq_nn.QuantLinear.set_default_quant_desc_input(quant_desc_input)
        pq_modules.initialize()
        try:
            model = small_net()
        finally:
            pq_modules.deactivate()
    finally:
        pq_nn.QuantConv2d.default_quant_desc_input, pq_nn.QuantLinear.default_quant_desc_input = saved
    data_loader = [(torch.randn(4, 3, 8, 8), torch.zeros(4)) for _ in range(4)]

    def collect_stats(model, data_loader, num_batches):
        for name, module in model.named_modules():
            if isinstance(module, pq_nn.TensorQuantizer):
                if module._calibrator is not None:
                    module.disable_quant()
                    module.enable_calib()
                else:
                    module.disable()
        for i, (image, _) in enumerate(data_loader):
            model(image)
            if i >= num_batches:
                break
        for name, module in model.named_modules():
            if isinstance(module, pq_nn.TensorQuantizer):
                if module._calibrator is not None:
                    module.enable_quant()
                    module.disable_calib()
                else:
                    module.enable()

    def compute_amax(model, **kwargs):
        for name, module in model.named_modules():
            if isinstance(module, pq_nn.TensorQuantizer):
                if module._calibrator is not None:
                    if isinstance(module._calibrator, pq_calib.MaxCalibrator):
                        module.load_calib_amax()
                    else:
                        module.load_calib_amax(**kwargs)
                assert f"{name:40}: {module}"

    with torch.no_grad():
        collect_stats(model, data_loader, num_batches=2)
        compute_amax(model, method="percentile", percentile=99.99)
    assert isinstance(model[0]._input_quantizer._calibrator, pq_calib.HistogramCalibrator)
    for q in quantizers(model):
        assert q.amax is not None
    for method in ("mse", "entropy"):
        compute_amax(model, method=method)
    model(torch.randn(2, 3, 8, 8)).sum().backward()


def test_calibrate_method_applies_to_max_descriptors():
    # Default (max) descriptors: method="entropy" must not silently take the max. Per-tensor
    # quantizers get the method (a histogram for this call, then their own calibrator back);
    # per-channel weight quantizers take the max.
    import copy

    torch.manual_seed(0)
    data = [torch.randn(8, 3, 8, 8) * torch.rand(8, 1, 1, 1) * 4 for _ in range(3)]
    base = small_net()
    net = fakequant.quantize_model(copy.deepcopy(base))
    expected = fakequant.quantize_model(copy.deepcopy(base))
    own = net[0].input_quantizer._calibrator
    fakequant.calibrate(net, data, method="entropy", progress=False)
    assert net[0].input_quantizer._calibrator is own
    for q in quantizers(expected):  # what a histogram descriptor would have given
        if q._axis is None:
            q._calibrator = calib.HistogramCalibrator(8, None, q._unsigned, narrow_range=q._narrow_range)
    fakequant.calibrate(expected, data, method="entropy", progress=False)
    for q, e in zip(quantizers(net), quantizers(expected)):
        assert bits_equal(q.amax, e.amax)
    assert net[0].input_quantizer.amax.item() < torch.cat(data).abs().max().item()  # clipped, not the max
    assert bits_equal(net[0].weight_quantizer.amax, net[0].weight.detach().abs().amax((1, 2, 3), keepdim=True))


def test_calibrate_histogram_method_without_per_tensor_quantizer_raises():
    lin = quant_nn.Linear(8, 3, quant_desc_input=QuantDescriptor(axis=1), quant_desc_weight=QuantDescriptor(axis=0))
    with pytest.raises(ValueError, match="no quantizer of this model is per tensor"):
        fakequant.calibrate(lin, [torch.randn(2, 8)], method="entropy", progress=False)
    fakequant.calibrate(lin, [torch.randn(2, 8)], method="max", progress=False)


def test_degenerate_calibrated_amax_warns_and_a_zero_weight_still_trains():
    # A zero-initialised head (as torchvision ViT's): max calibration gives its weight amax 0,
    # which would make its output 0 and mask its gradient for good.
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    nn.init.zeros_(net[2].weight)
    nn.init.zeros_(net[2].bias)
    net = fakequant.quantize_model(net)
    data = [torch.randn(16, 8) for _ in range(2)]
    with pytest.warns(UserWarning, match=r"weight_quantizer.*amax <= 2\^-24 in 4 of 4 entries.*left dynamic"):
        fakequant.calibrate(net, data, progress=False)
    assert net[2].weight_quantizer.amax is None and net[0].weight_quantizer.amax is not None
    target = torch.randn(16, 4)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    losses = []
    for _ in range(5):
        loss = (net(data[0]) - target).square().mean()
        opt.zero_grad()
        loss.backward()
        assert all(p.grad.isfinite().all() for p in net.parameters())
        opt.step()
        losses.append(loss.item())
    assert net[2].weight.abs().sum() > 0 and losses[-1] < losses[0]
    # an activation quantizer fed zeros warns and keeps the amax it was given
    lin = quant_nn.Linear(8, 3, quant_desc_weight=QuantDescriptor(axis=0))
    with pytest.warns(UserWarning, match=r"input_quantizer.*amax <= 2\^-24.*collapsed"):
        fakequant.calibrate(lin, [torch.zeros(2, 8)], progress=False)
    assert lin.input_quantizer.amax is not None


class _SubLinear(nn.Linear):
    """A Linear subclass: quantize_model converts exact classes only."""


class _AttentionBlock(nn.Module):
    def __init__(self, attn=None):
        super().__init__()
        self.attn = attn or nn.MultiheadAttention(16, 2, batch_first=True)
        self.norm = nn.LayerNorm(16)
        self.fc = _SubLinear(16, 16)

    def forward(self, x):
        return self.fc(self.norm(self.attn(x, x, x)[0]))


def test_quantize_model_reports_layers_left_in_float():
    import warnings

    with pytest.warns(UserWarning, match=r"left 1 layer\(s\).*fc \(_SubLinear\)"):
        net = fakequant.quantize_model(_AttentionBlock())
    # the attention is converted with its out_proj (not separately)
    assert isinstance(net.attn, quant_nn.QuantMultiheadAttention)
    assert isinstance(net.attn.out_proj, quant_nn.QuantLinear)
    assert quant_modules.unconverted(net) == [("norm", "LayerNorm"), ("fc", "_SubLinear")]
    # an attention with bias_k cannot be converted: said once, where it is refused (its
    # out_proj stays with it)
    with pytest.warns(UserWarning) as caught:
        net = fakequant.quantize_model(_AttentionBlock(nn.MultiheadAttention(16, 2, add_bias_kv=True)),
                                       exclude=["fc"])
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1 and "MultiheadAttention cannot be quantized: bias_k" in messages[0]
    assert quant_modules.unconverted(net)[:2] == [("attn", "MultiheadAttention"),
                                                  ("attn.out_proj", "NonDynamicallyQuantizableLinear")]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # what the user left out on purpose, or nothing usual: no warning
        fakequant.quantize_model(_AttentionBlock(), exclude=["fc"])
        fakequant.quantize_model(small_net())
        fakequant.quantize_model(nn.Sequential(nn.Linear(4, 4)), float_module_list=["Linear"])
        fakequant.quantize_model(_AttentionBlock(), exclude=["fc"], float_module_list=["MultiheadAttention"])
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        quant_modules.unconverted("net")
