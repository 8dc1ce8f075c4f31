"""contract.h's round_to_small_float: on GPUs of compute capability 8.9 and later the CUDA
kernels round to E4M3 and E5M2 with the conversion instruction (cvt.rn.satfinite), which
must give round_to_format's value. tests/fp8_check.cpp compares NVIDIA's host implementation
of that conversion (cuda_fp8.h, from the CUDA toolkit that builds the kernels) with
round_to_format, bit for bit; `make gpu-check` compares the GPU itself with the CPU."""
import os
import shutil
import subprocess

import pytest
from torch.utils import cpp_extension

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def cuda_include():
    homes = [cpp_extension.CUDA_HOME, os.environ.get("CUDA_HOME"), "/usr/local/cuda"]
    for home in filter(None, homes):
        if os.path.exists(os.path.join(home, "include", "cuda_fp8.h")):
            return os.path.join(home, "include")
    return None


@pytest.fixture(scope="module")
def fp8_check(tmp_path_factory):
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    include = cuda_include()
    if compiler is None or include is None:
        pytest.skip("no C++ compiler or no CUDA toolkit (cuda_fp8.h)")
    exe = str(tmp_path_factory.mktemp("fp8") / "fp8_check")
    includes = [f"-I{p}" for p in [include, os.path.join(ROOT, "csrc", "include"), *cpp_extension.include_paths()]]
    subprocess.run([compiler, "-std=c++20", "-O2", "-ffp-contract=off", *includes, "-o", exe,
                    os.path.join(HERE, "fp8_check.cpp")], check=True)
    return exe


def run(exe, *args):
    out = subprocess.run([exe, *map(str, args)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.startswith("checked "), out.stdout
    return int(out.stdout.split()[1])


def test_fp8_conversion_sampled(fp8_check):
    # a million random floats, then every third float of the subnormal and saturating
    # ranges of both formats, both signs: 118 million values, about 2 s
    assert run(fp8_check, "sampled", 1000000, 20261127) == 118440516


@pytest.mark.slow  # every float32: about a minute
def test_fp8_conversion_every_value(fp8_check):
    assert run(fp8_check, "every") == 2**32
