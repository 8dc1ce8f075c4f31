"""Per-token (per-row) dynamic quantization, spelled as Model Optimizer spells it
(``type="dynamic", block_sizes={-1: None}``), and the named presets."""
import pytest
import torch

import fakequant
from fakequant import presets
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


@pytest.mark.parametrize("name", ["W8A8", "W4A8", "INT8", "FP8", "FP8_PER_CHANNEL", "NVFP4"])
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
