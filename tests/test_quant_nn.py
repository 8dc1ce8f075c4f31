"""Quantized modules equal their float modules on fake-quantized input (and weight)."""
import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.utils.rnn import pack_padded_sequence

from fakequant import nn as quant_nn
from fakequant import tensor_quant
from fakequant.nn import TensorQuantizer
from fakequant.nn.modules import _utils as modules_utils
from fakequant.tensor_quant import QuantDescriptor

import reference
from conftest import DEVICES, DTYPES, bits_equal

IN_DESC = QuantDescriptor(num_bits=8, amax=2.0)


def fq(x, amax, num_bits=8, narrow=False):
    return reference.fake_quantize_amax(x, amax, num_bits, False, narrow)[0]


def per_channel_amax(w, axis):
    dims = [d for d in range(w.dim()) if d != axis]
    return w.detach().abs().amax(dim=dims, keepdim=True)


CONVS = [
    (quant_nn.QuantConv1d, nn.Conv1d, (2, 4, 9), dict(padding=1)),
    (quant_nn.QuantConv2d, nn.Conv2d, (2, 4, 7, 6), dict(stride=2, padding=1, groups=2)),
    (quant_nn.QuantConv2d, nn.Conv2d, (1, 4, 6, 6), dict(padding=2, padding_mode="reflect")),
    (quant_nn.QuantConv2d, nn.Conv2d, (1, 4, 6, 6), dict(padding=1, padding_mode="circular", bias=False)),
    (quant_nn.QuantConv3d, nn.Conv3d, (1, 4, 4, 5, 5), dict(dilation=2, padding=2)),
    (quant_nn.QuantConvTranspose1d, nn.ConvTranspose1d, (2, 4, 5), dict(stride=2, output_padding=1)),
    (quant_nn.QuantConvTranspose2d, nn.ConvTranspose2d, (2, 4, 4, 3), dict(stride=2, groups=2)),
    (quant_nn.QuantConvTranspose3d, nn.ConvTranspose3d, (1, 4, 3, 3, 3), dict(padding=1)),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("quant_cls, float_cls, shape, kwargs", CONVS)
def test_conv_equals_float_conv_on_quantized_tensors(device, quant_cls, float_cls, shape, kwargs):
    qm = quant_cls(4, 6, 3, quant_desc_input=IN_DESC, **kwargs).to(device)
    fm = float_cls(4, 6, 3, **kwargs).to(device)
    fm.load_state_dict({k: v for k, v in qm.state_dict().items() if "quantizer" not in k})
    x = (torch.randn(shape, device=device) * 2).requires_grad_()
    out = qm(x)
    # per output channel, pytorch-quantization's default: axis 0 of a convolution's weight
    # (out, in / groups, *k), axis 1 of a transposed convolution's (in, out / groups, *k)
    w_amax = per_channel_amax(qm.weight, 1 if qm.transposed else 0)
    with torch.no_grad():
        fm.weight.copy_(fq(qm.weight, w_amax))
    expected = fm(fq(x.detach(), torch.tensor(2.0, device=device)))
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    out.sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    assert qm.weight.grad is not None and qm.weight.grad.abs().sum() > 0
    assert isinstance(qm, float_cls)
    assert set(qm.state_dict()) == set(fm.state_dict()) | {"_input_quantizer._amax"}


@pytest.mark.parametrize("cls, dims", [(quant_nn.ConvTranspose1d, 1), (quant_nn.ConvTranspose2d, 2),
                                       (quant_nn.ConvTranspose3d, 3)])
def test_conv_transpose_weight_is_calibrated_per_output_channel(cls, dims):
    # weight (in=4, out/groups=3, *k): one amax per output channel, axis 1, from the
    # quantizer's own calibrator as from calibrate_weights
    qm = cls(4, 6, 2, groups=2)
    assert qm.weight_quantizer.axis == 1
    qm.weight_quantizer.enable_calib()
    qm.weight_quantizer.disable_quant()
    qm(torch.randn((1, 4) + (3,) * dims))
    qm.weight_quantizer.load_calib_amax()
    expected = per_channel_amax(qm.weight, 1)
    assert expected.shape == (1, 3) + (1,) * dims
    assert bits_equal(qm.weight_quantizer.amax, expected)


@pytest.mark.parametrize("device", DEVICES)
def test_conv_transpose_output_size(device):
    qm = quant_nn.ConvTranspose2d(3, 2, 3, stride=2).to(device)
    out = qm(torch.randn(1, 3, 4, 4, device=device), output_size=[10, 10])
    assert out.shape[-2:] == (10, 10)
    qm.padding_mode = "reflect"
    with pytest.raises(ValueError, match="padding_mode"):
        qm(torch.randn(1, 3, 4, 4, device=device))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_linear(device, dtype):
    qm = quant_nn.Linear(5, 3, quant_desc_input=IN_DESC).to(device, dtype)
    x = torch.randn(4, 2, 5, device=device, dtype=dtype, requires_grad=True)
    out = qm(x)
    expected = F.linear(fq(x.detach(), torch.tensor(2.0)), fq(qm.weight.detach(), per_channel_amax(qm.weight, 0)),
                        qm.bias)
    assert out.dtype == dtype
    torch.testing.assert_close(out, expected)
    out.sum().backward()
    assert x.grad.abs().sum() > 0 and qm.weight.grad.abs().sum() > 0 and qm.bias.grad is not None
    assert quant_nn.Linear is quant_nn.QuantLinear


POOLS = [
    (quant_nn.QuantMaxPool1d, nn.MaxPool1d, (2, 3, 8), (2,)),
    (quant_nn.QuantMaxPool2d, nn.MaxPool2d, (2, 3, 8, 8), (3,)),
    (quant_nn.QuantMaxPool3d, nn.MaxPool3d, (1, 2, 4, 4, 4), (2,)),
    (quant_nn.QuantAvgPool1d, nn.AvgPool1d, (2, 3, 8), (2,)),
    (quant_nn.QuantAvgPool2d, nn.AvgPool2d, (2, 3, 8, 8), (3,)),
    (quant_nn.QuantAvgPool3d, nn.AvgPool3d, (1, 2, 4, 4, 4), (2,)),
    (quant_nn.QuantAdaptiveAvgPool1d, nn.AdaptiveAvgPool1d, (2, 3, 8), (3,)),
    (quant_nn.QuantAdaptiveAvgPool2d, nn.AdaptiveAvgPool2d, (2, 3, 8, 8), ((2, 3),)),
    (quant_nn.QuantAdaptiveAvgPool3d, nn.AdaptiveAvgPool3d, (1, 2, 4, 4, 4), (1,)),
    (quant_nn.QuantInstanceNorm1d, nn.InstanceNorm1d, (2, 3, 8), (3,)),
    (quant_nn.QuantInstanceNorm2d, nn.InstanceNorm2d, (2, 3, 5, 5), (3,)),
    (quant_nn.QuantInstanceNorm3d, nn.InstanceNorm3d, (1, 2, 3, 4, 4), (2,)),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("quant_cls, float_cls, shape, args", POOLS)
def test_input_only_modules(device, quant_cls, float_cls, shape, args):
    qm = quant_cls(*args, quant_desc_input=IN_DESC).to(device)
    fm = float_cls(*args).to(device)
    x = (torch.randn(shape, device=device) * 2).requires_grad_()
    out = qm(x)
    torch.testing.assert_close(out, fm(fq(x.detach(), torch.tensor(2.0))), rtol=1e-5, atol=1e-5)
    out.pow(2).sum().backward()
    assert x.grad.abs().sum() > 0
    assert isinstance(qm, float_cls) and not hasattr(qm, "_weight_quantizer")
    with pytest.raises(TypeError, match="quant_desc_weight"):
        quant_cls(*args, quant_desc_weight=IN_DESC)


def test_instancenorm_affine_keeps_parameters():
    qm = quant_nn.QuantInstanceNorm2d(3, affine=True, track_running_stats=True)
    assert set(qm.state_dict()) == {"weight", "bias", "running_mean", "running_var", "num_batches_tracked"}


def test_short_aliases():
    assert quant_nn.Conv2d is quant_nn.QuantConv2d and quant_nn.MaxPool2d is quant_nn.QuantMaxPool2d
    assert quant_nn.LSTM is quant_nn.QuantLSTM and quant_nn.AdaptiveAvgPool2d is quant_nn.QuantAdaptiveAvgPool2d
    assert quant_nn.InstanceNorm2d is quant_nn.QuantInstanceNorm2d


def test_default_descriptors_and_setters():
    m = quant_nn.QuantConv2d(2, 4, 1)
    assert m.input_quantizer.axis is None and m.weight_quantizer.axis == 0
    saved = quant_nn.QuantConv2d.default_quant_desc_input
    try:
        quant_nn.QuantConv2d.set_default_quant_desc_input(QuantDescriptor(num_bits=6, calib_method="histogram"))
        m = quant_nn.QuantConv2d(2, 4, 1)
        assert m.input_quantizer.num_bits == 6
        assert quant_nn.QuantLinear(2, 2).input_quantizer.num_bits == 8  # per class
    finally:
        quant_nn.QuantConv2d.default_quant_desc_input = saved
    with pytest.raises(TypeError, match="QuantDescriptor"):
        quant_nn.QuantConv2d.set_default_quant_desc_weight({"num_bits": 8})
    with pytest.raises(ValueError, match="fake"):
        quant_nn.QuantLinear(2, 2, quant_desc_weight=QuantDescriptor(fake_quant=False))


def test_constructor_passes_torch_arguments():
    m = quant_nn.QuantConv2d(2, 4, 3, bias=False, dtype=torch.float64)
    assert m.weight.dtype == torch.float64 and m.bias is None
    with pytest.raises(TypeError):
        quant_nn.QuantLinear(2, 2, quant_desc_bias=IN_DESC)


def test_keyword_arguments_reach_torch():
    # (tests/test_pq_messages.py: the others are refused, "Unused keys")
    m = quant_nn.QuantLinear(4, 3, bias=False, dtype=torch.float64, quant_desc_input=QuantDescriptor(num_bits=4))
    assert m.bias is None and m.weight.dtype == torch.float64 and m.input_quantizer.num_bits == 4
    assert quant_nn.QuantConv2d(2, 3, 3, padding_mode="reflect").padding_mode == "reflect"
    lstm = quant_nn.QuantLSTM(4, 3, num_layers=2, batch_first=True, bidirectional=True)
    assert lstm.num_layers == 2 and lstm.batch_first and len(lstm._input_quantizers) == 4


def test_functional_clip_with_tensor_bounds_without_grad():
    # (with grad, a bound must be scalar: tests/test_pq_messages.py)
    x = torch.randn(2, 3, requires_grad=True)
    quant_nn.functional.clip(x, -torch.ones(3), torch.ones(3)).sum().backward()
    assert x.grad is not None


def test_pop_quant_desc_in_kwargs():
    d_in, d_w = quant_nn.pop_quant_desc_in_kwargs(quant_nn.QuantConv2d)
    assert d_in == tensor_quant.QUANT_DESC_8BIT_PER_TENSOR and d_w.axis == 0
    assert quant_nn.pop_quant_desc_in_kwargs(quant_nn.QuantMaxPool2d, input_only=True, quant_desc_input=IN_DESC) \
        is IN_DESC
    with pytest.raises(TypeError, match="unused"):
        quant_nn.pop_quant_desc_in_kwargs(quant_nn.QuantConv2d, foo=1)


def test_custom_module_with_mixins():
    class QuantAdd(nn.Module, modules_utils.QuantInputMixin):
        def __init__(self):
            super().__init__()
            self.init_quantizer(IN_DESC)

        def forward(self, a, b):
            return self._input_quantizer(a) + self._input_quantizer(b)

    m = QuantAdd()
    a, b = torch.randn(5), torch.randn(5)
    assert bits_equal(m(a, b), fq(a, torch.tensor(2.0)) + fq(b, torch.tensor(2.0)))
    assert isinstance(m.input_quantizer, TensorQuantizer)


# --- LSTM ---------------------------------------------------------------------------


def disable_quantizers(module):
    for m in module.modules():
        if isinstance(m, TensorQuantizer):
            m.disable()


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_lstm_without_quantization_equals_torch(batch_first, bidirectional):
    kwargs = dict(num_layers=2, bidirectional=bidirectional, batch_first=batch_first)
    fm, qm = nn.LSTM(5, 6, **kwargs), quant_nn.QuantLSTM(5, 6, **kwargs)
    qm.load_state_dict(fm.state_dict())
    disable_quantizers(qm)
    x = torch.randn(3, 4, 5)
    h0 = torch.randn(2 * (2 if bidirectional else 1), 4 if not batch_first else 3, 6)
    c0 = torch.randn_like(h0)
    for a, b in zip(torch.utils._pytree.tree_leaves(fm(x, (h0, c0))), torch.utils._pytree.tree_leaves(qm(x, (h0, c0)))):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    # packed, unsorted lengths
    p = pack_padded_sequence(torch.randn(4, 4, 5) if not batch_first else torch.randn(4, 4, 5).transpose(0, 1),
                             torch.tensor([4, 1, 3, 2]), batch_first=batch_first, enforce_sorted=False)
    h0 = torch.randn(2 * (2 if bidirectional else 1), 4, 6)
    (o1, (h1, c1)), (o2, (h2, c2)) = fm(p, (h0, h0)), qm(p, (h0, h0))
    torch.testing.assert_close(o1.data, o2.data, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(h1, h2, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(c1, c2, rtol=1e-5, atol=1e-6)
    # unbatched
    torch.testing.assert_close(fm(x[:, 0])[0], qm(x[:, 0])[0], rtol=1e-5, atol=1e-6)


def lstm_reference(x, w_ih, w_hh, b_ih, b_hh, in_amax, w_amax, hidden):
    """One direction, one layer, quantized as pytorch-quantization documents."""
    w = fq(torch.cat([w_ih, w_hh], 1), w_amax)
    w_ih, w_hh = w[:, :w_ih.size(1)], w[:, w_ih.size(1):]
    h = c = x.new_zeros(x.size(1), hidden)
    outs = []
    for t in range(x.size(0)):
        xh = fq(torch.cat([x[t], h], 1), in_amax)
        gates = xh[:, :x.size(2)] @ w_ih.T + b_ih + xh[:, x.size(2):] @ w_hh.T + b_hh
        i, f, g, o = gates.chunk(4, 1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        outs.append(h)
    return torch.stack(outs), h, c


def test_quantized_lstm_matches_reference():
    qm = quant_nn.QuantLSTM(4, 3, quant_desc_input=QuantDescriptor(amax=1.5))
    qm._weight_quantizers[0].amax = torch.full((12, 1), 0.4)
    x = torch.randn(5, 2, 4, requires_grad=True)
    out, (h, c) = qm(x)
    ref_out, ref_h, ref_c = lstm_reference(x.detach(), qm.weight_ih_l0.detach(), qm.weight_hh_l0.detach(),
                                           qm.bias_ih_l0.detach(), qm.bias_hh_l0.detach(), torch.tensor(1.5),
                                           torch.full((12, 1), 0.4), 3)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(h[0], ref_h)
    torch.testing.assert_close(c[0], ref_c)
    out.sum().backward()
    assert x.grad.abs().sum() > 0 and qm.weight_ih_l0.grad.abs().sum() > 0 and qm.weight_hh_l0.grad.abs().sum() > 0
    keys = set(qm.state_dict())
    assert {"_input_quantizers.0._amax", "_weight_quantizers.0._amax", "weight_ih_l0"} <= keys


def test_lstm_cell():
    fm, qm = nn.LSTMCell(4, 3), quant_nn.QuantLSTMCell(4, 3, quant_desc_input=QuantDescriptor(amax=1.5))
    qm.load_state_dict(fm.state_dict(), strict=False)
    x = torch.randn(2, 4, requires_grad=True)
    h, c = qm(x)
    _, ref_h, ref_c = lstm_reference(x.detach().unsqueeze(0), qm.weight_ih.detach(), qm.weight_hh.detach(),
                                     qm.bias_ih.detach(), qm.bias_hh.detach(), torch.tensor(1.5),
                                     per_channel_amax(torch.cat([qm.weight_ih, qm.weight_hh], 1), 0), 3)
    torch.testing.assert_close(h, ref_h)
    torch.testing.assert_close(c, ref_c)
    (h.sum() + c.sum()).backward()
    assert x.grad.abs().sum() > 0 and qm.weight_ih.grad.abs().sum() > 0
    disable_quantizers(qm)
    for a, b in zip(fm(x[0]), qm(x[0])):  # unbatched
        torch.testing.assert_close(a, b)
    with pytest.raises(ValueError, match="input_size"):
        qm(torch.randn(2, 5))


def test_lstm_rejects_projection_and_bad_shapes():
    with pytest.raises(ValueError, match="proj_size"):
        quant_nn.QuantLSTM(4, 3, proj_size=2)
    qm = quant_nn.QuantLSTM(4, 3)
    with pytest.raises(ValueError, match="h_0"):
        qm(torch.randn(2, 2, 4), (torch.zeros(1, 3, 3), torch.zeros(1, 3, 3)))
    with pytest.raises(ValueError, match="input_size"):
        qm(torch.randn(2, 2, 5))
