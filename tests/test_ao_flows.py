"""fakequant's fake-quant modules in torch's QAT flows, end to end, against torch's own
modules on the same model: eager torch.ao QAT (prepare_qat, train, convert) and torchao's
PT2E QAT (prepare_qat_pt2e with the X86 quantizer's QAT config, train, convert_pt2e).

Each step the fakequant model gets the torch model's state_dict (the keys are the same),
both run the same batch, and every fake-quant module's output is compared with its torch
twin wherever their inputs are equal: equal except at exact ties of x / scale (torch
multiplies by 1 / scale), which are counted and bounded. Observer statistics, scales and
zero points are compared bit for bit; the converted models must agree too.
"""
import copy

import pytest
import torch
from torch import nn

import fakequant.ao
from conftest import assert_same

tq = pytest.importorskip("torch.ao.quantization")


class SmallCNN(nn.Module):
    def __init__(self, stubs=True):
        super().__init__()
        self.quant = tq.QuantStub() if stubs else nn.Identity()
        self.dequant = tq.DeQuantStub() if stubs else nn.Identity()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(8, 16, 3, stride=2)
        self.relu2 = nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        x = self.quant(x)
        x = self.relu2(self.conv2(self.relu1(self.conv1(x))))
        return self.dequant(self.fc(self.pool(x).flatten(1)))


def batches(n=6):
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(8, 3, 12, 12, generator=g), torch.randint(0, 10, (8,), generator=g)) for _ in range(n)]


def fake_quant_modules(model, classes):
    return {name: m for name, m in model.named_modules() if isinstance(m, classes)}


def record(modules):
    seen = {}
    hooks = [m.register_forward_hook(lambda m, i, o, name=name: seen.__setitem__(name, (i[0].detach(), o.detach())))
             for name, m in modules.items()]
    return seen, hooks


def ties_between(seen_ref, seen_ours, mods_ref, mods_ours):
    """Elements where twin modules given equal inputs gave different outputs (asserted one
    step apart at a near-tie); their observer statistics, scales and zero points are
    compared bit for bit. Modules whose inputs already differ (downstream of a tie) are
    skipped; returns (ties, modules compared)."""
    ties = compared = 0
    for name, (x, t) in seen_ref.items():
        xo, y = seen_ours[name]
        if not torch.equal(x, xo):
            continue
        compared += 1
        theirs, mine = mods_ref[name].state_dict(), mods_ours[name].state_dict()
        for key, value in theirs.items():
            if key.endswith(("min_val", "max_val", "scale", "zero_point")):
                assert_same(mine[key], value)
        diff = y != t
        if bool(diff.any()):
            assert float((y - t).abs().max()) <= float((t.max() - t.min()).clamp_min(1e-6)) / 100
            ties += int(diff.sum())
    return ties, compared


def train_side_by_side(ref, ours, ref_classes, our_classes, steps):
    mods_ref, mods_ours = fake_quant_modules(ref, ref_classes), fake_quant_modules(ours, our_classes)
    assert mods_ref.keys() == mods_ours.keys() and mods_ref
    for name, m in mods_ours.items():
        assert isinstance(m, type(mods_ref[name]))  # fakequant's classes derive from the framework's
    assert ref.state_dict().keys() == ours.state_dict().keys()
    seen_ref, hooks_ref = record(mods_ref)
    seen_ours, hooks_ours = record(mods_ours)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
    ties = compared = 0
    for x, label in steps:
        ours.load_state_dict(ref.state_dict())
        out_ref, out_ours = ref(x), ours(x)
        step_ties, step_compared = ties_between(seen_ref, seen_ours, mods_ref, mods_ours)
        assert step_compared >= 1
        ties += step_ties
        compared += sum(int(o.numel()) for _, o in seen_ref.values())
        loss_ref = nn.functional.cross_entropy(out_ref, label)
        loss_ours = nn.functional.cross_entropy(out_ours, label)
        opt_ref.zero_grad()
        ours.zero_grad()
        loss_ref.backward()
        loss_ours.backward()
        if ties == 0:  # the same forward: the same straight-through gradients
            for (name, p), q in zip(ref.named_parameters(), ours.parameters()):
                torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-6, msg=name)
        opt_ref.step()
    for h in hooks_ref + hooks_ours:
        h.remove()
    # measured here: 0 (fused), 3 (FakeQuantize), 1 (learnable), 0 (PT2E) in about 10^5 elements
    assert ties <= 3 + compared // 10_000, (ties, compared)
    ours.load_state_dict(ref.state_dict())
    return ties


@pytest.mark.parametrize("qconfig_name", ["fused", "fake_quantize", "learnable"])
def test_eager_torch_ao_qat(qconfig_name):
    torch.manual_seed(0)
    base = SmallCNN().train()
    if qconfig_name == "fused":
        qconfig = tq.get_default_qat_qconfig("x86")
    elif qconfig_name == "fake_quantize":
        qconfig = tq.QConfig(
            activation=tq.FakeQuantize.with_args(observer=tq.MovingAverageMinMaxObserver, quant_min=0, quant_max=255,
                                                 reduce_range=True),
            weight=tq.FakeQuantize.with_args(observer=tq.MovingAveragePerChannelMinMaxObserver, quant_min=-128,
                                             quant_max=127, dtype=torch.qint8, qscheme=torch.per_channel_symmetric))
    else:
        from torch.ao.quantization._learnable_fake_quantize import _LearnableFakeQuantize as L

        qconfig = tq.QConfig(
            activation=L.with_args(observer=tq.MovingAverageMinMaxObserver, quant_min=0, quant_max=255,
                                   use_grad_scaling=True),
            weight=L.with_args(observer=tq.MovingAveragePerChannelMinMaxObserver, quant_min=-128, quant_max=127,
                               dtype=torch.qint8, qscheme=torch.per_channel_symmetric, use_grad_scaling=True,
                               channel_len=8))
    ref, ours = copy.deepcopy(base), copy.deepcopy(base)
    ref.qconfig = qconfig
    ours.qconfig = fakequant.ao.use_fakequant(qconfig)  # the one-line switch
    if qconfig_name == "learnable":  # channel_len fits one layer: quantize the first convolution only
        for m in (ref, ours):
            for name in ("conv2", "fc"):
                getattr(m, name).qconfig = None
    tq.prepare_qat(ref, inplace=True)
    tq.prepare_qat(ours, inplace=True)
    ref_classes = (tq.FakeQuantizeBase,)
    our_classes = (fakequant.ao.FakeQuantize, fakequant.ao.FusedMovingAvgObsFakeQuantize,
                   fakequant.ao.LearnableFakeQuantize)
    train_side_by_side(ref, ours, ref_classes, our_classes, batches())
    if qconfig_name == "learnable":
        return  # torch's convert has no mapping for learnable fake quantizers' scale parameters
    ref.eval()
    ours.eval()
    qref, qours = tq.convert(ref), tq.convert(ours)
    x = batches(1)[0][0]
    assert_same(qours(x), qref(x))


def test_torchao_pt2e_qat():
    pytest.importorskip("torchao")
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_qat_pt2e
    from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
        X86InductorQuantizer,
        get_default_x86_inductor_quantization_config,
    )
    import torchao.quantization.pt2e as ao_pt2e

    import fakequant.ao.pt2e

    torch.manual_seed(0)
    base = SmallCNN(stubs=False).train()
    example = (torch.randn(8, 3, 12, 12),)
    exported = torch.export.export(base, example).module()
    config = get_default_x86_inductor_quantization_config(is_qat=True)
    prepared = []
    for cfg in (config, fakequant.ao.pt2e.use_fakequant(config)):  # the one-line switch
        quantizer = X86InductorQuantizer()
        quantizer.set_global(cfg)
        prepared.append(prepare_qat_pt2e(copy.deepcopy(exported), quantizer))
    ref, ours = prepared
    our_classes = (fakequant.ao.pt2e.FakeQuantize, fakequant.ao.pt2e.FusedMovingAvgObsFakeQuantize)
    assert fake_quant_modules(ours, our_classes)
    train_side_by_side(ref, ours, (ao_pt2e.FakeQuantizeBase,), our_classes, batches())
    qref, qours = convert_pt2e(ref), convert_pt2e(ours)
    x = batches(1)[0][0]
    assert_same(qours(x), qref(x))
