"""`make gpu-check` / `python -m fakequant gpu-check` on a machine without a GPU (the device
hidden with CUDA_VISIBLE_DEVICES=""): one line, exit 0, nothing written."""
import importlib.util
import os
import re
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
    # (a CI step: `step make gpu-check`, which times it)
    assert re.search(r"^step make gpu-check$", (ROOT / ".ci" / "run").read_text(), re.M)


def _gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "tools" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _python_without_fakequant(tmp_path):
    """A stand-in for a device machine's python3: this Python with torch and pytest but without
    the installed fakequant. -S skips site-packages' .pth files, where the editable install's
    finder lives; site-packages itself goes at the end of PYTHONPATH, after what gpu-check puts."""
    site = os.pathsep.join(p for p in sys.path if p.endswith("site-packages"))
    py = tmp_path / "python3"
    py.write_text(f'#!/bin/sh\nPYTHONPATH="${{PYTHONPATH:+$PYTHONPATH{os.pathsep}}}{site}" exec {sys.executable} -S "$@"\n')
    py.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    seen = subprocess.run([str(py), "-c", "import importlib.util, torch; print(importlib.util.find_spec('fakequant'))"],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert seen.returncode == 0 and seen.stdout.strip() == "None", (seen.stdout, seen.stderr)
    return py, env


def test_a_script_step_runs_the_checkouts_fakequant_with_a_python_that_has_none_installed(tmp_path, monkeypatch):
    """The first GPU run's script steps all died with ModuleNotFoundError: an in-place build, and
    `python tools/<script>.py` puts tools/, not the checkout, on the path."""
    gpu_check = _gpu_check()
    py, _ = _python_without_fakequant(tmp_path)
    monkeypatch.delenv("PYTHONPATH", raising=False)  # the checkout reaches the step only through gpu-check
    steps = gpu_check.Steps(str(py), str(tmp_path), budget=600)
    (method, kwargs), = [s for s in gpu_check.plan(str(tmp_path)) if s[1]["name"] == "fingerprints on the CPU"]
    row = getattr(steps, method)(**kwargs)
    log = (tmp_path / kwargs["log_name"]).read_text()
    assert row["result"] == "ok", log
    assert f"of {ROOT / 'fakequant' / '__init__.py'} on cpu" in log
    assert re.fullmatch(r"\d+ configurations of \d+ operators", row["counts_text"])


SAMPLE_TESTS = '''
import os, signal
import pytest

@pytest.mark.parametrize("i", range(3))
def test_passes(i):
    pass

@pytest.mark.parametrize("i", range(3))
def test_fails(i):
    assert i < 0

def test_dies():
    os.kill(os.getpid(), signal.SIGSEGV)

def test_after_the_crash():
    pass

@pytest.fixture
def broken():
    raise RuntimeError("setup")

def test_errors(broken):
    pass

def test_skipped():
    pytest.skip("no")
'''


def test_a_pytest_step_counts_every_failure_and_resumes_after_a_crash(tmp_path):
    gpu_check = _gpu_check()
    (tmp_path / "test_sample.py").write_text(SAMPLE_TESTS)
    steps = gpu_check.Steps(sys.executable, str(tmp_path), budget=600)
    row = steps.pytest("sample", [str(tmp_path / "test_sample.py")], correctness=True, cap=300, log_name="sample.log")
    assert row["counts"] == {"passed": 4, "failed": 3, "crashed": 1, "error": 1, "skipped": 1}, row
    assert row["result"] == "FAILED" and steps.failed
    assert len(row["crashes"]) == 1 and "::test_dies (exit -11)" in row["crashes"][0]
    assert sum(1 for b in row["bad"] if b.startswith("failed: ")) == 3
    assert any(b.startswith("crashed: ") and b.endswith("::test_dies") for b in row["bad"])
    assert row["files"] and sum(sum(c.values()) for c in row["files"].values()) == 10


def test_a_pytest_step_stops_at_its_failure_cap(tmp_path):
    gpu_check = _gpu_check()
    (tmp_path / "test_sample.py").write_text(SAMPLE_TESTS)
    steps = gpu_check.Steps(sys.executable, str(tmp_path), budget=600, max_failures=2)
    row = steps.pytest("sample", [str(tmp_path / "test_sample.py"), "-k", "fails or passes"], correctness=True,
                       cap=300, log_name="sample.log")
    assert row["counts"] == {"passed": 3, "failed": 2}, row
    assert row["result"] == "FAILED (stopped after 2 failures)"


def test_the_benchmark_steps_end_by_their_own_budget_before_gpu_check_kills_them(tmp_path):
    """bench_ops and bench_compiled_qat leave out (and name) what their --budget does not fit, and
    print what they measured as they go; gpu-check's cap is the budget plus what is in flight."""
    gpu_check = _gpu_check()
    steps = {kw["name"]: kw for _, kw in gpu_check.plan(str(tmp_path))}
    ops = next(kw for name, kw in steps.items() if name.startswith("benchmarks/bench_ops.py"))
    compiled = next(kw for name, kw in steps.items() if name.startswith("benchmarks/bench_compiled_qat.py"))
    for kw, budget in ((ops, gpu_check.BENCH_OPS_BUDGET), (compiled, gpu_check.COMPILED_BUDGET)):
        args = kw["args"]
        assert kw["budget"] == budget and budget + 20 <= kw["cap"] and "--budget" not in args
        assert args[args.index("--device") + 1] == "cuda" and "--sizes" not in args  # bench_ops' CUDA defaults
    assert compiled["args"][compiled["args"].index("--models") + 1] == "resnet,llama,moe"


def test_a_benchmark_step_gets_the_budget_that_is_left(tmp_path):
    """A benchmark's --budget is its own, or what is left of the run less the margin for what is
    in flight when it runs out; the cap follows it."""
    gpu_check = _gpu_check()
    script = tmp_path / "echo_args.py"
    script.write_text("import sys; print(' '.join(sys.argv[1:]))\n")
    for left, expected in ((1000, 240), (200, 150)):
        steps = gpu_check.Steps(sys.executable, str(tmp_path), left)
        row = steps.run("bench", [str(script), "--x"], correctness=False, cap=290, log_name=f"b{left}.log",
                        budget=240)
        assert row["result"] == "ok", row
        assert row["tail"][-1].split() == ["--x", "--budget", str(expected)], row
