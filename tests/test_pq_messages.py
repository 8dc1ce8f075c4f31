"""pytorch-quantization 2.2.1's words, kept inside fakequant's messages where 2.2.1 raised.

Scripts and their tests match these words (``pytest.raises(..., match=...)``); each case
is the 2.2.1 call, its exception type and the words its message holds. fakequant's message
says more (the argument, the value, what is allowed), around them.
"""
import numpy as np
import pytest
import torch

from fakequant import calib, optim, tensor_quant
from fakequant import nn as quant_nn
from fakequant.nn import functional as quant_F
from fakequant.tensor_quant import QuantDescriptor


@pytest.mark.parametrize("make", [
    lambda d: quant_nn.QuantLinear(4, 3, quant_desc_input=d),
    lambda d: quant_nn.QuantConv2d(2, 3, 3, quant_desc_weight=d),
    lambda d: quant_nn.QuantMaxPool2d(2, quant_desc_input=d),
    lambda d: quant_nn.QuantLinear.set_default_quant_desc_weight(d),
])
def test_real_quantization_in_a_module(make):
    with pytest.raises(ValueError, match="Only fake quantization is supported") as info:
        make(QuantDescriptor(fake_quant=False))
    assert "fake_quant" in str(info.value)


@pytest.mark.parametrize("make", [
    lambda: quant_nn.QuantLinear(4, 3, quant_desc_bogus=1),
    lambda: quant_nn.QuantConv2d(2, 3, 3, bogus=True),
    lambda: quant_nn.QuantConvTranspose1d(2, 3, 3, bogus=True),
    lambda: quant_nn.QuantAvgPool2d(2, bogus=True),
    lambda: quant_nn.QuantLSTMCell(4, 3, bogus=True),
    lambda: quant_nn.QuantLSTM(4, 3, bogus=True),
    lambda: quant_nn.QuantMultiheadAttention(4, 2, bogus=True),
    lambda: quant_nn.pop_quant_desc_in_kwargs(quant_nn.QuantLinear, bogus=True),
])
def test_unknown_keyword_arguments_of_a_module(make):
    with pytest.raises(TypeError, match="Unused keys") as info:
        make()
    assert "bogus" in str(info.value)


@pytest.mark.parametrize("amax", ["1.0", {"a": 1}, object(), True])
def test_descriptor_amax_of_another_type(amax):
    with pytest.raises(TypeError, match="must be float, list or ndarray") as info:
        QuantDescriptor(amax=amax)
    assert "amax" in str(info.value)


def test_fp16_scale_overflow():
    x = torch.randn(64).half()
    with pytest.raises(ValueError, match="scale is too large for FP16"):
        tensor_quant.tensor_quant(x, torch.tensor(1e-4), 8, False)
    with pytest.raises(ValueError, match="scale is too large for FP16"):
        tensor_quant.TensorQuantFunction.apply(x, torch.tensor(1e-4), 8, False)


@pytest.mark.parametrize("percentile", [-0.5, 100.5, 1000])
def test_percentile_out_of_range(percentile):
    c = calib.HistogramCalibrator(8, None, False)
    c.collect(torch.randn(100))
    with pytest.raises(ValueError, match="range") as info:
        c.compute_amax("percentile", percentile=percentile)
    assert "percentile" in str(info.value)


def test_load_calib_amax_with_nothing_collected():
    for method in ("max", "histogram"):
        q = quant_nn.TensorQuantizer(QuantDescriptor(calib_method=method))
        args = () if method == "max" else ("percentile",)
        with pytest.raises(RuntimeError, match="Calibrator returned None"):
            q.load_calib_amax(*args)
        with pytest.warns(UserWarning, match="Calibrator returned None"):
            q.load_calib_amax(*args, strict=False)
        assert q.amax is None


@pytest.mark.parametrize("learn_min, learn_max", [(True, False), (False, True), (True, True)])
def test_learnable_clip_with_tensor_bounds(learn_min, learn_max):
    with pytest.raises(ValueError, match="must be scalar"):
        quant_nn.Clip(-torch.ones(3), torch.ones(3), learn_min=learn_min, learn_max=learn_max)


@pytest.mark.parametrize("which", ["min", "max"])
def test_functional_clip_with_tensor_bounds_that_require_grad(which):
    x = torch.randn(2, 3, requires_grad=True)
    lo, hi = -torch.ones(3), torch.ones(3)
    bound = lo if which == "min" else hi
    bound.requires_grad_(True)
    y = quant_F.clip(x, lo, hi)  # (the forward broadcasts the bounds)
    # (a ValueError, as pytorch-quantization's, and a RuntimeError, as autograd's before)
    with pytest.raises(ValueError, match="can only be scalar") as info:
        y.sum().backward()
    assert isinstance(info.value, RuntimeError)
    assert f"clip_value_{which}" in str(info.value)


@pytest.mark.parametrize("patterns_list", [[["fc"], "bias"], "fc", None])
def test_group_parameters_checks_its_patterns_first(patterns_list):
    # before the model (None here) and before the per-group values
    with pytest.raises(TypeError, match="must be list of list of patterns"):
        optim.helper.group_parameters(None, patterns_list, lrs=[0.1])


def test_group_parameters_checks_each_pattern_first():
    with pytest.raises(TypeError, match="regular expressions"):
        optim.helper.group_parameters(None, [["fc"], [1]], lrs=[0.1])


def test_group_parameters_checks_lengths_before_the_model():
    with pytest.raises(TypeError, match="must match"):
        optim.helper.group_parameters(None, [["fc"], ["conv"]], lrs=[0.1])


@pytest.mark.parametrize("learn_min, learn_max", [(True, False), (False, True), (True, True)])
@pytest.mark.parametrize("make", [torch.tensor, lambda v: torch.tensor([v])])
def test_learnable_clip_with_one_element_tensor_bounds(make, learn_min, learn_max):
    # 2.2.1 refuses a tensor for a learnable bound whatever its size
    with pytest.raises(ValueError, match="must be scalar"):
        quant_nn.Clip(make(0.3), make(0.7), learn_min=learn_min, learn_max=learn_max)
    # numbers (and NumPy values) are taken; fixed bounds may be tensors
    clip = quant_nn.Clip(-0.3, np.float32(0.7), learn_min=learn_min, learn_max=learn_max)
    assert clip.clip_value_min.shape == () and clip.clip_value_max.shape == ()
    assert quant_nn.Clip(make(0.3), torch.ones(3)).clip_value_max.shape == (3,)
