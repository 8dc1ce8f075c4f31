"""Builds fakequant._C: the operator schemas, the CPU kernels, and the CUDA
kernels when torch has CUDA and a toolkit is present (or FORCE_CUDA=1).

Install with `pip install --no-build-isolation .` so the build sees the torch
you run with. Environment: FAKEQUANT_CPU_ONLY=1, FORCE_CUDA=1,
TORCH_CUDA_ARCH_LIST, MAX_JOBS.
"""
import glob
import os

import torch
from setuptools import find_packages, setup
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension

ROOT = os.path.dirname(os.path.abspath(__file__))


def build_cuda():
    if os.environ.get("FAKEQUANT_CPU_ONLY", "0") == "1":
        return False
    if os.environ.get("FORCE_CUDA", "0") == "1":
        return True
    return torch.version.cuda is not None and CUDA_HOME is not None


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
    write_build_info(with_cuda)
    sources = sorted(glob.glob("csrc/*.cpp")) + sorted(glob.glob("csrc/cpu/*.cpp"))
    # -O3 vectorises the element loops; no -ffast-math anywhere: the contract
    # needs correctly rounded division and IEEE NaN handling.
    # -fno-trapping-math lets the compiler turn the selects of the element loop
    # into vector blends; it changes no result.
    # -ffp-contract=off: the contract rounds once per operation, never fused.
    cxx = ["-O3", "-fno-trapping-math", "-ffp-contract=off", "-fopenmp"]
    kwargs = dict(extra_compile_args={"cxx": cxx}, extra_link_args=["-fopenmp"])
    if with_cuda:
        sources += sorted(glob.glob("csrc/cuda/*.cu"))
        kwargs["extra_compile_args"]["nvcc"] = ["-O3"]
        return CUDAExtension("fakequant._C", sources, **kwargs)
    return CppExtension("fakequant._C", sources, **kwargs)


setup(
    packages=find_packages(include=["fakequant", "fakequant.*"]),
    ext_modules=[extension()],
    cmdclass={"build_ext": BuildExtension},
)
