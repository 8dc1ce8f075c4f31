"""benchmarks/cuda_loop_shapes.cu, built with the extension's nvcc flags and run.

The program times the library's streaming kernels beside variants that change one thing each
(the vectors a lane keeps in flight, the registers, per token the next row's prefetch) against
``cudaMemcpyAsync`` on this machine's GPU, and checks every variant bit for bit against the
library's kernel (exit 2 where one differs). It needs nvcc and a torch with CUDA headers, no
extension build (about 15 s of nvcc). ``make gpu-check`` runs it; CI builds it only
(``--build-only``, ``make loop-shapes``), so that a change to the kernels' headers that breaks it
fails there.

    python benchmarks/loop_shapes.py [--log2 28] [--rounds 25] [--build-only]
"""
import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE = os.path.join(ROOT, "benchmarks", "cuda_loop_shapes.cu")


def nvcc_flags():
    """setup.py's NVCC_FLAGS and what torch's build adds to them (cpp_extension's
    COMMON_NVCC_FLAGS, its C++ standard and include paths)."""
    from torch.utils import cpp_extension

    spec = importlib.util.spec_from_file_location("fakequant_setup", os.path.join(ROOT, "setup.py"))
    setup = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(setup)  # (main-guarded: defines, builds nothing)
    includes = [f"-I{p}" for p in [os.path.join(ROOT, "csrc", "include"), os.path.join(ROOT, "csrc", "cuda"),
                                   *cpp_extension.include_paths()]]
    return [*setup.NVCC_FLAGS, *cpp_extension.COMMON_NVCC_FLAGS, "-std=c++20", *includes]


def build(out_dir, arch):
    from torch.utils import cpp_extension

    # the extension build's nvcc: torch's CUDA_HOME (the variable, else the nvcc on PATH)
    nvcc = os.path.join(cpp_extension.CUDA_HOME or "", "bin", "nvcc")
    if not os.path.exists(nvcc):
        sys.exit("loop_shapes: no nvcc (set CUDA_HOME or put nvcc on PATH)")
    binary = os.path.join(out_dir, "cuda_loop_shapes")
    cmd = [nvcc, *nvcc_flags(), f"-arch={arch}", SOURCE, "-o", binary]
    print("loop_shapes: " + " ".join(os.path.relpath(c, ROOT) if c.startswith(ROOT) else c for c in cmd[:1] + cmd[-3:]),
          flush=True)
    subprocess.run(cmd, check=True)
    return binary


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--log2", type=int, default=28, help="log2 of the elements (default 28)")
    parser.add_argument("--rounds", type=int, default=25, help="interleaved rounds (default 25)")
    parser.add_argument("--arch", help="nvcc's -arch (default: this GPU's, sm_90 without one)")
    parser.add_argument("--build-only", action="store_true", help="compile and link, do not run")
    args = parser.parse_args(argv)
    arch = args.arch
    if arch is None:
        import torch

        major, minor = torch.cuda.get_device_capability() if torch.cuda.is_available() else (9, 0)
        arch = f"sm_{major}{minor}"
    # a directory of its own: nothing written into the checkout, nothing shared with another build
    with tempfile.TemporaryDirectory(prefix="fakequant-loop-shapes-") as out_dir:
        binary = build(out_dir, arch)
        if args.build_only:
            print(f"loop_shapes: built for {arch}")
            return 0
        return subprocess.run([binary, str(args.log2), str(args.rounds)]).returncode


if __name__ == "__main__":
    sys.exit(main())
