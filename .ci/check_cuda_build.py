"""Checks the library that `make cuda-build` built out of the tree: it loads
into the CUDA build of torch (so it links), every operator has a CPU and a CUDA
kernel, the CPU kernels of this build compute the contract, and fakequant._build
says what the library was built for (this torch, its CUDA, the architectures). With a GPU
present, the CUDA kernels are also compared with the CPU kernels.

    python .ci/check_cuda_build.py build/cuda/lib
"""
import glob
import importlib.util
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
    if torch.cuda.is_available():
        xc = torch.randn(1000, 37) * 3
        for args in ((torch.tensor(2.5),), (torch.rand(1000, 1) + 0.5,)):
            yc, mc = ops.fake_quantize_amax(xc.cuda(), *(a.cuda() for a in args), 8, False, True)
            yr, mr = ops.fake_quantize_amax(xc, *args, 8, False, True)
            if not (torch.equal(yc.cpu(), yr) and torch.equal(mc.cpu(), mr)):
                sys.exit("check_cuda_build: CUDA and CPU kernels differ")
        checked += f", CUDA equals CPU on {torch.cuda.get_device_name()}"
    print(f"check_cuda_build: {libs[0]} with torch {torch.__version__} (CUDA {torch.version.cuda}): {checked}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "build/cuda/lib")
