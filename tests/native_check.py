"""The checks written in C++ beside the tests (tests/divisor_check.cpp, tests/fp8_check.cpp):
built with the host compiler (every operation rounded once, as in the library: setup.py's
-ffp-contract=off) against csrc/include and torch's headers, and run; each prints
"checked N ..." and exits 0, or prints its first counterexample and exits 1."""
import concurrent.futures
import os
import shutil
import subprocess

import pytest
from torch.utils import cpp_extension

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def build(tmp_path_factory, name, include_dirs=()):
    """tests/<name>.cpp compiled into a temporary directory; skips without a C++ compiler."""
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        pytest.skip("no C++ compiler")
    exe = str(tmp_path_factory.mktemp(name) / name)
    dirs = [*include_dirs, HERE, os.path.join(ROOT, "csrc", "include"), *cpp_extension.include_paths()]
    subprocess.run([compiler, "-std=c++20", "-O2", "-ffp-contract=off", *(f"-I{d}" for d in dirs), "-o", exe,
                    os.path.join(HERE, f"{name}.cpp")], check=True)
    return exe


def _count(exe, args, out):
    assert out.returncode == 0, f"{os.path.basename(exe)} {' '.join(args)}:\n{out.stdout}{out.stderr}"
    assert out.stdout.startswith("checked "), out.stdout
    return int(out.stdout.split()[1])


def run(exe, *args):
    """The count the check printed; fails the test with its output when it found a counterexample."""
    args = [*map(str, args)]
    return _count(exe, args, subprocess.run([exe, *args], capture_output=True, text=True))


def run_each(exe, command, *values):
    """`exe command value` for each value, as many at a time as there are cores (each check
    runs on one): the sum of their counts."""
    with concurrent.futures.ThreadPoolExecutor(len(os.sched_getaffinity(0))) as pool:
        return sum(pool.map(lambda value: run(exe, command, value), values))
