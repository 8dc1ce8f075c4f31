"""What the serving formats share (fakequant/serve/_base.py, _plan.py): the registry of
formats by name, the refusal, the bit-for-bit check, the import guard and the model walk,
exercised with a format written here (no serving library needed)."""
import pytest
import torch

import fakequant
from fakequant import nn as quant_nn
from fakequant.serve import FORMATS, _base
from fakequant.serve._plan import plan_model
from fakequant.tensor_quant import QuantDescriptor


class _Plain(_base.ServingFormat):
    """Stores the quantizer's output itself (or, with ``off``, its output plus one ulp somewhere)."""

    name = "plain"
    package = "fakequant_no_such_module"
    distribution = "no-such-package"

    def __init__(self, off=False):
        self.off = off

    def weight(self, where, q, weight):
        with torch.no_grad():
            y = q(weight.detach())
        if self.off:
            y = y.clone()
            y.view(-1)[0] = torch.nextafter(y.view(-1)[0], torch.tensor(float("inf")))
        return {"kind": "plain"}, {"weight": y}, y

    def input(self, where, q):
        return (None, {}) if not q.is_enabled else ({"bits": q.num_bits}, {})


def test_the_formats_are_found_by_name():
    assert FORMATS == ("compressed-tensors", "gguf") == _base.formats()
    assert type(_base.format_named("gguf")).__name__ == "GGUF"
    for bad in ("onnx", None, 3):
        with pytest.raises(ValueError, match=r"format must be one of \['compressed-tensors', 'gguf'\], got"):
            _base.format_named(bad)
    with pytest.raises(ValueError, match="format must be one of"):  # the public entry point says the same
        fakequant.export_checkpoint(torch.nn.Linear(2, 2), "unused", format="GGUF")


def test_register_adds_a_format_once(monkeypatch):
    monkeypatch.setattr(_base, "_FORMATS", dict(_base._FORMATS))
    assert _base.register(_Plain) is _Plain
    assert isinstance(_base.format_named("plain"), _Plain) and _base.formats()[-1] == "plain"
    with pytest.raises(ValueError, match="a serving format named 'plain' is registered already"):
        _base.register(_Plain)


def test_the_refusal_is_a_value_error_naming_what_and_the_format():
    e = _Plain().refuse("model.layers.0.mlp.up_proj.weight_quantizer", "a reason")
    assert isinstance(e, ValueError) and isinstance(e, _base.ExportRefused)
    assert str(e) == ("model.layers.0.mlp.up_proj.weight_quantizer: a reason; plain cannot describe it "
                      "(nothing was written)")
    assert str(_base.refusal("m.experts", "why")) == "m.experts: why (nothing was written)"


def test_bits_equal_sees_the_sign_of_zero_dtype_and_shape():
    a = torch.tensor([0.0, 1.5])
    assert _base.bits_equal(a, a.clone())
    assert not _base.bits_equal(a, torch.tensor([-0.0, 1.5]))  # == would say equal
    assert not _base.bits_equal(a, a.double())
    assert not _base.bits_equal(a, a.reshape(2, 1))
    nan = torch.tensor([float("nan")])
    assert _base.bits_equal(nan, nan.clone())  # == would say unequal


def test_the_import_guard_names_the_format_and_the_package():
    with pytest.raises(ImportError, match=r"format='plain' needs the no-such-package package \(pip install "
                                          r"'fakequant\[serve\]' or pip install no-such-package\)"):
        _Plain().library()


def _model():
    torch.manual_seed(0)
    desc = QuantDescriptor(num_bits=8, axis=(0,))
    return torch.nn.Sequential(quant_nn.QuantLinear(32, 16, quant_desc_weight=desc),
                               torch.nn.ReLU(), torch.nn.Linear(16, 4))


def test_the_walk_plans_each_quantized_linear_and_lists_the_float_ones():
    model = _model()
    planned = plan_model(model, _Plain())
    assert list(planned.plans) == ["0"] and planned.ignore == ["2"]
    p = planned.plans["0"]
    assert p.weights == {"kind": "plain"} and p.inputs == {"bits": 8} and p.shape == (16, 32)
    with torch.no_grad():
        assert _base.bits_equal(p.tensors["weight"], model[0].weight_quantizer(model[0].weight))


def test_the_walk_refuses_before_anything_is_planned():
    with pytest.raises(_base.ExportRefused, match=r"^0\.weight_quantizer: its codes times its scales do not "
                                                  r"reproduce its output bit for bit"):
        plan_model(_model(), _Plain(off=True))  # one ulp off: refused
    model = _model()
    model[0].weight_quantizer.disable()
    with pytest.raises(ValueError, match=r"^0\.input_quantizer: quantized inputs with float weights; plain"):
        plan_model(model, _Plain())
    model = torch.nn.Sequential(_model(), quant_nn.QuantConv1d(2, 2, 1))
    with pytest.raises(ValueError, match=r"^1\._input_quantizer: a quantizer outside the Linear layers"):
        plan_model(model, _Plain())
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        plan_model("model", _Plain())
