"""``python -m fakequant info``: what this build is, and a quick self-check of the
operators against the plain-PyTorch reference of the contract."""
import argparse
import platform
import sys

import torch

import fakequant
from fakequant._diagnostics.self_check import self_check

__all__ = ["info", "main", "self_check"]


def info():
    print(f"fakequant {fakequant.__version__}")
    print(f"  python {platform.python_version()} on {platform.machine()}")
    # (the build information is compiled into fakequant._build; see fakequant/_extension.py)
    print(f"  torch {torch.__version__} (built for {fakequant.BUILT_FOR_TORCH})")
    if fakequant.BUILT_FOR_CUDA:
        print(f"  build: CPU and CUDA {fakequant.BUILT_FOR_CUDA}, architectures {fakequant.CUDA_ARCH_LIST}")
    else:
        print("  build: CPU only")
    capability = torch.backends.cpu.get_cpu_capability() if hasattr(torch.backends, "cpu") else "?"
    print(f"  CPU: {torch.get_num_threads()} threads, vector capability {capability}")
    devices = ["cpu"]
    if torch.cuda.is_available():
        devices.append("cuda")
        print(f"  GPU: {torch.cuda.get_device_name()}")
    failures, checked, seconds = self_check(devices)
    status = "ok" if not failures else f"FAILED: {', '.join(failures)}"
    print(f"  self-check against the reference: {checked} cases on {', '.join(devices)} in {seconds:.2f} s: {status}")
    return 1 if failures else 0


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m fakequant", description=__doc__)
    parser.add_argument("command", choices=["info", "gpu-check"],
                        help="info: build details and a self-check; gpu-check: the kernels on this machine's GPU "
                             "(correctness, compute-sanitizer, bandwidth; see python -m fakequant gpu-check -h)")
    args, rest = parser.parse_known_args(argv)
    if args.command == "gpu-check":
        from fakequant._diagnostics import gpu_check

        return gpu_check.main(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    return info()


if __name__ == "__main__":
    sys.exit(main())
