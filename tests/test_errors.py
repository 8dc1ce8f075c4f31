"""Bad input raises a Python exception whose message names the argument; nothing aborts."""
import pytest
import torch

import fakequant

ops = torch.ops.fakequant
x = torch.randn(4, 3, 5)
s1, z1 = torch.tensor([0.1]), torch.tensor([0], dtype=torch.int32)
amax = torch.tensor(1.0)


def affine(**kw):
    args = dict(input=x, scale=s1, zero_point=z1, axis=None, quant_min=-128, quant_max=127)
    args.update(kw)
    return ops.fake_quantize_affine(*args.values())


BAD_AFFINE = [
    (dict(scale=torch.tensor([0.0])), ValueError, "scale"),
    (dict(scale=torch.tensor([-0.5])), ValueError, "scale"),
    (dict(scale=torch.tensor([float("nan")])), ValueError, "scale"),
    (dict(scale=torch.tensor([float("inf")])), ValueError, "scale"),
    (dict(scale=torch.tensor([1e-50], dtype=torch.float64)), ValueError, "scale"),  # 0 as float32
    (dict(quant_min=10, quant_max=5), ValueError, "quant_min"),
    (dict(quant_min=-(2**40)), ValueError, "quant_min"),
    (dict(zero_point=torch.tensor([200])), ValueError, "zero_point"),
    (dict(zero_point=torch.tensor([0.5])), ValueError, "zero_point"),
    (dict(zero_point=torch.tensor([True])), TypeError, "zero_point"),
    (dict(axis=3, scale=torch.ones(3), zero_point=torch.zeros(3)), IndexError, "axis"),
    (dict(axis=-4, scale=torch.ones(3), zero_point=torch.zeros(3)), IndexError, "axis"),
    (dict(axis=1, scale=torch.ones(4), zero_point=torch.zeros(4)), ValueError, "scale"),
    (dict(axis=1, scale=torch.ones(3), zero_point=torch.zeros(2)), ValueError, "zero_point"),
    (dict(scale=torch.ones(2), zero_point=torch.zeros(2)), ValueError, "scale"),
    (dict(input=torch.ones(3, dtype=torch.int32)), TypeError, "input"),
    (dict(input=torch.ones(3, dtype=torch.complex64)), TypeError, "input"),
    (dict(scale=torch.tensor([1], dtype=torch.int32)), TypeError, "scale"),
    (dict(scale=torch.tensor([1.0], device="meta")), ValueError, "scale"),
    (dict(zero_point=torch.tensor([0], device="meta")), ValueError, "zero_point"),
]


@pytest.mark.parametrize("kwargs,exc,name", BAD_AFFINE)
def test_bad_affine_arguments(kwargs, exc, name):
    with pytest.raises(exc, match=name):
        affine(**kwargs)


BAD_AMAX = [
    (dict(amax=torch.tensor(-1.0)), ValueError, "amax"),
    (dict(amax=torch.tensor(float("nan"))), ValueError, "amax"),
    (dict(amax=torch.tensor([1.0, -2.0, 1.0])), ValueError, "amax"),
    (dict(amax=torch.ones(4, 1, 2)), ValueError, "amax"),  # not broadcastable
    (dict(amax=torch.ones(4, 3, 5, 1)), ValueError, "amax"),  # more dims than input
    (dict(amax=torch.ones(4, 2, 1)), ValueError, "amax"),
    (dict(amax=torch.tensor(1, dtype=torch.int64)), TypeError, "amax"),
    (dict(num_bits=1), ValueError, "num_bits"),
    (dict(num_bits=17), ValueError, "num_bits"),
    (dict(input=torch.ones(3, dtype=torch.int64)), TypeError, "input"),
    (dict(amax=torch.tensor(1.0, device="meta")), ValueError, "amax"),
]


@pytest.mark.parametrize("op", [ops.fake_quantize_amax, ops.quantize_amax])
@pytest.mark.parametrize("kwargs,exc,name", BAD_AMAX)
def test_bad_amax_arguments(op, kwargs, exc, name):
    args = dict(input=x, amax=amax, num_bits=8, unsigned=False, narrow_range=True)
    args.update(kwargs)
    with pytest.raises(exc, match=name):
        op(*args.values())


@pytest.mark.parametrize(
    "kwargs,exc,name",
    [
        (dict(min_range=torch.tensor(1.0), max_range=torch.tensor(1.0)), ValueError, "max_range"),
        (dict(min_range=torch.tensor(2.0), max_range=torch.tensor(1.0)), ValueError, "max_range"),
        (dict(max_range=torch.tensor(float("inf"))), ValueError, "max_range"),
        (dict(min_range=torch.ones(7)), ValueError, "min_range"),
        (dict(max_range=torch.ones(2, 1, 1)), ValueError, "max_range"),
        (dict(num_bits=0), ValueError, "num_bits"),
        (dict(min_range=torch.tensor(0)), TypeError, "min_range"),
    ],
)
def test_bad_min_max_arguments(kwargs, exc, name):
    args = dict(input=x, min_range=torch.tensor(-1.0), max_range=torch.tensor(1.0), num_bits=8)
    args.update(kwargs)
    with pytest.raises(exc, match=name):
        ops.fake_quantize_min_max(*args.values())


@pytest.mark.parametrize(
    "grad,mask,exc,name",
    [
        (torch.ones(10), torch.zeros(1, dtype=torch.uint8), ValueError, "mask"),
        (torch.ones(10), torch.zeros(2, 1, dtype=torch.uint8), ValueError, "mask"),
        (torch.ones(10), torch.zeros(9, dtype=torch.bool), ValueError, "mask"),
        (torch.ones(10), torch.zeros(2, dtype=torch.int32), TypeError, "mask"),
        (torch.ones(10, dtype=torch.int32), torch.zeros(2, dtype=torch.uint8), TypeError, "grad"),
        (torch.ones(10), torch.zeros(2, dtype=torch.uint8, device="meta"), ValueError, "mask"),
    ],
)
def test_bad_mask_backward_arguments(grad, mask, exc, name):
    with pytest.raises(exc, match=name):
        ops.mask_backward(grad, mask)


def test_python_wrappers_raise_the_same():
    with pytest.raises(ValueError, match="scale"):
        fakequant.fake_quantize_per_tensor_affine(x, -1.0, 0, -128, 127)
    with pytest.raises(ValueError, match="quant_min"):
        fakequant.fake_quantize_per_channel_affine(x, torch.ones(3), torch.zeros(3), 1, 5, 0)
    with pytest.raises(ValueError, match="amax"):
        fakequant.fake_quantize_amax(x, -1.0)
    with pytest.raises(ValueError, match="num_bits"):
        fakequant.quantize_amax(x, 1.0, num_bits=40)


# --- the exception types pytorch-quantization 2.2.1 raised, with its words kept --------------


def test_max_calibrator_shape_change_is_a_runtime_error():
    c = fakequant.calib.MaxCalibrator(8, 0, False)
    c.collect(torch.randn(3, 4))
    for exc in (RuntimeError, ValueError):
        with pytest.raises(exc, match="amax shape changed!") as info:
            c.collect(torch.randn(4, 4))
        assert "(3, 1)" in str(info.value) and "(4, 1)" in str(info.value)


@pytest.mark.parametrize("num_bits", [(3, 3), (4, 4), (8, 0), [1, 2]])
def test_unsupported_num_bits_tuple_is_a_type_error(num_bits):
    from fakequant.tensor_quant import QuantDescriptor

    for exc in (TypeError, ValueError):
        with pytest.raises(exc, match=r"num_bits must be a postive integer or tuple \(4,3\)") as info:
            QuantDescriptor(num_bits=num_bits)
        assert "supported (E, M) formats" in str(info.value)
    with pytest.raises(TypeError, match=r"num_bits must be a postive integer or tuple \(4,3\), not <class 'str'>"):
        QuantDescriptor(num_bits="8")


def test_learn_amax_with_axis_is_a_type_error():
    from fakequant.tensor_quant import QuantDescriptor

    for exc in (TypeError, ValueError):
        with pytest.raises(exc, match="axis is ignored and must be None when learn_amax is true") as info:
            QuantDescriptor(learn_amax=True, axis=0)
        assert "axis must be None, got 0" in str(info.value)


@pytest.mark.parametrize("key", ["lrs", "momentums", "weight_decays"])
def test_group_parameters_length_mismatch_is_a_type_error(key):
    from fakequant.optim import group_parameters

    model = torch.nn.Linear(2, 2)
    for exc in (TypeError, ValueError):
        with pytest.raises(exc, match=rf"len\({key}\) must match len\(patterns_list\)") as info:
            group_parameters(model, [["weight"], ["bias"]], **{key: [0.1]})
        assert "1 values for 2 groups" in str(info.value)


def test_optim_helpers_without_a_model_raise_attribute_error():
    # 2.2.1 failed with AttributeError on model.named_parameters(); here on the call, naming model
    from fakequant.optim import freeze_parameters, group_parameters, match_parameters

    for call in (lambda: group_parameters(None, [["weight"]]), lambda: match_parameters(None, ["weight"]),
                 lambda: freeze_parameters(None, ["weight"])):
        for exc in (AttributeError, TypeError):
            with pytest.raises(exc, match="model must be a torch.nn.Module") as info:
                call()
            assert "'NoneType' object has no attribute 'named_parameters'" in str(info.value)
