"""Builds fakequant._C: the operator schemas, the CPU kernels, and the CUDA
kernels when torch has CUDA and a toolkit is present (or FORCE_CUDA=1).

Install with `pip install --no-build-isolation .` so the build sees the torch
you run with. Environment: FAKEQUANT_CPU_ONLY=1, FORCE_CUDA=1,
TORCH_CUDA_ARCH_LIST, MAX_JOBS, CUDA_HOME; FAKEQUANT_WRITE_BUILD_INFO=0 leaves
fakequant/_build_info.py alone (for builds out of the tree, as `make cuda-build`).
"""
import glob
import os
import shutil

import torch
from setuptools import find_packages, setup


def _has_cuda_headers(root):
    return root is not None and os.path.exists(os.path.join(root, "include", "cuda_runtime.h"))


# torch takes CUDA_HOME from the nvcc on PATH when the variable is unset; a bare
# nvcc (as /usr/local/bin/nvcc) would give a root without CUDA's headers.
if not (os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")):
    _nvcc = shutil.which("nvcc")
    _root = os.path.dirname(os.path.dirname(os.path.realpath(_nvcc))) if _nvcc else None
    if _nvcc and not _has_cuda_headers(_root) and _has_cuda_headers("/usr/local/cuda"):
        os.environ["CUDA_HOME"] = "/usr/local/cuda"

from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension  # noqa: E402

ROOT = os.path.dirname(os.path.abspath(__file__))


def build_cuda():
    if os.environ.get("FAKEQUANT_CPU_ONLY", "0") == "1":
        return False
    if os.environ.get("FORCE_CUDA", "0") == "1":
        return True
    return torch.version.cuda is not None and _has_cuda_headers(CUDA_HOME)


def write_build_info(with_cuda):
    # Read by fakequant/_extension.py, which refuses to load a library built
    # for another torch (its C++ ABI would not match).
    path = os.path.join(ROOT, "fakequant", "_build_info.py")
    with open(path, "w") as f:
        f.write("# Written by setup.py; do not edit.\n")
        f.write(f"TORCH_VERSION = {torch.__version__!r}\n")
        f.write(f"CUDA_VERSION = {torch.version.cuda if with_cuda else None!r}\n")
        f.write(f"CUDA_ARCH_LIST = {os.environ.get('TORCH_CUDA_ARCH_LIST') if with_cuda else None!r}\n")


def extension():
    with_cuda = build_cuda()
    if os.environ.get("FAKEQUANT_WRITE_BUILD_INFO", "1") != "0":
        write_build_info(with_cuda)
    # csrc/ops: the host functions (every build); csrc/cpu, csrc/cuda: the loops.
    sources = sorted(glob.glob("csrc/*.cpp")) + sorted(glob.glob("csrc/ops/*.cpp")) + sorted(glob.glob("csrc/cpu/*.cpp"))
    # -O3 vectorises the element loops; no -ffast-math anywhere: the contract
    # needs correctly rounded division and IEEE NaN handling.
    # -fno-trapping-math lets the compiler turn the selects of the element loop
    # into vector blends; it changes no result.
    # -ffp-contract=off: the contract rounds once per operation, never fused.
    cxx = ["-O3", "-fno-trapping-math", "-ffp-contract=off", "-fopenmp"]
    kwargs = dict(extra_compile_args={"cxx": cxx}, extra_link_args=["-fopenmp"],
                  include_dirs=[os.path.join(ROOT, "csrc", "include")])
    if with_cuda:
        sources += sorted(glob.glob("csrc/cuda/*.cu"))
        cxx.append("-DFAKEQUANT_WITH_CUDA")  # csrc/ops registers the host functions for CUDA too
        # No --use_fast_math: IEEE division, no flush to zero; -fmad=false so
        # that no multiply and add fuse into one rounding (the kernels also
        # spell every operation with a _rn intrinsic).
        nvcc = ["-O3", "-prec-div=true", "-prec-sqrt=true", "-ftz=false", "-fmad=false"]
        nvcc += ["-Xcompiler", "-ffp-contract=off"]
        kwargs["extra_compile_args"]["nvcc"] = nvcc
        return CUDAExtension("fakequant._C", sources, **kwargs)
    return CppExtension("fakequant._C", sources, **kwargs)


setup(
    packages=find_packages(include=["fakequant", "fakequant.*"]),
    ext_modules=[extension()],
    cmdclass={"build_ext": BuildExtension},
)
