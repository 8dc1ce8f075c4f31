"""`make gpu-check` / `python -m fakequant gpu-check` on a machine without a GPU (the device
hidden with CUDA_VISIBLE_DEVICES=""): one line, exit 0, nothing written."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _without_gpu():
    return dict(os.environ, CUDA_VISIBLE_DEVICES="")


def test_the_package_check_says_in_one_line_that_there_is_no_gpu(tmp_path):
    out = subprocess.run([sys.executable, "-m", "fakequant", "gpu-check", "--out", str(tmp_path / "r")],
                         capture_output=True, text=True, env=_without_gpu(), timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines() == [out.stdout.strip()] and "no CUDA GPU" in out.stdout
    assert not (tmp_path / "r").exists()


def test_make_gpu_check_without_a_gpu_says_so_and_skips_to_the_build_check(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "gpu_check.py"), "--no-cuda-build",
                          "--out", str(tmp_path / "r")], capture_output=True, text=True, env=_without_gpu(),
                         timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().startswith("gpu-check: no CUDA GPU here") and "nothing to check" in out.stdout
    assert len(out.stdout.strip().splitlines()) == 1


def test_the_check_is_a_make_target_that_ci_runs():
    assert "\ngpu-check:\n\t$(PY) tools/gpu_check.py" in (ROOT / "Makefile").read_text()
    assert "\nmake gpu-check\n" in (ROOT / ".ci" / "run").read_text()
