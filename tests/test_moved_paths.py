"""The old import paths (fakequant/_moved.py): each is the module at its new path; the public,
documented ones warn once, at the user's import line; private ones and pytorch-quantization's
paths import silently. Fresh interpreters, so that each path is imported for the first time."""
import json
import subprocess
import sys

from fakequant import _moved

_SCRIPT = r"""
import importlib, json, sys, warnings
import fakequant
from fakequant import _moved

def imported(statement):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec(statement, {})
    return [(str(w.message), w.filename) for w in caught if issubclass(w.category, DeprecationWarning)]

report = {"pytorch-quantization": imported(
    "import fakequant.nn, fakequant.tensor_quant, fakequant.calib, fakequant.quant_modules, fakequant.utils, "
    "fakequant.optim, fakequant.nn.modules.tensor_quantizer, fakequant.utils.reduce_amax")}
for old, new in _moved.MOVED.items():
    report[old] = {"warnings": imported(f"import {old}"),
                   "same": sys.modules[old] is importlib.import_module(new)}
print(json.dumps(report))
"""


def _run(script):
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_each_old_path_is_its_new_module_and_only_public_ones_warn():
    report = _run(_SCRIPT)
    assert report.pop("pytorch-quantization") == []
    for old, new in _moved.MOVED.items():
        assert report[old]["same"], old
        expected = [[f"{old} is now {new}; the old import path will go in a later release", "<string>"]]
        assert report[old]["warnings"] == (expected if old in _moved.DEPRECATED else []), old
    assert _moved.DEPRECATED == {"fakequant.presets", "fakequant.hf", "fakequant.experts", "fakequant.pretrained",
                                 "fakequant.distill", "fakequant.reference"}


def test_the_package_attribute_and_from_import_warn_at_the_users_line(tmp_path):
    script = tmp_path / "user.py"
    script.write_text("import fakequant\n"
                      "recipes = fakequant.presets.PRESETS\n"
                      "from fakequant import distill\n"
                      "import fakequant.serve.compressed_tensors\n")  # (imports old paths: silent, fakequant's own)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    warned = [line for line in out.stderr.splitlines() if "DeprecationWarning" in line]
    assert warned == [
        f"{script}:2: DeprecationWarning: fakequant.presets is now fakequant.models.presets; "
        "the old import path will go in a later release",
        f"{script}:3: DeprecationWarning: fakequant.distill is now fakequant.models.distill; "
        "the old import path will go in a later release"], out.stderr


def test_an_unknown_attribute_still_raises():
    import fakequant
    import pytest

    with pytest.raises(AttributeError, match="has no attribute 'no_such_module'"):
        fakequant.no_such_module
