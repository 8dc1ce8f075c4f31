"""`python -m fakequant info` reports the build and passes its self-check."""
import subprocess
import sys

import torch

from fakequant.__main__ import self_check


def test_info_command():
    out = subprocess.run([sys.executable, "-m", "fakequant", "info"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"torch {torch.__version__}" in out.stdout
    assert "self-check against the reference" in out.stdout and out.stdout.rstrip().endswith("ok")


def test_self_check_finds_a_wrong_kernel(monkeypatch):
    import fakequant

    real = fakequant.fake_quantize_amax
    monkeypatch.setattr(fakequant, "fake_quantize_amax", lambda t, *a, **k: real(t, *a, **k) * 1.0001)
    failures, checked, _ = self_check(["cpu"])
    assert checked > 0 and any(f.startswith("amax per-tensor") for f in failures)
