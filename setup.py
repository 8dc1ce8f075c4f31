"""Builds fakequant._C (the operator schemas, the CPU kernels, and the CUDA
kernels when torch has CUDA and a toolkit is present, or FORCE_CUDA=1) and
fakequant._build (what _C was built for; see fakequant/_extension.py).

Install with `pip install --no-build-isolation .` so the build sees the torch
you run with. Environment: FAKEQUANT_CPU_ONLY=1, FORCE_CUDA=1, FAKEQUANT_DEBUG_INFO=1,
TORCH_CUDA_ARCH_LIST (default: DEFAULT_CUDA_ARCHS that the toolkit's nvcc
supports), MAX_JOBS, CUDA_HOME.

Nothing is written into the source tree except by an editable install (the two
libraries, in place): the build information is compiled into fakequant._build
from a header generated in the build directory, and each environment builds in
its own directory under build/ (see build_dir()), so that two environments can
build from one checkout.
"""
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys

import torch
from setuptools import Extension, find_packages, setup
from setuptools.command.sdist import sdist as _sdist

ROOT = os.path.dirname(os.path.abspath(__file__))

# Compute capabilities built when TORCH_CUDA_ARCH_LIST is unset: the GPUs QAT
# runs on, Volta to Hopper, keeping those the installed nvcc supports, plus PTX
# of the newest kept (which the driver compiles for newer GPUs).
DEFAULT_CUDA_ARCHS = ("7.0", "7.5", "8.0", "8.6", "8.9", "9.0")
# The kernels take their parameters as __grid_constant__ (csrc/cuda), which
# needs compute capability 7.0.
MIN_CUDA_ARCH = (7, 0)
# torch's named architectures (TORCH_CUDA_ARCH_LIST="Ampere;Hopper"), by the
# capabilities they stand for; used only to check the list against MIN_CUDA_ARCH.
NAMED_CUDA_ARCHS = {
    "Kepler": ("3.5", "3.7"), "Maxwell": ("5.0", "5.2", "5.3"), "Pascal": ("6.0", "6.1", "6.2"),
    "Volta": ("7.0", "7.2"), "Turing": ("7.5",), "Ampere": ("8.0", "8.6", "8.7"), "Ada": ("8.9",),
    "Hopper": ("9.0",), "Blackwell": ("10.0", "10.3", "11.0", "12.0", "12.1"),
}


def read_version():
    """The one version string, in fakequant/_version.py (read, not imported:
    importing fakequant needs the library this builds)."""
    with open(os.path.join(ROOT, "fakequant", "_version.py")) as f:
        match = re.search(r'^__version__ = "([^"]+)"$', f.read(), flags=re.M)
    if match is None:
        raise RuntimeError("fakequant/_version.py has no line `__version__ = \"...\"`")
    return match.group(1)


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


def build_cuda():
    if os.environ.get("FAKEQUANT_CPU_ONLY", "0") == "1":
        return False
    if os.environ.get("FORCE_CUDA", "0") == "1":
        return True
    return torch.version.cuda is not None and _has_cuda_headers(CUDA_HOME)


def nvcc_archs(cuda_home=CUDA_HOME):
    """The (major, minor) capabilities the toolkit's nvcc compiles for, from
    `nvcc --list-gpu-arch`; None when nvcc cannot say."""
    nvcc = os.path.join(cuda_home, "bin", "nvcc") if cuda_home else shutil.which("nvcc")
    try:
        out = subprocess.run([nvcc, "--list-gpu-arch"], capture_output=True, text=True, check=True).stdout
    except (OSError, TypeError, subprocess.CalledProcessError):
        return None
    return {(int(m) // 10, int(m) % 10) for m in re.findall(r"compute_(\d+)", out)}


def _capability(arch):
    """'8.6', '9.0a', '8.6+PTX' -> (8, 6); None for anything else."""
    match = re.fullmatch(r"(\d+)\.(\d)[a-z]?(\+PTX)?", arch)
    return (int(match.group(1)), int(match.group(2))) if match else None


def cuda_arch_list(requested, supported):
    """The TORCH_CUDA_ARCH_LIST to build with. `requested` is the variable's
    value (None or empty: the default), `supported` what nvcc_archs() found.
    Raises ValueError for a capability below MIN_CUDA_ARCH or one nvcc lacks."""
    def fmt(cap):
        return f"{cap[0]}.{cap[1]}"

    have = sorted(supported) if supported else None
    if not requested:
        archs = [a for a in DEFAULT_CUDA_ARCHS if have is None or _capability(a) in supported]
        if not archs:
            raise ValueError(
                f"TORCH_CUDA_ARCH_LIST is unset and the nvcc of {CUDA_HOME} supports none of fakequant's default "
                f"architectures {', '.join(DEFAULT_CUDA_ARCHS)} (it builds for {', '.join(map(fmt, have))}); "
                f"set TORCH_CUDA_ARCH_LIST to capabilities of {fmt(MIN_CUDA_ARCH)} or newer that it supports")
        return ";".join(archs[:-1] + [archs[-1] + "+PTX"])
    if requested.strip() == "native":  # torch's own choice: the visible GPUs
        return requested.strip()
    for entry in requested.replace(" ", ";").split(";"):
        if not entry:
            continue
        name = entry.split("+")[0]
        caps = [_capability(a) for a in NAMED_CUDA_ARCHS[name]] if name in NAMED_CUDA_ARCHS else [_capability(entry)]
        for cap in filter(None, caps):
            if cap < MIN_CUDA_ARCH:
                raise ValueError(
                    f"TORCH_CUDA_ARCH_LIST={requested!r}: {entry!r} means compute capability {fmt(cap)}, but "
                    f"fakequant's CUDA kernels need {fmt(MIN_CUDA_ARCH)} or newer (they use __grid_constant__); "
                    f"allowed: capabilities from {fmt(MIN_CUDA_ARCH)} on"
                    + (f" that this nvcc supports ({', '.join(fmt(c) for c in have if c >= MIN_CUDA_ARCH)})" if have else "")
                    + ", e.g. TORCH_CUDA_ARCH_LIST='8.0;9.0'")
            if have is not None and name not in NAMED_CUDA_ARCHS and cap not in supported:
                raise ValueError(
                    f"TORCH_CUDA_ARCH_LIST={requested!r}: the nvcc of {CUDA_HOME} cannot build for {entry!r}; "
                    f"allowed: {', '.join(fmt(c) for c in have if c >= MIN_CUDA_ARCH)}")
    return requested


def build_dir():
    """build/<python>-torch<version>-<cpu|cuda>-<hash of the environment>:
    one per environment, so that builds of one checkout into two environments
    never share object files or a ninja file."""
    variant = "cuda" if WITH_CUDA else "cpu"
    env = hashlib.sha1(os.path.realpath(sys.prefix).encode()).hexdigest()[:8]
    tag = f"cp{sys.version_info[0]}{sys.version_info[1]}-torch{torch.__version__}-{variant}-{env}"
    return os.path.join("build", tag)


VERSION = read_version()
WITH_CUDA = build_cuda()
CUDA_ARCH_LIST = None
if WITH_CUDA:
    CUDA_ARCH_LIST = cuda_arch_list(os.environ.get("TORCH_CUDA_ARCH_LIST"), nvcc_archs())
    os.environ["TORCH_CUDA_ARCH_LIST"] = CUDA_ARCH_LIST  # what torch's builder reads

BUILD_INFO = {
    "VERSION": VERSION,
    "TORCH_VERSION": torch.__version__,
    "CUDA_VERSION": torch.version.cuda if WITH_CUDA else None,
    "CUDA_ARCH_LIST": CUDA_ARCH_LIST,
}


def build_info_header(info):
    """The header csrc/build_info.cpp compiles in: one macro per field, a C
    string literal, or NULL for None."""
    lines = ["// Generated by setup.py for this build; not part of the source tree."]
    for key, value in info.items():
        lines.append(f"#define FAKEQUANT_BUILD_{key} {'NULL' if value is None else json.dumps(value)}")
    return "\n".join(lines) + "\n"


def static_libstdcxx(cxx, workdir):
    """Whether the C++ compiler ``cxx`` (a command list) links libstdc++ into a shared library
    statically, found by linking a small one and reading its dynamic section (readelf); None
    when that cannot be told (no readelf, not ELF, the probe does not build). A toolchain that
    ships only libstdc++.a does this: the library then carries its own copy of libstdc++
    beside torch's, and the process dies at the first C++ exception it raises (the first GPU
    run, 2026-11-27: docs/cuda.md)."""
    readelf = shutil.which("readelf")
    if readelf is None or not sys.platform.startswith("linux"):
        return None
    os.makedirs(workdir, exist_ok=True)
    src, lib = os.path.join(workdir, "libstdcxx_probe.cpp"), os.path.join(workdir, "libstdcxx_probe.so")
    with open(src, "w") as f:
        f.write("#include <sstream>\n#include <string>\n"
                "std::string fakequant_probe(long v) { std::ostringstream s; s << v; return s.str(); }\n")
    try:
        subprocess.run([*cxx, "-shared", "-fPIC", "-Wl,-z,defs", src, "-o", lib], check=True, capture_output=True, timeout=120)
        dynamic = subprocess.run([readelf, "-d", lib], check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return "libstdc++" not in dynamic


class BuildExtensionWithInfo(BuildExtension):
    """torch's BuildExtension, which also writes the build information header
    into the build directory for fakequant._build (rewritten only when it
    changes, so an unchanged build stays up to date), and builds in this
    environment's build directory unless --build-temp names another (an
    editable install would otherwise build in a new temporary directory every
    time, compiling everything again)."""

    def finalize_options(self):
        if self.build_temp is None:
            self.build_temp = os.path.join(build_dir(), "temp")
        super().finalize_options()

    def build_extensions(self):
        generated = os.path.join(os.path.abspath(self.build_temp), "generated")
        os.makedirs(generated, exist_ok=True)
        header = os.path.join(generated, "fakequant_build_info.h")
        text = build_info_header(BUILD_INFO)
        if not os.path.exists(header) or open(header).read() != text:
            with open(header, "w") as f:
                f.write(text)
        for ext in self.extensions:
            if ext.name == "fakequant._build":
                ext.include_dirs.append(generated)
        cxx = list(self.compiler.compiler_cxx or self.compiler.compiler_so)
        if static_libstdcxx(cxx, os.path.join(os.path.abspath(self.build_temp), "probe")):
            raise RuntimeError(
                f"fakequant: the C++ compiler {' '.join(cxx)!r} links libstdc++ statically into shared "
                "libraries (it finds libstdc++.a, not libstdc++.so): fakequant's library would carry a "
                "second copy of libstdc++ beside torch's, and the process would crash at the first C++ "
                "exception (an invalid argument). Build with a compiler that links it dynamically, "
                "e.g. CC=/usr/bin/gcc CXX=/usr/bin/g++ (docs/cuda.md).")
        super().build_extensions()


class SdistWithoutBuildDir(_sdist):
    """setuptools' sdist, less the package metadata that egg_info writes into the
    build directory (out of the source tree, see build_dir()): the sdist's PKG-INFO
    carries the same, and a build from the sdist writes its own."""

    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, [f for f in files if f.split(os.sep)[0] != "build"])


def _sources(pattern, exclude=()):
    return sorted(p for p in glob.glob(pattern, recursive=True) if p not in exclude)


# nvcc's flags for the CUDA kernels (torch adds its own: cpp_extension's COMMON_NVCC_FLAGS, the
# C++ standard; benchmarks/loop_shapes.py builds its program with the same). No --use_fast_math:
# IEEE division, no flush to zero; -fmad=false so that no multiply and add fuse into one
# rounding (the kernels also spell every operation with a _rn intrinsic).
NVCC_FLAGS = ("-O3", "-prec-div=true", "-prec-sqrt=true", "-ftz=false", "-fmad=false",
              "-Xcompiler", "-ffp-contract=off")


def extension():
    # Every C++ file under csrc/ but the CUDA backend and build_info.cpp (fakequant._build).
    sources = [p for p in _sources("csrc/**/*.cpp", exclude=("csrc/build_info.cpp",))
               if not p.startswith("csrc/cuda/")]
    include_dirs = [os.path.join(ROOT, d) for d in ("csrc", "csrc/include") if os.path.isdir(os.path.join(ROOT, d))]
    # -O3 vectorises the element loops; no -ffast-math anywhere: the contract
    # needs correctly rounded division and IEEE NaN handling.
    # -fno-trapping-math lets the compiler turn the selects of the element loop
    # into vector blends; it changes no result.
    # -ffp-contract=off: the contract rounds once per operation, never fused.
    cxx = ["-O3", "-fno-trapping-math", "-ffp-contract=off", "-fopenmp"]
    # No debug information unless FAKEQUANT_DEBUG_INFO=1 (make sanitize sets it, for the
    # reports' line numbers): Python's -g would make it most of the library (and the wheel).
    if os.environ.get("FAKEQUANT_DEBUG_INFO", "0") != "1":
        cxx.append("-g0")
    kwargs = dict(include_dirs=include_dirs, extra_compile_args={"cxx": cxx}, extra_link_args=["-fopenmp"])
    if WITH_CUDA:
        # nvcc's files first: ninja starts the objects in this order, and they are the
        # slowest to compile (a parallel build then ends with the quick C++ files).
        sources = _sources("csrc/cuda/**/*.cu") + _sources("csrc/cuda/**/*.cpp") + sources
        cxx.append("-DFAKEQUANT_WITH_CUDA")  # csrc/ops registers the host functions for CUDA too
        kwargs["extra_compile_args"]["nvcc"] = list(NVCC_FLAGS)
        return CUDAExtension("fakequant._C", sources, **kwargs)
    return CppExtension("fakequant._C", sources, **kwargs)


def build_info_extension():
    # Python's C API only: no torch headers, no torch libraries, so that it
    # loads whatever torch is installed.
    return Extension("fakequant._build", ["csrc/build_info.cpp"], language="c++",
                     extra_compile_args={"cxx": ["-O2"]})


# What a source distribution requires: any torch the library builds with. A
# wheel, built for one torch, pins that release instead (requirements()).
MIN_TORCH = "torch>=2.4"
RUNTIME_REQUIREMENTS = ["tqdm>=4.60", "pyyaml>=5.4", "numpy"]


def building_sdist(argv=None):
    """True when this run makes a source distribution (`python -m build
    --sdist`, `setup.py sdist`): its version and requirements name no torch."""
    return "sdist" in (sys.argv[1:] if argv is None else argv)


def local_label(torch_version=None, with_cuda=None):
    """The wheel's local version label: the torch it was built against and
    whether its CUDA kernels are in, e.g. 'torch2.13.0cpu' (torch
    2.13.0+cpu), 'torch2.14.1cu130' (torch 2.14.1+cu130 with the CUDA
    kernels), 'torch2.14.1cu130.cpuonly' (the same torch, FAKEQUANT_CPU_ONLY=1)."""
    torch_version = torch.__version__ if torch_version is None else torch_version
    with_cuda = WITH_CUDA if with_cuda is None else with_cuda
    release, _, variant = torch_version.partition("+")
    variant = re.sub(r"[^a-z0-9]", "", variant.lower()) or "cpu"
    label = f"torch{release}{variant}"
    return label if with_cuda or variant == "cpu" else label + ".cpuonly"


def requirements():
    """The binary loads only into the torch release it was built against: pin
    it (the public version; `import fakequant` also checks the local label,
    +cpu or +cu128). numpy: QuantDescriptor.amax is an ndarray, as in
    pytorch-quantization."""
    release = torch.__version__.split("+")[0]
    return [f"torch=={release}", *RUNTIME_REQUIREMENTS]


if __name__ == "__main__":
    os.makedirs(build_dir(), exist_ok=True)
    sdist = building_sdist()
    setup(
        # A wheel's version names its torch (0.2.0+torch2.13.0cpu); the sdist's does not.
        version=VERSION if sdist else f"{VERSION}+{local_label()}",
        install_requires=[MIN_TORCH, *RUNTIME_REQUIREMENTS] if sdist else requirements(),
        packages=find_packages(include=["fakequant", "fakequant.*"]),
        package_data={"fakequant": ["py.typed"]},
        ext_modules=[build_info_extension(), extension()],
        cmdclass={"build_ext": BuildExtensionWithInfo, "sdist": SdistWithoutBuildDir},
        # An explicit --build-lib/--build-temp (make cuda-build, tools/sanitize.sh) overrides these.
        options={"build": {"build_base": build_dir()}, "egg_info": {"egg_base": build_dir()}},
    )
