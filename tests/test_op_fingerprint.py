"""tools/op_fingerprint.py tells a change of value from a change of NaN payload, and its
presets' models are the same on every device (make gpu-check compares CPU and CUDA with it)."""
import importlib.util
from pathlib import Path

import pytest
import torch

import fakequant

ROOT = Path(__file__).resolve().parent.parent


def _tool():
    spec = importlib.util.spec_from_file_location("op_fingerprint", ROOT / "tools" / "op_fingerprint.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


fp = _tool()
INT = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32, torch.float64: torch.int64}
# a NaN of each dtype other than torch's own (negative, with a payload): what x86 or a GPU may write
OTHER_NAN = {torch.float16: -0x01FF, torch.bfloat16: -0x003F, torch.float32: -0x003FFFFF,
             torch.float64: -0x0007FFFFFFFFFFFF}


@pytest.mark.parametrize("dtype", list(INT))
def test_two_nan_payloads_have_one_fingerprint(dtype):
    x = torch.tensor([1.5, float("nan"), -0.0, float("inf")], dtype=dtype)
    y = x.clone()
    y.view(INT[dtype])[1] = OTHER_NAN[dtype]
    assert y[1].isnan() and not torch.equal(x.view(INT[dtype]), y.view(INT[dtype]))
    assert fp._digest(x) == fp._digest(y)


@pytest.mark.parametrize("dtype", list(INT))
def test_one_ulp_and_the_sign_of_zero_change_the_fingerprint(dtype):
    x = torch.tensor([1.5, float("nan"), -0.0, float("inf")], dtype=dtype)
    ulp = x.clone()
    ulp[0] = torch.nextafter(ulp[0:1], torch.tensor([2.0], dtype=dtype))[0]
    zero = x.clone()
    zero[2] = 0.0
    assert fp._digest(x) != fp._digest(ulp)
    assert fp._digest(x) != fp._digest(zero)
    assert fp._digest(x) == fp._digest(x.clone())


def test_the_digest_under_another_default_device():
    """The tool runs with the device as torch's default device (make gpu-check: "cuda"); the
    digest of a CPU copy makes no tensor there ("meta" stands in for it: the first GPU run of
    the canonical NaN failed every configuration so, "found at least two devices")."""
    x = torch.tensor([1.5, float("nan"), -0.0])
    expected = fp._digest(x)
    torch.set_default_device("meta")
    try:
        assert fp._digest(x) == expected
    finally:
        torch.set_default_device(None)


def test_a_presets_model_is_built_on_the_cpu_whatever_the_default_device():
    """Its weights come from the CPU generator (CUDA's draws other numbers from the same seed):
    built with another default device ("meta" here, "cuda" in make gpu-check), they are the
    CPU's, then moved."""
    preset = sorted(fakequant.models.presets.PRESETS)[0]
    cpu = fp._preset_model(preset)
    torch.set_default_device("meta")
    try:
        other = fp._preset_model(preset)
    finally:
        torch.set_default_device(None)
    for a, b in zip(cpu.state_dict().values(), other.state_dict().values()):
        assert b.device.type == "cpu"
        assert torch.equal(a, b)
