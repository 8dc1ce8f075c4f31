"""Bad input raises a Python exception whose message names the argument; nothing aborts."""
import pytest
import torch

import fakequant
import op_table

x = torch.randn(4, 3, 5)

# Every operator's invalid arguments, from the op table (tests/op_table.py).
INVALID = op_table.invalid_cases()


@pytest.mark.parametrize("entry,case", INVALID, ids=op_table.invalid_ids(INVALID))
def test_bad_operator_arguments(entry, case):
    with pytest.raises(case.exc, match=case.match):
        entry.op(*case.arguments(entry.invalid_base()))


@pytest.mark.parametrize("entry,case", [p for p in INVALID if p[0].rules is not None],
                         ids=op_table.invalid_ids([p for p in INVALID if p[0].rules is not None]))
def test_invalid_cases_break_the_rules(entry, case):
    """The fuzz tests' rules reject each invalid case, naming its argument, and call it a
    check of values (skipped on CUDA unless FAKEQUANT_CHECK_VALUES=1) exactly where the case does."""
    bad = op_table.violations(entry, case.arguments(entry.invalid_base()))
    assert any(case.match in name for name in bad), (bad, case.match)
    assert all(name.startswith("value:") for name in bad) == case.value, bad


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
