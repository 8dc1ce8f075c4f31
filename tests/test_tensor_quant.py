"""Descriptors and the tensor_quant functions (against tests/reference.py)."""
import pickle

import numpy as np
import pytest
import torch
import yaml

from fakequant import tensor_quant
from fakequant.nn import TensorQuantizer
from fakequant.tensor_quant import QuantDescriptor, ScaledQuantDescriptor

import reference
from conftest import DEVICES, DTYPES, bits_equal


# --- descriptors -------------------------------------------------------------------


def test_alias_and_defaults():
    assert QuantDescriptor is ScaledQuantDescriptor
    d = QuantDescriptor()
    assert (d.num_bits, d.name, d.fake_quant, d.axis, d.block_sizes, d.amax) == (8, None, True, None, None, None)
    assert (d.learn_amax, d.scale_amax, d.calib_method, d.unsigned, d.narrow_range, d.dynamic) == (
        False, None, "max", False, False, False)


def test_predefined_descriptors():
    assert tensor_quant.QUANT_DESC_8BIT_PER_TENSOR == QuantDescriptor(num_bits=8)
    assert tensor_quant.QUANT_DESC_UNSIGNED_8BIT_PER_TENSOR.unsigned
    for name in ("CONV1D", "CONV2D", "CONV3D"):
        desc = getattr(tensor_quant, f"QUANT_DESC_8BIT_{name}_WEIGHT_PER_CHANNEL")
        assert desc.axis == 0 and desc.num_bits == 8
    # a transposed convolution's weight is (in, out / groups, *kernel): output channels on axis 1
    for name in ("CONVTRANSPOSE1D", "CONVTRANSPOSE2D", "CONVTRANSPOSE3D"):
        desc = getattr(tensor_quant, f"QUANT_DESC_8BIT_{name}_WEIGHT_PER_CHANNEL")
        assert desc.axis == 1 and desc.num_bits == 8
    assert tensor_quant.QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW.axis == 0


def test_properties_are_read_only():
    d = QuantDescriptor(num_bits=4, amax=1.0)
    with pytest.raises(AttributeError):
        d.num_bits = 8
    d.amax.fill(7.0)  # a copy: the descriptor keeps its value
    assert d.amax.item() == 1.0


FULL = dict(num_bits=6, name="act", fake_quant=False, axis=(0, 2), amax=[[0.5], [1.25]], scale_amax=2.0,
            calib_method="histogram", unsigned=True, narrow_range=True, dynamic=True)


@pytest.mark.parametrize("kwargs", [
    {},
    {"num_bits": 4, "axis": 0},
    {"num_bits": (4, 3), "name": "fp8"},
    {"learn_amax": True, "amax": 3.5},
    {"block_sizes": {-1: 32, "type": "dynamic"}},
    {"block_sizes": {0: None, 1: 16}},
    {"axis": -1, "amax": 0.1},
    FULL,
])
def test_dict_and_yaml_round_trip(kwargs):
    d = QuantDescriptor(**kwargs)
    assert QuantDescriptor(**d.dict()) == d
    text = d.to_yaml()
    assert yaml.safe_load(text) is not None  # plain YAML, no python tags
    back = QuantDescriptor.from_yaml(text)
    assert back == d and back.dict() == d.dict()
    assert type(back.num_bits) is type(d.num_bits) and type(back.axis) is type(d.axis)
    assert pickle.loads(pickle.dumps(d)) == d


def test_dict_omits_defaults():
    assert QuantDescriptor().dict() == {"num_bits": 8, "name": None}
    d = QuantDescriptor(**FULL).dict()
    assert d["axis"] == (0, 2) and d["amax"] == [[0.5], [1.25]] and d["narrow_range"] is True
    assert d["calib_method"] == "histogram" and d["dynamic"] is True


def test_amax_is_a_float32_ndarray():
    # pytorch-quantization 2.2.1 keeps a user-given amax as np.array(amax, dtype=np.float32)
    d = QuantDescriptor(amax=0.1)
    assert type(d.amax) is np.ndarray and d.amax.dtype == np.float32 and d.amax.shape == ()
    assert d.amax == np.float32(0.1)
    assert QuantDescriptor.from_yaml(d.to_yaml()).amax.item() == d.amax.item()
    for given in (torch.tensor([1.0, 2.0]), [1.0, 2.0], np.array([1.0, 2.0])):
        amax = QuantDescriptor(amax=given).amax
        assert type(amax) is np.ndarray and amax.dtype == np.float32 and amax.tolist() == [1.0, 2.0]
    # the quantizer built from it starts with that amax, as a float32 tensor
    q = TensorQuantizer(QuantDescriptor(amax=[[0.5], [1.25]], axis=0))
    assert q.amax.dtype == torch.float32 and q.amax.tolist() == [[0.5], [1.25]]


def test_equality():
    assert QuantDescriptor(num_bits=4) != QuantDescriptor(num_bits=5)
    assert QuantDescriptor(amax=1.0) != QuantDescriptor(amax=2.0)
    assert QuantDescriptor(axis=0) == QuantDescriptor(axis=0)
    assert QuantDescriptor() != "QuantDescriptor"


def test_str_and_repr():
    s = str(QuantDescriptor(num_bits=4, name="w", axis=0, amax=[1.0, 2.0], unsigned=True))
    assert s.startswith("w: (unsigned 4bit fake axis=0") and "amax=" in s
    assert repr(QuantDescriptor(num_bits=4)).startswith("QuantDescriptor(num_bits=4")


@pytest.mark.parametrize("kwargs, error, words", [
    ({"num_bits": 1}, ValueError, "num_bits"),
    ({"num_bits": 17}, ValueError, "num_bits"),
    ({"num_bits": 8.0}, TypeError, "num_bits"),
    ({"num_bits": True}, TypeError, "num_bits"),
    ({"num_bits": (3, 4)}, ValueError, "(3, 4)"),
    ({"num_bits": (2, 1)}, ValueError, "E2M1"),
    ({"name": 3}, TypeError, "name"),
    ({"fake_quant": 1}, TypeError, "fake_quant"),
    ({"axis": "0"}, TypeError, "axis"),
    ({"axis": (0, 0)}, ValueError, "axis"),
    ({"amax": "big"}, TypeError, "amax"),
    ({"amax": -1.0}, ValueError, "amax"),
    ({"amax": float("nan")}, ValueError, "amax"),
    ({"scale_amax": 0}, ValueError, "scale_amax"),
    ({"calib_method": "entropy"}, ValueError, "calib_method"),
    ({"unsigned": "yes"}, TypeError, "unsigned"),
    ({"learn_amax": True, "axis": 0}, ValueError, "learn_amax"),
    ({"learn_amax": True, "amax": [1.0, 2.0]}, ValueError, "learn_amax"),
    ({"block_sizes": {-1: 16}, "axis": 0}, ValueError, "block_sizes"),
    ({"block_sizes": {-1: 0}}, ValueError, "block_sizes[-1]"),
    ({"block_sizes": {"type": "static"}}, ValueError, "axis"),
    ({"block_sizes": {-1: 16, "kind": 1}}, ValueError, "kind"),
    ({"block_sizes": [16]}, TypeError, "block_sizes"),
    ({"bogus": 1}, TypeError, "bogus"),
])
def test_invalid_arguments(kwargs, error, words):
    with pytest.raises(error, match=None) as info:
        QuantDescriptor(**kwargs)
    assert words in str(info.value)


def test_from_yaml_rejects_non_mapping():
    with pytest.raises(ValueError):
        QuantDescriptor.from_yaml("- 1\n- 2\n")
    with pytest.raises(TypeError):
        QuantDescriptor.from_yaml(b"num_bits: 8")


def test_from_yaml_is_safe():
    with pytest.raises(yaml.YAMLError):
        QuantDescriptor.from_yaml("num_bits: !!python/object/apply:os.system ['true']\n")


# --- functions ---------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_bits, unsigned, narrow", [(8, False, True), (8, False, False), (4, True, False)])
def test_fake_tensor_quant_matches_reference(device, dtype, num_bits, unsigned, narrow):
    x = (torch.randn(4, 3, 5, device=device) * 2).to(dtype)
    if unsigned:
        x = x.abs()
    amax = torch.tensor([1.0, 2.5, 0.7], device=device).reshape(1, 3, 1)
    y = tensor_quant.fake_tensor_quant(x, amax, num_bits, unsigned, narrow)
    ref, _ = reference.fake_quantize_amax(x, amax, num_bits, unsigned, narrow)
    assert y.dtype == dtype
    torch.testing.assert_close(y, ref, rtol=0, atol=0)
    assert bits_equal(tensor_quant.legacy_fake_tensor_quant(x, amax, num_bits, unsigned, narrow), y)
    assert bits_equal(tensor_quant.FakeTensorQuantFunction.apply(x, amax, num_bits, unsigned, narrow), y)


@pytest.mark.parametrize("device", DEVICES)
def test_fake_tensor_quant_gradient_is_clipped_ste(device):
    x = torch.linspace(-3, 3, 61, device=device, requires_grad=True)
    y = tensor_quant.fake_tensor_quant(x, 2.0)
    y.backward(torch.ones_like(y))
    assert bits_equal(x.grad, (x.detach().abs() <= 2.0).float())


@pytest.mark.parametrize("device", DEVICES)
def test_tensor_quant(device):
    x = torch.randn(6, 5, device=device, requires_grad=True)
    amax = torch.tensor(1.5, device=device)
    q, scale = tensor_quant.tensor_quant(x, amax)
    ref, _ = reference.quantize_amax(x.detach(), amax)
    assert bits_equal(q, ref)
    assert scale.dtype == x.dtype and scale.item() == pytest.approx(127 / 1.5)
    q2, s2 = tensor_quant.TensorQuantFunction.apply(x, amax)
    assert bits_equal(q2, q) and bits_equal(s2, scale)
    q.sum().backward()
    assert bits_equal(x.grad, (x.detach().abs() <= 1.5).float())
    torch.testing.assert_close(q / scale, tensor_quant.fake_tensor_quant(x.detach(), amax, narrow_range=True))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_bits, unsigned", [(8, False), (4, False), (8, True), (16, True)])
def test_tensor_quant_scale_is_pytorch_quantizations_bit_for_bit(device, num_bits, unsigned):
    # pytorch-quantization: max_bound = torch.tensor(bound); scale = max_bound / amax (one rounding),
    # 1 where amax <= 2^-24. bound / amax with a Python bound is amax.reciprocal() * bound in
    # PyTorch, two roundings, one step off for about a quarter of these amax values.
    bound = 2 ** (num_bits - 1 + unsigned) - 1
    amax = torch.cat([torch.rand(4000, dtype=torch.float64).exp2().mul(torch.rand(4000, dtype=torch.float64) * 2).float(),
                      torch.tensor([0.0, 2.0**-24, 2.0**-23, 1.0, 3.0, 448.0])]).to(device)
    x = torch.rand(amax.numel(), 3, device=device) if unsigned else torch.randn(amax.numel(), 3, device=device)
    _, scale = tensor_quant.tensor_quant(x, amax[:, None], num_bits, unsigned)
    expected = torch.where(amax <= 2.0**-24, torch.ones_like(amax), torch.tensor(float(bound), device=device) / amax)
    assert bits_equal(scale, expected[:, None])
    assert int(((bound / amax) != expected).sum()) > 100  # (the two-rounding form would fail here)
    quantizer = TensorQuantizer(QuantDescriptor(num_bits=num_bits, unsigned=unsigned, amax=1.7, fake_quant=False))
    quantizer(x[:4])
    assert bits_equal(quantizer.scale, torch.tensor(float(bound), device=device) / torch.tensor(1.7, device=device))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fake_affine_tensor_quant(device, dtype):
    x = torch.randn(50, device=device, dtype=dtype, requires_grad=True)
    lo, hi = torch.tensor(-0.8, device=device), torch.tensor(1.3, device=device)
    y = tensor_quant.fake_affine_tensor_quant(x, lo, hi, 8)
    ref, mask = reference.fake_quantize_min_max(x.detach(), lo, hi, 8)
    torch.testing.assert_close(y, ref, rtol=0, atol=0)
    assert bits_equal(tensor_quant.FakeAffineTensorQuantFunction.apply(x, lo, hi, 8), y)
    y.sum().backward()
    assert bits_equal(x.grad, mask.to(dtype))


def test_function_protocol_forward_backward():
    """The Function classes also work when their forward/backward are used directly."""
    x = torch.randn(40, dtype=torch.float64, requires_grad=True)
    amax = torch.tensor(1.0, dtype=torch.float64)
    y = torch.autograd.Function.apply.__func__(tensor_quant.FakeTensorQuantFunction, x, amax, 8, False, True)
    assert bits_equal(y, tensor_quant.fake_tensor_quant(x.detach(), amax))
    y.sum().backward()
    assert bits_equal(x.grad, (x.detach().abs() <= 1.0).double())
    lo, hi = torch.tensor(-1.0), torch.tensor(0.5)
    x.grad = None
    z = torch.autograd.Function.apply.__func__(tensor_quant.FakeAffineTensorQuantFunction, x, lo, hi, 8)
    z.sum().backward()
    assert bits_equal(x.grad, ((x.detach() >= -1) & (x.detach() <= 0.5)).double())


def test_amax_as_number_and_device_of_amax():
    x = torch.randn(10)
    assert bits_equal(tensor_quant.fake_tensor_quant(x, 1.0), tensor_quant.fake_tensor_quant(x, torch.tensor(1.0)))
    with pytest.raises(TypeError, match="amax"):
        tensor_quant.fake_tensor_quant(x, "1.0")
    with pytest.raises(TypeError, match="num_bits"):
        tensor_quant.fake_tensor_quant(x, 1.0, (4, 3))


def test_negative_amax_raises():
    with pytest.raises(ValueError, match="amax"):
        tensor_quant.fake_tensor_quant(torch.randn(4), torch.tensor(-1.0))


def test_scaled_e4m3_is_the_fp8_operator():
    x = torch.randn(64) * 3
    y = tensor_quant.scaled_e4m3(x, torch.tensor(2.0))
    expected = (x / (torch.tensor(2.0) / 448)).clamp(-448, 448).to(torch.float8_e4m3fn).float() * (torch.tensor(2.0) / 448)
    assert bits_equal(y, expected)
    assert bits_equal(tensor_quant.ScaledE4M3Function.apply(x, torch.tensor(2.0), 4, 3), y)
    assert bits_equal(tensor_quant.scaled_e4m3(x, None, 5, 2), x.to(torch.float8_e5m2).float())


def test_fake_tensor_quant_compiles():
    x = torch.randn(64)
    f = torch.compile(lambda t: tensor_quant.FakeTensorQuantFunction.apply(t, torch.tensor(1.0), 8, False, True),
                      fullgraph=True, backend="aot_eager")
    assert bits_equal(f(x), tensor_quant.fake_tensor_quant(x, 1.0))


@pytest.mark.parametrize("cls,args", [
    (tensor_quant.FakeTensorQuantFunction, (torch.tensor(1.0), 8, False, True)),
    (tensor_quant.LegacyFakeTensorQuantFunction, (torch.tensor(1.0), 4, True, False)),
    (tensor_quant.TensorQuantFunction, (torch.tensor(1.0),)),
    (tensor_quant.FakeAffineTensorQuantFunction, (torch.tensor(-1.0), torch.tensor(0.5), 8)),
    (tensor_quant.ScaledE4M3Function, (torch.tensor(1.0), 4, 3)),
])
def test_function_classes_are_thin_functions_over_the_operators(cls, args):
    """One path: apply is torch's (no override), forward runs the operator, backward is
    the operator's own mask backward, bit for bit the function's gradient (also for a
    channels_last input and a gradient holding NaN)."""
    assert issubclass(cls, torch.autograd.Function) and "apply" not in vars(cls)
    fn = {tensor_quant.FakeTensorQuantFunction: tensor_quant.fake_tensor_quant,
          tensor_quant.LegacyFakeTensorQuantFunction: tensor_quant.legacy_fake_tensor_quant,
          tensor_quant.TensorQuantFunction: lambda *a: tensor_quant.tensor_quant(*a)[0],
          tensor_quant.FakeAffineTensorQuantFunction: tensor_quant.fake_affine_tensor_quant,
          tensor_quant.ScaledE4M3Function: tensor_quant.scaled_e4m3}[cls]
    base = (torch.randn(2, 3, 4, 5) * 1.5).contiguous(memory_format=torch.channels_last)
    x1, x2 = base.clone().requires_grad_(), base.clone().requires_grad_()
    y1 = cls.apply(x1, *args)
    y1 = y1[0] if isinstance(y1, tuple) else y1
    y2 = fn(x2, *args)
    assert bits_equal(y1, y2)
    g = torch.randn(y1.shape)
    g[0, 0, 0, 0] = float("nan")
    (g1,) = torch.autograd.grad(y1, x1, g)
    (g2,) = torch.autograd.grad(y2, x2, g)
    assert bits_equal(g1, g2)


def test_descriptor_is_a_frozen_dataclass():
    import dataclasses

    d = QuantDescriptor(num_bits=4, axis=0, amax=[1.0, 2.0], block_sizes=None)
    assert [f.name for f in dataclasses.fields(d)] == [
        "num_bits", "name", "fake_quant", "axis", "block_sizes", "amax", "learn_amax", "scale_amax",
        "calib_method", "unsigned", "narrow_range", "dynamic", "bias"]
    for name in ("axis", "amax", "bias"):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(d, name, None)
    # dataclasses.replace builds a new descriptor, checked as any
    assert dataclasses.replace(d, axis=1) == QuantDescriptor(num_bits=4, axis=1, amax=[1.0, 2.0])
    with pytest.raises(ValueError, match="learn_amax"):
        dataclasses.replace(d, axis=None, learn_amax=True)
    b = QuantDescriptor(block_sizes={-1: 16}, bias=None)
    b.block_sizes[-1] = 32  # a copy
    assert b.block_sizes == {-1: 16}


def test_descriptor_pickled_with_private_fields_loads():
    # descriptors pickled before the fields were public held "_num_bits", ...
    d = QuantDescriptor.__new__(QuantDescriptor)
    d.__setstate__({"_num_bits": 4, "_name": "w", "_axis": 0, "_amax": np.array([1.0], dtype=np.float32)})
    assert d == QuantDescriptor(num_bits=4, name="w", axis=0, amax=[1.0])


def test_the_inverse_scale_has_one_name_and_the_old_one_warns():
    # (docs/design.md, "Scale": in fakequant's names a scale is amax / bound; tensor_quant's is bound / amax)
    x = torch.tensor([0.5, -1.0, 2.0], dtype=torch.half)
    outputs, scale = tensor_quant.tensor_quant(x, 2.0)
    assert bits_equal(scale, torch.tensor(127 / 2.0, dtype=torch.half))
    inverse = torch.tensor(127 / 2.0)
    with pytest.warns(DeprecationWarning, match="scale_in_input_dtype is now inverse_scale_in_input_dtype"):
        old = tensor_quant.scale_in_input_dtype(inverse, x, 2.0)
    assert bits_equal(old, tensor_quant.inverse_scale_in_input_dtype(inverse, x, 2.0))
    with pytest.raises(ValueError, match="scale is too large for FP16"):
        tensor_quant.inverse_scale_in_input_dtype(torch.tensor(127 / 1e-4), x, 1e-4)
