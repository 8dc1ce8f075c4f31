"""Loads the compiled operator library, refusing one built for another torch."""
import torch

try:
    from . import _build_info
except ImportError as e:  # pragma: no cover - only without a build
    raise ImportError(
        "fakequant's C++ extension is not built; run `pip install --no-build-isolation -e .` "
        "(or `make build`) first"
    ) from e


def _check_versions():
    built, running = _build_info.TORCH_VERSION, torch.__version__
    if built != running:
        raise ImportError(
            f"fakequant was built for torch {built} (CUDA {_build_info.CUDA_VERSION}) but torch "
            f"{running} (CUDA {torch.version.cuda}) is installed; rebuild it with "
            "`pip install --no-build-isolation --force-reinstall --no-deps .`"
        )


_check_versions()
from . import _C  # noqa: E402,F401  (registers torch.ops.fakequant)

BUILT_FOR_TORCH = _build_info.TORCH_VERSION
BUILT_FOR_CUDA = _build_info.CUDA_VERSION
CUDA_ARCH_LIST = _build_info.CUDA_ARCH_LIST
