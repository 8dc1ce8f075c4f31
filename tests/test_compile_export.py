"""A quantized ResNet-style model (quant_nn modules throughout) where QAT really runs:
torch.compile(fullgraph=True) training that matches eager, torch.export, and (with a
GPU) a training step captured in a CUDA graph.

The inductor run compiles C++ for a minute on 2 cores: it runs with
FAKEQUANT_SLOW_TESTS=1 (`make check`); the regular suite compiles with aot_eager,
which traces the same graphs (dynamo, AOTAutograd, the fake kernels) and runs them
with the eager kernels, so its numbers must equal eager's bit for bit.
"""
import copy
import io

import pytest
import torch
import torch._dynamo
from torch import nn

import fakequant
from fakequant import nn as quant_nn
from fakequant.nn import TensorQuantizer
from fakequant.tensor_quant import QuantDescriptor
from conftest import bits_equal  # noqa: E402



class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = quant_nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = quant_nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(quant_nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
        # The residual branch is quantized too, as TensorRT's QDQ placement wants.
        self.residual_quantizer = TensorQuantizer(QuantDescriptor())

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + self.residual_quantizer(identity))


class QuantResNet(nn.Module):
    def __init__(self, num_classes=5, learn_amax=False):
        super().__init__()
        self.conv1 = quant_nn.Conv2d(3, 8, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.maxpool = quant_nn.MaxPool2d(2)
        self.layer1 = BasicBlock(8, 8, 1)
        self.layer2 = BasicBlock(8, 16, 2)
        self.avgpool = quant_nn.AdaptiveAvgPool2d(1)
        # A learned (PACT-style) input range on the classifier: its clip bounds train.
        desc = QuantDescriptor(learn_amax=True, amax=4.0) if learn_amax else QuantDescriptor()
        self.fc = quant_nn.Linear(16, num_classes, quant_desc_input=desc)

    def forward(self, x):
        x = self.maxpool(torch.relu(self.bn1(self.conv1(x))))
        x = self.layer2(self.layer1(x))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def quantized_resnet(learn_amax=False, device="cpu"):
    torch.manual_seed(0)
    model = QuantResNet(learn_amax=learn_amax).to(device)
    g = torch.Generator().manual_seed(1)
    fakequant.calibrate(model, [torch.randn(8, 3, 16, 16, generator=g).to(device) for _ in range(2)],
                        progress=False)
    return model


def batches(n, device="cpu", batch=8):
    g = torch.Generator().manual_seed(2)
    return [(torch.randn(batch, 3, 16, 16, generator=g).to(device),
             torch.randint(0, 5, (batch,), generator=g).to(device)) for _ in range(n)]


def train(model, step_fn, data):
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model.train()
    losses = []
    for x, y in data:
        loss = nn.functional.cross_entropy(step_fn(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return torch.stack(losses)


def n_quantizers(model):
    return sum(isinstance(m, TensorQuantizer) for m in model.modules())


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_no_graph_breaks():
    model = quantized_resnet(learn_amax=True)
    assert n_quantizers(model) == 18
    x = torch.randn(4, 3, 16, 16)
    for mode in (model.train, model.eval):
        mode()
        explanation = torch._dynamo.explain(model)(x)
        assert explanation.graph_break_count == 0, explanation.break_reasons
        assert explanation.graph_count == 1


@pytest.mark.parametrize("desc", [
    QuantDescriptor(amax=1.0),
    QuantDescriptor(axis=0, amax=[[1.0], [2.0], [3.0]], narrow_range=True),
    QuantDescriptor(),  # dynamic: amax of each input
    QuantDescriptor(axis=(0,)),
    QuantDescriptor(amax=1.0, dynamic=True, unsigned=True),
    QuantDescriptor(learn_amax=True, amax=2.0),
    QuantDescriptor(num_bits=4, amax=1.0, scale_amax=0.5),
    QuantDescriptor(block_sizes={-1: 4}),
    QuantDescriptor(block_sizes={-1: 4, "type": "static"}, amax=torch.ones(3, 2, 1).tolist()),
    QuantDescriptor(calib_method="histogram", amax=1.0),
], ids=lambda d: repr(d)[16:60])
def test_every_quantizer_configuration_compiles_fullgraph(desc):
    q = TensorQuantizer(desc)
    q.pre_quant_scale = torch.full((8,), 0.75) if desc.axis is None and desc.block_sizes is None else None
    x = torch.randn(3, 8, requires_grad=True)
    eager = q(x)
    (g_eager,) = torch.autograd.grad(eager.sum(), x)
    compiled = torch.compile(q, fullgraph=True, backend="aot_eager")
    out = compiled(x)
    (g_out,) = torch.autograd.grad(out.sum(), x)
    assert bits_equal(out, eager) and bits_equal(g_out, g_eager)


def test_compiled_training_matches_eager_bit_for_bit():
    eager = quantized_resnet(learn_amax=True)
    compiled_model = copy.deepcopy(eager)
    compiled = torch.compile(compiled_model, fullgraph=True, backend="aot_eager")
    data = batches(3)
    losses_eager = train(eager, eager, data)
    losses_compiled = train(compiled_model, compiled, data)
    assert bits_equal(losses_eager, losses_compiled)
    sd_e, sd_c = eager.state_dict(), compiled_model.state_dict()
    assert sd_e.keys() == sd_c.keys()
    for k in sd_e:
        assert bits_equal(sd_e[k], sd_c[k]), k
    # the learned clip range moved, and identically
    assert eager.fc.input_quantizer.clip.clip_value_max.item() != 4.0


def test_compiled_dynamic_batch_size():
    model = quantized_resnet().eval()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager", dynamic=True)
    with torch.no_grad():
        for n in (2, 5, 7):
            x = torch.randn(n, 3, 16, 16)
            assert bits_equal(compiled(x), model(x))


@pytest.mark.slow  # inductor compiles C++ for about a minute
def test_inductor_training_matches_eager():
    eager = quantized_resnet(learn_amax=True)
    compiled_model = copy.deepcopy(eager)
    compiled = torch.compile(compiled_model, fullgraph=True)  # inductor
    data = batches(3)
    losses_eager = train(eager, eager, data)
    losses_compiled = train(compiled_model, compiled, data)
    # Inductor fuses batch norm and the optimizer's arithmetic (rounding differs in the
    # last bits); the fake quantizers are fused composites with the eager numerics
    # (tests/test_compiled.py checks those bit for bit).
    torch.testing.assert_close(losses_compiled, losses_eager, rtol=1e-4, atol=1e-5)
    sd_e, sd_c = eager.state_dict(), compiled_model.state_dict()
    for k in sd_e:
        torch.testing.assert_close(sd_c[k], sd_e[k], rtol=1e-3, atol=1e-4, msg=k)
    eager.eval()
    compiled_model.eval()
    with torch.no_grad():
        x = batches(1)[0][0]
        torch.testing.assert_close(compiled(x), eager(x), rtol=1e-3, atol=1e-3)


def test_export():
    model = quantized_resnet().eval()
    x = torch.randn(4, 3, 16, 16)
    batch = torch.export.Dim("batch", min=1, max=64)
    ep = torch.export.export(model, (x,), dynamic_shapes=({0: batch},))
    calls = [n for n in ep.graph.nodes if n.op == "call_function" and "fakequant" in str(n.target)]
    assert len(calls) == n_quantizers(model)
    assert all(n.target == torch.ops.fakequant.fake_quantize_amax.default for n in calls)
    with torch.no_grad():
        for n in (1, 4, 9):
            xn = torch.randn(n, 3, 16, 16)
            assert bits_equal(ep.module()(xn), model(xn))
    # The exported program saves and loads (the operators are registered by `import fakequant`).
    buf = io.BytesIO()
    torch.export.save(ep, buf)
    buf.seek(0)
    loaded = torch.export.load(buf)
    with torch.no_grad():
        assert bits_equal(loaded.module()(x), model(x))


def test_export_training_graph():
    # torch.export of the model in training mode (batch norm updating its statistics):
    # the quantizers are in the graph with their autograd formula.
    model = quantized_resnet(learn_amax=True).train()
    x = torch.randn(4, 3, 16, 16)
    reference = copy.deepcopy(model)(x)
    ep = torch.export.export(model, (x,))
    assert bits_equal(ep.module()(x), reference)


def test_quant_lstm_compiles_with_allow_rnn():
    # Dynamo refuses every nn.LSTM subclass unless allow_rnn is set (a torch limitation).
    lstm = quant_nn.LSTM(4, 6, batch_first=True)
    fakequant.calibrate(lstm, [torch.randn(2, 3, 4)], progress=False, forward_fn=lambda m, b: m(b))
    x = torch.randn(2, 3, 4)
    with torch._dynamo.config.patch(allow_rnn=True):
        out = torch.compile(lstm, fullgraph=True, backend="aot_eager")(x)[0]
    assert bits_equal(out, lstm(x)[0])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_graph_captures_a_training_step():
    device = "cuda"
    model = quantized_resnet(device=device)
    eager = copy.deepcopy(model)
    data = batches(6, device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    static_x, static_y = data[0][0].clone(), data[0][1].clone()

    def step():
        loss = nn.functional.cross_entropy(model(static_x), static_y)
        loss.backward()
        opt.step()
        return loss

    model.train()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture (creates the momentum buffers)
        for x, y in data[:2]:
            static_x.copy_(x)
            static_y.copy_(y)
            opt.zero_grad(set_to_none=True)
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        static_loss = step()
    losses = []
    for x, y in data[2:]:
        static_x.copy_(x)
        static_y.copy_(y)
        graph.replay()
        losses.append(static_loss.clone())
    torch.cuda.synchronize()

    # The same steps, eagerly: warm-up steps, then one step per replay. (Inside the graph
    # the gradients are overwritten, not accumulated: zero_grad(set_to_none) before capture.)
    eager_opt = torch.optim.SGD(eager.parameters(), lr=0.05, momentum=0.9)
    eager.train()
    eager_losses = []
    for i, (x, y) in enumerate(data):
        eager_opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(eager(x), y)
        loss.backward()
        eager_opt.step()
        if i >= 2:
            eager_losses.append(loss.detach())
    # (cuDNN may pick other algorithms in and out of the capture: a value near a
    # rounding boundary then lands one quantization step away.)
    torch.testing.assert_close(torch.stack(losses), torch.stack(eager_losses), rtol=1e-2, atol=1e-3)
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-2, atol=1e-3, msg=name)


@pytest.mark.parametrize("name", ["amax", "affine", "fp8", "min_max", "blockwise", "ggml"])
def test_composites_on_cpu_tensors_only(name):
    """The composite path decomposes an op for a CPU tensor; on any other device (here the meta
    device, standing in for CUDA, whose Inductor kernels round the rules' arithmetic otherwise:
    fakequant/composite/compiled.py) the graph keeps the operator."""
    def call(device):
        one, two = torch.tensor(1.0, device=device), torch.tensor(2.0, device=device)
        return {
            "amax": lambda x: fakequant.fake_quantize_amax(x, two),
            "affine": lambda x: fakequant.fake_quantize_per_tensor_affine(x, two, two.int(), -128, 127),
            "fp8": lambda x: fakequant.fake_quantize_fp8(x, two),
            "min_max": lambda x: fakequant.fake_quantize_min_max(x, -one, one),
            "blockwise": lambda x: fakequant.fake_quantize_blockwise(x, 16),
            "ggml": lambda x: fakequant.ops.fake_quantize_ggml(x, 32, 4),
        }[name]

    previous = fakequant.compiled_path()
    graphs = []

    def backend(gm, example_inputs):
        graphs.append({str(n.target) for n in gm.graph.nodes if n.op == "call_function"})
        return gm

    fakequant.set_compiled_path("composite")
    try:
        for device in ("cpu", "meta"):
            torch._dynamo.reset()
            torch.compile(call(device), backend=backend, fullgraph=True)(torch.randn(4, 32, device=device))
    finally:
        fakequant.set_compiled_path(previous)
    operators = [{t for t in g if t.startswith("fakequant.")} for g in graphs]
    assert operators[0] == set(), operators[0]  # the rule in plain PyTorch
    assert len(operators[1]) == 1, graphs[1]  # the operator itself


def test_the_composite_path_says_where_cuda_is_available_that_it_leaves_cuda_tensors_alone(monkeypatch):
    previous = fakequant.compiled_path()
    try:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        with pytest.warns(UserWarning, match="composite path applies to CPU tensors"):
            fakequant.set_compiled_path("composite")
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            fakequant.set_compiled_path("composite")
            fakequant.set_compiled_path("opaque")
    finally:
        fakequant.set_compiled_path(previous)
