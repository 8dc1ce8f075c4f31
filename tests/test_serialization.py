"""Checkpoints: torch.save / torch.load(weights_only=True) of quantized models' state_dicts
and of whole quantized models, and QuantDescriptor YAML that refuses arbitrary objects."""
import copy
import io

import pytest
import torch
import yaml
from torch import nn

import fakequant
from fakequant import nn as quant_nn
from fakequant.nn import TensorQuantizer
from fakequant.tensor_quant import QuantDescriptor
from conftest import bits_equal  # noqa: E402


def model():
    torch.manual_seed(0)
    return nn.Sequential(
        quant_nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
        quant_nn.MaxPool2d(2), nn.Flatten(),
        quant_nn.Linear(4 * 4 * 4, 8, quant_desc_input=QuantDescriptor(calib_method="histogram", unsigned=True)),
        nn.ReLU(),
        quant_nn.Linear(8, 3, quant_desc_input=QuantDescriptor(learn_amax=True, amax=2.0, num_bits=4),
                        quant_desc_weight=QuantDescriptor(axis=0, narrow_range=True)),
    )


def calibrated():
    m = model()
    g = torch.Generator().manual_seed(1)
    fakequant.calibrate(m, [torch.randn(4, 3, 8, 8, generator=g) for _ in range(2)], method="percentile",
                        progress=False)
    m[0].input_quantizer.pre_quant_scale = torch.full((1, 3, 1, 1), 0.5)
    # a few QAT steps, so the learned range and the weights moved
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    for _ in range(2):
        loss = m(torch.randn(4, 3, 8, 8, generator=g)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return m.eval()


def roundtrip(obj, **load_kwargs):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, **load_kwargs)


def test_state_dict_round_trip_weights_only():
    m = calibrated()
    sd = roundtrip(m.state_dict(), weights_only=True)
    assert "0._input_quantizer._amax" in sd and "0._input_quantizer._pre_quant_scale" in sd
    assert "7._input_quantizer.clip.clip_value_max" in sd and "7._weight_quantizer._amax" in sd
    fresh = model()  # its quantizers have no amax yet: the checkpoint brings them
    assert fresh[0].input_quantizer.amax is None
    fresh.load_state_dict(sd)
    fresh.eval()
    x = torch.randn(2, 3, 8, 8)
    assert bits_equal(fresh(x), m(x))
    for (k, a), b in zip(m.state_dict().items(), fresh.state_dict().values()):
        assert bits_equal(a, b), k


def test_conv_transpose_checkpoint_round_trip_per_output_channel():
    # A decoder's transposed convolutions keep one weight amax per output channel (axis 1 of
    # the weight (in, out / groups, *k)) through a weights_only checkpoint, as 2.2.1 saves it.
    def decoder():
        torch.manual_seed(0)
        return nn.Sequential(quant_nn.ConvTranspose1d(4, 6, 3, stride=2, groups=2), nn.ReLU(),
                             nn.Unflatten(2, (1, 9)), quant_nn.ConvTranspose2d(6, 5, 2),
                             nn.Unflatten(3, (1, 10)), quant_nn.ConvTranspose3d(5, 3, (1, 1, 2)))

    m = decoder()
    g = torch.Generator().manual_seed(1)
    fakequant.calibrate(m, [torch.randn(2, 4, 4, generator=g) for _ in range(2)], progress=False)
    shapes = {"0._weight_quantizer._amax": (1, 3, 1), "3._weight_quantizer._amax": (1, 5, 1, 1),
              "5._weight_quantizer._amax": (1, 3, 1, 1, 1)}
    sd = roundtrip(m.eval().state_dict(), weights_only=True)
    for key, shape in shapes.items():
        assert tuple(sd[key].shape) == shape, key
        w = sd[key.replace("_weight_quantizer._amax", "weight")]
        assert bits_equal(sd[key], w.abs().amax([d for d in range(w.dim()) if d != 1], keepdim=True)), key
    fresh = decoder()
    assert fresh[0].weight_quantizer.amax is None
    fresh.load_state_dict(sd)
    x = torch.randn(2, 4, 4, generator=g)
    assert bits_equal(fresh.eval()(x), m(x))


def test_state_dict_keys_are_tensors_only():
    # What torch.load(weights_only=True) takes without any allowlist.
    for k, v in calibrated().state_dict().items():
        assert isinstance(v, torch.Tensor), k


def test_whole_model_round_trip():
    m = calibrated()
    x = torch.randn(2, 3, 8, 8)
    loaded = roundtrip(m, weights_only=False)
    assert bits_equal(loaded(x), m(x))
    # The loaded model calibrates and trains on.
    fakequant.calibrate(loaded, [x], progress=False)
    loaded.train()
    loaded(x).sum().backward()


def test_whole_model_weights_only_needs_only_module_classes():
    # A pickled quantized model holds nothing but module and calibrator classes (no
    # functions, no other objects): weights_only loading works once they are trusted.
    m = calibrated()
    buf = io.BytesIO()
    torch.save(m, buf)
    buf.seek(0)
    with pytest.raises(Exception, match="weights_only|Weights only"):
        torch.load(buf, weights_only=True)
    buf.seek(0)
    names = torch.serialization.get_unsafe_globals_in_checkpoint(buf)
    assert all(n.startswith(("torch.nn.modules.", "fakequant.")) for n in names), names
    fq = {n for n in names if n.startswith("fakequant.")}
    assert {"fakequant.nn.tensor_quantizer.TensorQuantizer", "fakequant.calib.max.MaxCalibrator",
            "fakequant.calib.histogram.HistogramCalibrator", "fakequant.nn.clip.Clip"} <= fq
    classes = {type(mod) for mod in m.modules()}
    classes |= {type(mod._calibrator) for mod in m.modules() if isinstance(mod, TensorQuantizer)}
    assert {f"{c.__module__}.{c.__qualname__}" for c in classes} >= set(names)
    buf.seek(0)
    with torch.serialization.safe_globals(sorted(classes, key=str)):
        loaded = torch.load(buf, weights_only=True)
    x = torch.randn(2, 3, 8, 8)
    assert bits_equal(loaded(x), m(x))
    # the calibrators came back with their statistics
    hist = loaded[5].input_quantizer._calibrator
    assert bits_equal(hist._calib_hist, m[5].input_quantizer._calibrator._calib_hist)


def test_quantizer_state_dict_loads_across_shapes_and_dtypes():
    q = TensorQuantizer(QuantDescriptor(axis=0))
    q.amax = torch.rand(3, 1) + 0.5
    sd = roundtrip(q.state_dict(), weights_only=True)
    fresh = TensorQuantizer(QuantDescriptor(axis=0, amax=1.0))  # per-tensor amax before
    fresh.load_state_dict(sd)
    assert fresh.amax.shape == (3, 1) and bits_equal(fresh.amax, q.amax)
    half = roundtrip({k: v.half() for k, v in sd.items()}, weights_only=True)
    fresh.load_state_dict(half)
    assert fresh.amax.dtype == torch.float32


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_checkpoint_loads_on_cpu():
    cpu = calibrated()
    m = copy.deepcopy(cpu).cuda()
    sd = roundtrip(m.state_dict(), weights_only=True, map_location="cpu")
    assert all(v.device.type == "cpu" for v in sd.values())
    fresh = model()
    fresh.load_state_dict(sd)
    fresh.eval()
    x = torch.randn(2, 3, 8, 8)
    assert bits_equal(fresh(x), cpu(x))


# --- YAML -------------------------------------------------------------------------------


@pytest.mark.parametrize("text", [
    "!!python/object/apply:os.system ['echo pwned']",
    "num_bits: !!python/object/apply:builtins.exec [\"open('{path}', 'w').write('pwned')\"]",
    "num_bits: !!python/object/new:builtins.int [8]",
    "axis: !!python/name:os.system",
    "amax: !!python/object/apply:torch.ones [3]",
    "num_bits: !!python/tuple [4, 3]",
])
def test_yaml_refuses_arbitrary_objects(text, tmp_path):
    marker = tmp_path / "marker"
    with pytest.raises(yaml.YAMLError, match="constructor"):
        QuantDescriptor.from_yaml(text.replace("{path}", str(marker)))
    assert not marker.exists()


@pytest.mark.parametrize("text,exc", [
    ("- 8", ValueError),
    ("", ValueError),
    ("amax: &a [1, *a]", TypeError),  # a recursive list
    ("num_bits: !!binary aGVsbG8=", TypeError),
    ("num_bits: 8\nbogus: 1", TypeError),
    ("axis: {1: 2}", TypeError),
    ("amax: [1, -2]", ValueError),
    ("num_bits: 99", ValueError),
])
def test_yaml_with_wrong_values_raises_clean_errors(text, exc):
    with pytest.raises(exc):
        QuantDescriptor.from_yaml(text)


def test_yaml_round_trip_of_every_field():
    d = QuantDescriptor(num_bits=4, name="w", axis=(0, 1), amax=[[1.0, 2.0]], unsigned=True, narrow_range=True,
                        calib_method="histogram", scale_amax=0.5, fake_quant=False, dynamic=True)
    text = d.to_yaml()
    assert "!!" not in text  # plain YAML, nothing tagged
    assert QuantDescriptor.from_yaml(text) == d
    b = QuantDescriptor(block_sizes={-1: 16, "type": "dynamic"})
    assert QuantDescriptor.from_yaml(b.to_yaml()) == b
