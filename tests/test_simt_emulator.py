"""The SIMT emulator (tests/emulator/simt_emulator.h) checked on its own: small kernels
exercise the block barrier, shared memory, every warp intrinsic and the atomics,
and the errors it must report instead of hanging (divergence, a lane outside the
mask, a misaligned vector access, too many threads). The same program built with
ThreadSanitizer must stay silent, and must report the planted shared-memory race.
"""
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE = os.path.join(ROOT, "tests", "emulator", "simt_selftest.cpp")
CXX = os.environ.get("CXX", "g++")
FLAGS = ["-std=c++17", "-O1", "-g", "-pthread", "-ffp-contract=off", "-Wall", "-Wextra", "-Werror"]
SANITIZERS = {
    "plain": [],
    "asan-ubsan": ["-fsanitize=address,undefined", "-fno-sanitize-recover=all"],
    "tsan": ["-fsanitize=thread"],
}

pytestmark = [
    pytest.mark.skipif(shutil.which(CXX) is None, reason=f"no C++ compiler ({CXX})"),
    pytest.mark.skipif(os.environ.get("FAKEQUANT_EMULATOR_TESTS") != "1",
                       reason="the emulator's tests run in `make cuda-emulate`"),
]


def _build(tmp_path, variant):
    exe = tmp_path / f"simt_selftest_{variant}"
    subprocess.run([CXX, *FLAGS, *SANITIZERS[variant], SOURCE, "-o", str(exe)], check=True)
    return str(exe)


def _env():
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    env["TSAN_OPTIONS"] = "halt_on_error=1 exitcode=66"
    return env


@pytest.mark.parametrize("variant", sorted(SANITIZERS))
def test_emulator_selftest(tmp_path, variant):
    exe = _build(tmp_path, variant)
    run = subprocess.run([exe], capture_output=True, text=True, env=_env(), timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "0 failed checks" in run.stdout
    assert "ThreadSanitizer" not in run.stderr and "AddressSanitizer" not in run.stderr
    # every planted error was reported with its reason
    for reason in ("which has returned", "waits at __syncthreads", "not in its mask",
                   "not in the mask", "misaligned", "threads per block"):
        assert reason in run.stdout, reason


def test_thread_sanitizer_sees_a_shared_memory_race(tmp_path):
    exe = _build(tmp_path, "tsan")
    run = subprocess.run([exe, "race"], capture_output=True, text=True, env=_env(), timeout=300)
    assert run.returncode == 66, run.stdout + run.stderr
    assert "ThreadSanitizer: data race" in run.stderr
    assert "race_kernel" in run.stderr
