"""Checks the library that `make cuda-build` built out of the tree: it loads
into the CUDA build of torch (so it links), every operator has a CPU and a CUDA
kernel, the CPU kernels of this build compute the contract, and fakequant._build
says what the library was built for (this torch, its CUDA, the architectures). Then, in a
child process (a crash there fails this check with its signal, and does not take it down),
every invalid-argument case of the op table (tests/op_table.py: invalid_cases()) on CPU
tensors through this build: each must raise its exception type with its message, as
tests/test_errors.py asserts for the CPU build (a C++ exception thrown and caught through
the library that nvcc's toolchain linked). With a GPU present, the CUDA kernels are also
compared with the CPU kernels.

    python .ci/check_cuda_build.py build/cuda/lib
    python .ci/check_cuda_build.py --errors build/cuda/lib    (the child's part alone)
"""
import glob
import importlib.util
import os
import re
import signal
import subprocess
import sys

import torch

def main(lib_dir):
    libs = glob.glob(f"{lib_dir}/fakequant/_C*.so")
    if len(libs) != 1:
        sys.exit(f"check_cuda_build: expected one fakequant/_C*.so under {lib_dir}, found {libs}")
    if not torch.version.cuda:
        sys.exit(f"check_cuda_build: torch {torch.__version__} has no CUDA")
    infos = glob.glob(f"{lib_dir}/fakequant/_build*.so")
    if len(infos) != 1:
        sys.exit(f"check_cuda_build: expected one fakequant/_build*.so under {lib_dir}, found {infos}")
    spec = importlib.util.spec_from_file_location("fakequant._build", infos[0])
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    if (build.TORCH_VERSION, build.CUDA_VERSION) != (torch.__version__, torch.version.cuda) or not build.CUDA_ARCH_LIST:
        sys.exit(f"check_cuda_build: fakequant._build says torch {build.TORCH_VERSION}, CUDA {build.CUDA_VERSION}, "
                 f"architectures {build.CUDA_ARCH_LIST}; this is torch {torch.__version__}, CUDA {torch.version.cuda}")

    torch.ops.load_library(libs[0])  # fails on an unresolved symbol
    # every operator the library defines (its schemas), not a list kept here
    names = sorted(schema.name for schema in torch._C._jit_get_all_schemas() if schema.name.startswith("fakequant::"))
    if not names:
        sys.exit(f"check_cuda_build: {libs[0]} defines no fakequant operator")
    missing = [
        f"{name} ({key})"
        for name in names
        for key in ("CPU", "CUDA")
        if not torch._C._dispatch_has_kernel_for_dispatch_key(name, key)
    ]
    if missing:
        sys.exit("check_cuda_build: no kernel for " + ", ".join(missing))

    ops = torch.ops.fakequant
    x = torch.tensor([-1.0, -0.25, 0.0, 0.3, 0.5, 2.0, float("nan")])
    y, mask = ops.fake_quantize_amax(x, torch.tensor(1.0), 8, False, True)
    s = torch.tensor(1.0) / 127
    expected = torch.clamp(torch.round(x / s), -127, 127) * s
    if not (torch.equal(y[:-1], expected[:-1]) and bool(y[-1].isnan()) and mask.tolist() == [0b0011111]):
        sys.exit(f"check_cuda_build: CPU kernel gave {y.tolist()}, mask {mask.tolist()}")

    checked = f"built for architectures {build.CUDA_ARCH_LIST}, kernels registered, CPU kernels correct"
    checked += ", " + invalid_arguments_in_child(lib_dir)
    if torch.cuda.is_available():
        xc = torch.randn(1000, 37) * 3
        for args in ((torch.tensor(2.5),), (torch.rand(1000, 1) + 0.5,)):
            yc, mc = ops.fake_quantize_amax(xc.cuda(), *(a.cuda() for a in args), 8, False, True)
            yr, mr = ops.fake_quantize_amax(xc, *args, 8, False, True)
            if not (torch.equal(yc.cpu(), yr) and torch.equal(mc.cpu(), mr)):
                sys.exit("check_cuda_build: CUDA and CPU kernels differ")
        checked += f", CUDA equals CPU on {torch.cuda.get_device_name()}"
    print(f"check_cuda_build: {libs[0]} with torch {torch.__version__} (CUDA {torch.version.cuda}): {checked}")


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def invalid_arguments_in_child(lib_dir):
    """Runs invalid_arguments() in a child process; returns what it checked, or exits
    naming the failure (a signal: the process crashed)."""
    run = subprocess.run([sys.executable, os.path.abspath(__file__), "--errors", lib_dir],
                         capture_output=True, text=True, timeout=600)
    if run.returncode != 0:
        how = (f"was killed by {signal.Signals(-run.returncode).name}" if run.returncode < 0
               else f"exited with {run.returncode}")
        sys.exit(f"check_cuda_build: the invalid-argument cases through {lib_dir} (child process) {how}:\n"
                 f"{(run.stdout + run.stderr).strip()[-6000:]}")
    return run.stdout.strip().splitlines()[-1]


def import_fakequant(lib_dir):
    """fakequant's Python package from this checkout with its compiled modules (_C,
    _build) from lib_dir, which come first on the package's path."""
    spec = importlib.util.spec_from_file_location(
        "fakequant", os.path.join(ROOT, "fakequant", "__init__.py"),
        submodule_search_locations=[os.path.join(os.path.abspath(lib_dir), "fakequant"), os.path.join(ROOT, "fakequant")])
    module = importlib.util.module_from_spec(spec)
    sys.modules["fakequant"] = module
    spec.loader.exec_module(module)
    loaded = os.path.realpath(sys.modules["fakequant._C"].__file__)
    if not loaded.startswith(os.path.realpath(lib_dir) + os.sep):
        sys.exit(f"check_cuda_build: fakequant._C came from {loaded}, not from {lib_dir}")
    return module


def invalid_arguments(lib_dir):
    """Every invalid-argument case of the op table, CPU tensors, through the library in
    lib_dir: the exception type and message (re.search, as pytest.raises(match=)) of
    tests/test_errors.py. Prints one line per failure and a count."""
    import faulthandler

    faulthandler.enable()
    import_fakequant(lib_dir)
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    import op_table

    cases = op_table.invalid_cases()
    failed = []
    for (entry, case), name in zip(cases, op_table.invalid_ids(cases)):
        try:
            entry.op(*case.arguments(entry.invalid_base()))
        except Exception as e:  # noqa: BLE001  (the type is checked here)
            if not isinstance(e, case.exc) or not re.search(case.match, str(e)):
                failed.append(f"{name}: raised {type(e).__name__}: {str(e).splitlines()[0]!r}, "
                              f"expected {case.exc.__name__} matching {case.match!r}")
        else:
            failed.append(f"{name}: raised nothing, expected {case.exc.__name__} matching {case.match!r}")
    for line in failed:
        print(f"check_cuda_build: FAILED {line}")
    if failed or not cases:
        sys.exit(f"check_cuda_build: {len(failed)} of {len(cases)} invalid-argument cases failed")
    print(f"{len(cases)} invalid-argument cases raised their exceptions (child process)")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--errors"]:
        invalid_arguments(sys.argv[2] if len(sys.argv) > 2 else "build/cuda/lib")
    else:
        main(sys.argv[1] if len(sys.argv) > 1 else "build/cuda/lib")
