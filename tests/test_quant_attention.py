"""QuantMultiheadAttention: nn.MultiheadAttention with quantized inputs, in-projection
weights and out_proj; bit-exact with the float module when its quantizers are disabled,
and with a reference written from fakequant's functions when they are enabled."""
import pytest
import torch
from torch import nn
from torch.nn import functional as F

import fakequant
from fakequant import nn as quant_nn
from fakequant import quant_modules
from fakequant.tensor_quant import QuantDescriptor, fake_tensor_quant
from conftest import assert_same


def _quantizers(module):
    return [m for m in module.modules() if isinstance(m, quant_nn.TensorQuantizer)]


def _converted(float_mha, **kwargs):
    return fakequant.quantize_model(nn.Sequential(float_mha), exclude=[], **kwargs)[0]


CASES = [  # (batch_first, kdim, self-attention, forward keywords)
    (False, None, True, {}),
    (True, None, True, {"need_weights": False}),
    (True, None, False, {"key_padding_mask": True}),
    (False, None, False, {"attn_mask": True, "need_weights": False}),
    (True, 12, False, {"average_attn_weights": False}),
    (False, 12, False, {"key_padding_mask": True, "need_weights": False}),
    (True, None, True, {"attn_mask": True, "is_causal": True, "need_weights": False}),
]


def _inputs(batch_first, kdim, self_attention, keywords, L=5, S=7, N=3, E=16):
    x = torch.randn((N, L, E) if batch_first else (L, N, E))
    if self_attention:
        key = value = x
        S = L
    else:
        key = value = torch.randn((N, S, kdim or E) if batch_first else (S, N, kdim or E))
    kw = dict(keywords)
    if kw.get("key_padding_mask"):
        kw["key_padding_mask"] = torch.rand(N, S) > 0.7
    if kw.get("attn_mask"):
        kw["attn_mask"] = (nn.Transformer.generate_square_subsequent_mask(L) if kw.get("is_causal")
                           else torch.randn(L, S))
    return (x, key, value), kw


@pytest.mark.parametrize("batch_first, kdim, self_attention, keywords", CASES)
def test_disabled_is_bit_exact_with_the_float_module(batch_first, kdim, self_attention, keywords):
    mha = nn.MultiheadAttention(16, 4, batch_first=batch_first, kdim=kdim, vdim=kdim).train()
    quant = _converted(mha)
    assert isinstance(quant, quant_nn.QuantMultiheadAttention) and isinstance(quant.out_proj, quant_nn.QuantLinear)
    assert quant.in_proj_weight is mha.in_proj_weight and quant.out_proj.weight is mha.out_proj.weight
    for q in _quantizers(quant):
        q.disable()
    args, kw = _inputs(batch_first, kdim, self_attention, keywords)
    expected, expected_weights = mha(*args, **kw)  # (training mode: torch's reference path, dropout 0)
    out, weights = quant(*args, **kw)
    assert_same(out, expected)
    if expected_weights is None:
        assert weights is None
    else:
        assert_same(weights, expected_weights)


def test_unbatched_input():
    mha = nn.MultiheadAttention(16, 4)
    quant = _converted(mha)
    for q in _quantizers(quant):
        q.disable()
    x = torch.randn(5, 16)
    for expected, got in zip(mha(x, x, x), quant(x, x, x)):
        assert_same(got, expected)


def test_enabled_matches_a_reference_from_fakequant_functions():
    E, H = 16, 4
    mha = nn.MultiheadAttention(E, H, batch_first=True).train()
    quant = _converted(mha, quant_desc_input=QuantDescriptor(num_bits=8, narrow_range=True),
                       quant_desc_weight=QuantDescriptor(num_bits=8, axis=0, narrow_range=True))
    amax = {"_input_quantizer": 2.0, "_key_input_quantizer": 2.5, "_value_input_quantizer": 3.0}
    for name, value in amax.items():
        getattr(quant, name).amax = value
    quant.out_proj.input_quantizer.amax = 0.75
    assert len(_quantizers(quant)) == 6  # q/k/v inputs, in_proj weight, out_proj input and weight
    x = torch.randn(2, 5, E)
    out, _ = quant(x, x, x, need_weights=False)

    def per_row(w):  # the weight quantizers are dynamic per output channel
        return fake_tensor_quant(w, w.abs().amax(dim=1, keepdim=True))

    w_q, w_k, w_v = per_row(mha.in_proj_weight).chunk(3)
    b_q, b_k, b_v = mha.in_proj_bias.chunk(3)
    q = F.linear(fake_tensor_quant(x, torch.tensor(2.0)), w_q, b_q)
    k = F.linear(fake_tensor_quant(x, torch.tensor(2.5)), w_k, b_k)
    v = F.linear(fake_tensor_quant(x, torch.tensor(3.0)), w_v, b_v)

    def heads(t):  # (N, L, E) -> (N, H, L, E / H), through the layout the module uses
        return t.transpose(0, 1).reshape(5, 2 * H, E // H).transpose(0, 1).view(2, H, 5, E // H)

    attn = F.scaled_dot_product_attention(heads(q), heads(k), heads(v))
    attn = attn.permute(2, 0, 1, 3).reshape(10, E)
    expected = F.linear(fake_tensor_quant(attn, torch.tensor(0.75)), per_row(mha.out_proj.weight),
                        mha.out_proj.bias).view(5, 2, E).transpose(0, 1)
    assert_same(out, expected)
    # and the gradient reaches every parameter
    out.sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in quant.parameters())


def test_separate_projection_weights_have_their_own_quantizers():
    quant = _converted(nn.MultiheadAttention(16, 4, kdim=8, vdim=12))
    names = {n for n, m in quant.named_modules() if isinstance(m, quant_nn.TensorQuantizer)}
    assert names == {"_input_quantizer", "_key_input_quantizer", "_value_input_quantizer", "_weight_quantizer",
                     "_k_weight_quantizer", "_v_weight_quantizer", "out_proj._input_quantizer",
                     "out_proj._weight_quantizer"}


def test_constructor_and_initialize():
    mha = quant_nn.QuantMultiheadAttention(16, 2, quant_desc_input=QuantDescriptor(num_bits=6))
    assert mha.input_quantizer.num_bits == 6 and mha.out_proj.input_quantizer.num_bits == 6
    with quant_modules.initialize():
        assert isinstance(nn.MultiheadAttention(16, 2), quant_nn.QuantMultiheadAttention)
    assert type(nn.MultiheadAttention(16, 2)) is not quant_nn.QuantMultiheadAttention
    with pytest.raises(ValueError, match="bias_k"):
        quant_nn.QuantMultiheadAttention(16, 2, add_bias_kv=True)
    # left in float on request
    net = fakequant.quantize_model(nn.Sequential(nn.MultiheadAttention(16, 2)), float_module_list=["MultiheadAttention"])
    assert type(net[0]) is nn.MultiheadAttention
