"""contract.h's round_to_small_float: on GPUs of compute capability 8.9 and later the CUDA
kernels round to E4M3 and E5M2 with the conversion instruction (cvt.rn.satfinite), which
must give round_to_format's value. tests/fp8_check.cpp compares NVIDIA's host implementation
of that conversion (cuda_fp8.h, from the CUDA toolkit that builds the kernels) with
round_to_format, bit for bit; `make gpu-check` compares the GPU itself with the CPU."""
import os

import pytest
from torch.utils import cpp_extension

from native_check import build, run, run_each


def cuda_include():
    homes = [cpp_extension.CUDA_HOME, os.environ.get("CUDA_HOME"), "/usr/local/cuda"]
    for home in filter(None, homes):
        if os.path.exists(os.path.join(home, "include", "cuda_fp8.h")):
            return os.path.join(home, "include")
    return None


@pytest.fixture(scope="module")
def fp8_check(tmp_path_factory):
    include = cuda_include()
    if include is None:
        pytest.skip("no CUDA toolkit (cuda_fp8.h)")
    return build(tmp_path_factory, "fp8_check", [include])


def test_fp8_conversion_sampled(fp8_check):
    # a million random floats, then every third float of the subnormal and saturating
    # ranges of both formats, both signs: 118 million values, about 2 s
    assert run(fp8_check, "sampled", 1000000, 20261127) == 118440516


@pytest.mark.slow  # every float32: about a minute on one core (each sign on one)
def test_fp8_conversion_every_value(fp8_check):
    assert run_each(fp8_check, "every", 0, 1) == 2**32
