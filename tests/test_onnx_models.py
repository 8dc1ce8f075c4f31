"""Whole quantized models exported to ONNX with both exporters: ONNX Runtime
matches PyTorch (1e-5 relative) and predicts the same classes, and the graph
holds one QuantizeLinear/DequantizeLinear pair per enabled quantizer, with
constant float32 scales."""
import warnings

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

import fakequant  # noqa: E402
from fakequant import nn as quant_nn  # noqa: E402
from fakequant.onnx import ExportWarning  # noqa: E402
from fakequant.tensor_quant import QuantDescriptor  # noqa: E402
from conftest import bits_equal, ort_session  # noqa: E402


class ConvNet(nn.Module):
    """QuantConv2d + BatchNorm + ReLU + pooling + QuantLinear."""

    def __init__(self):
        super().__init__()
        self.conv1 = quant_nn.QuantConv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.pool = quant_nn.QuantMaxPool2d(2)
        self.conv2 = quant_nn.QuantConv2d(8, 16, 3, padding=1, bias=False,
                                          quant_desc_input=QuantDescriptor(unsigned=True))
        self.bn2 = nn.BatchNorm2d(16)
        self.gap = quant_nn.QuantAdaptiveAvgPool2d(1)
        self.fc = quant_nn.QuantLinear(16, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.bn1(self.conv1(x))))
        x = F.relu(self.bn2(self.conv2(x)))
        return self.fc(torch.flatten(self.gap(x), 1))


class LSTMNet(nn.Module):
    """A small QuantLSTM with a QuantLinear head on its last step."""

    def __init__(self):
        super().__init__()
        self.lstm = quant_nn.QuantLSTM(6, 12, batch_first=True)
        self.fc = quant_nn.QuantLinear(12, 5)

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.fc(out[:, -1])


class DeconvNet(nn.Module):
    """An upsampling head: two QuantConvTranspose2d (weights (in=8, out/groups, k, k), quantized
    per output channel, axis 1; one grouped) and a QuantConv2d skip path, summed. Each reads
    the model's input (times 1, 0.5, -1: exact, and three input quantizers the exporter cannot
    merge), so both runtimes quantize the same floats (a chain would quantize a convolution's
    output, whose float sums ONNX Runtime and PyTorch order differently, and a value at a
    rounding boundary could move one step)."""

    def __init__(self):
        super().__init__()
        self.up1 = quant_nn.QuantConvTranspose2d(8, 6, 3, stride=2, padding=1, output_padding=1, groups=2)
        self.up2 = quant_nn.QuantConvTranspose2d(8, 6, 2, stride=2)
        self.skip = quant_nn.QuantConv2d(8, 6, 1)

    def forward(self, x):
        return self.up1(x) + self.up2(0.5 * x) + F.interpolate(self.skip(-x), scale_factor=2.0)


def _calibrated(model, batches):
    torch.manual_seed(0)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.2, 0.2)
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.3, 0.3)
    fakequant.calibrate(model, batches, progress=False)
    return model.eval()


MODELS = {
    "convnet": (ConvNet, (3, 3, 16, 16)),
    "lstm": (LSTMNet, (3, 7, 6)),
    "deconv": (DeconvNet, (2, 8, 5, 5)),
}
# The dynamo exporter builds opset 18; ONNX's converter cannot take these models lower
# (test_dynamo_below_opset_18_raises_where_onnx_cannot_convert).
EXPORTS = [("torchscript", 13), ("torchscript", 17), ("torchscript", 20),
           ("dynamo", 18), ("dynamo", 20), ("dynamo", 21)]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    cache = {}

    def get(name, exporter, opset):
        key = (name, exporter, opset)
        if key not in cache:
            cls, shape = MODELS[name]
            g = torch.Generator().manual_seed(0)
            batches = [torch.randn(shape, generator=g) for _ in range(4)]
            model = _calibrated(cls(), batches)
            path = tmp_path_factory.mktemp("models") / f"{name}_{exporter}_{opset}.onnx"
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                fakequant.onnx.export(model, (batches[0],), str(path), dynamo=exporter == "dynamo",
                                      opset_version=opset, input_names=["x"], output_names=["logits"],
                                      **({"verbose": False} if exporter == "dynamo" else {}))
            proto = onnx.load(str(path))
            onnx.checker.check_model(proto, full_check=True)
            # the exported graph, and ONNX Runtime's int8 kernels (exact on every CPU: conftest.ort_session)
            sessions = {kind: ort_session(path, kind) for kind in ("graph", "int8")}
            tests = [torch.randn(shape, generator=g) for _ in range(3)]
            cache[key] = (model, proto, sessions, tests, [w for w in caught if issubclass(w.category, ExportWarning)])
        return cache[key]

    return get


@pytest.mark.parametrize("exporter, opset", EXPORTS)
@pytest.mark.parametrize("name", list(MODELS))
def test_onnxruntime_matches_pytorch(exported, name, exporter, opset):
    model, proto, sessions, tests, caught = exported(name, exporter, opset)
    assert not caught, [str(w.message) for w in caught]
    for x in tests:
        with torch.no_grad():
            expected = model(x).numpy()
        for kind, session in sessions.items():
            got = session.run(None, {"x": x.numpy()})[0]
            assert got.shape == expected.shape
            assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max(), kind
            if name != "deconv":  # (an image out, no classes)
                assert bits_equal(got.argmax(-1), expected.argmax(-1)), kind


def _quantizers(model):
    return [m for m in model.modules() if isinstance(m, quant_nn.TensorQuantizer) and not m._disabled]


@pytest.mark.parametrize("exporter, opset", EXPORTS)
@pytest.mark.parametrize("name", list(MODELS))
def test_one_qdq_pair_per_quantizer_with_constant_scales(exported, name, exporter, opset):
    model, proto, _, tests, caught = exported(name, exporter, opset)
    nodes = list(proto.graph.node)
    q_nodes = [n for n in nodes if n.op_type == "QuantizeLinear"]
    dq_nodes = [n for n in nodes if n.op_type == "DequantizeLinear"]
    n_quantizers = len(_quantizers(model))
    if name == "lstm":
        # The input quantizer runs once per time step (7), the weight quantizers once.
        n_quantizers += 6
    assert len(q_nodes) == len(dq_nodes) == n_quantizers
    constants = {t.name for t in proto.graph.initializer}
    constants |= {o for n in nodes if n.op_type == "Constant" for o in n.output}
    # (the TorchScript exporter shares equal initializers through Identity nodes)
    constants |= {n.output[0] for n in nodes if n.op_type == "Identity" and n.input[0] in constants}
    for n in q_nodes + dq_nodes:
        assert n.input[1] in constants, f"{n.op_type} {n.name} has a computed scale"
    # Weights: per output channel (axis 0; axis 1 of a transposed convolution's weight), as
    # many scales as channels.
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in proto.graph.initializer}
    per_axis = [n for n in q_nodes if any(a.name == "axis" and a.i == 0 for a in n.attribute)
                and n.input[1] in inits and inits[n.input[1]].ndim == 1]
    assert per_axis, "no per-channel weight quantizer in the graph"


def _weight_quantize_linear(proto):
    """The per-axis scales of the QuantizeLinear nodes, by axis
    (``{axis: [scales, ...]}``)."""
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in proto.graph.initializer}
    consts = {n.output[0]: onnx.numpy_helper.to_array(a.t) for n in proto.graph.node if n.op_type == "Constant"
              for a in n.attribute if a.name == "value"}
    consts.update(inits)
    found = {}
    for n in proto.graph.node:
        if n.op_type != "QuantizeLinear":
            continue
        axis = next((a.i for a in n.attribute if a.name == "axis"), None)
        scale = consts.get(n.input[1])
        if axis is not None and scale is not None and scale.ndim == 1 and scale.size > 1:
            found.setdefault(axis, []).append(scale)
    return found


@pytest.mark.parametrize("exporter, opset", EXPORTS)
def test_conv_transpose_weight_exports_per_output_channel(exported, exporter, opset):
    # A transposed convolution's weight (in, out / groups, *k) is quantized per output channel:
    # QuantizeLinear along axis 1, with one scale per output channel (amax / 127), as calibrated.
    model, proto, _, tests, caught = exported("deconv", exporter, opset)
    assert not caught, [str(w.message) for w in caught]
    found = _weight_quantize_linear(proto)
    assert sorted(found) == [0, 1], found  # the Conv2d's weight on axis 0, both transposed ones on axis 1
    assert sorted(s.size for s in found[1]) == [3, 6]  # up1: (8, 3, 3, 3), groups=2; up2: (8, 6, 2, 2)
    assert [s.size for s in found[0]] == [6]  # skip: (6, 8, 1, 1)
    for up in (model.up1, model.up2):
        amax = up.weight_quantizer.amax
        assert amax.shape == (1, up.weight.shape[1], 1, 1)
        assert bits_equal(amax, up.weight.detach().abs().amax((0, 2, 3), keepdim=True))
        expected = (amax.flatten() / 127).numpy()
        assert any(bits_equal(s, expected) for s in found[1]), (found[1], expected)


def test_enable_onnx_export_makes_no_difference_to_the_graph(exported, tmp_path):
    model, proto, *_ = exported("convnet", "torchscript", 17)
    path = tmp_path / "plain.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (torch.randn(3, 3, 16, 16),), str(path), dynamo=False, opset_version=17,
                          input_names=["x"], output_names=["logits"])
    plain = onnx.load(str(path))
    assert [n.op_type for n in plain.graph.node] == [n.op_type for n in proto.graph.node]


def test_dynamo_below_opset_18_raises_where_onnx_cannot_convert(exported, tmp_path):
    # torch.onnx.export would keep opset 18, or write an invalid graph; fakequant.onnx.export says so.
    model, *_ = exported("convnet", "dynamo", 18)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(RuntimeError, match="version converter cannot convert this graph from opset 18 to 17"):
            fakequant.onnx.export(model, (torch.randn(3, 3, 16, 16),), str(tmp_path / "m.onnx"), dynamo=True,
                                  opset_version=17, verbose=False)
