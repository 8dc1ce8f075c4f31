"""Loads the compiled operator library, refusing one built for another torch.

What fakequant._C was built for is compiled into fakequant._build, a small
extension that uses Python's C API only and links no torch library. It is read
before _C is loaded: _C links against the torch it was built with, and loaded
into another one it may fail on an unresolved symbol, or load and misbehave.
"""
from __future__ import annotations

from types import ModuleType
from typing import Optional

import torch

from ._version import __version__

_REBUILD = "`pip install --no-build-isolation --force-reinstall --no-deps .` (or `make build`)"

try:
    from . import _build
except ImportError as e:  # only without a build
    raise ImportError(
        f"fakequant's C++ extension is not built (fakequant._build is missing: {e}); run "
        "`pip install --no-build-isolation -e .` (or `make build`) first"
    ) from e


def check_build(build: Optional[ModuleType] = None, torch_version: Optional[str] = None,
                version: str = __version__) -> None:
    """Raises ImportError, naming both sides, unless `build` (fakequant._build)
    was built for this torch (`torch_version`, its full version string with the
    local label, as +cpu or +cu128) and from this fakequant (`version`)."""
    build = _build if build is None else build
    running = torch.__version__ if torch_version is None else torch_version
    if build.TORCH_VERSION != running:
        raise ImportError(
            f"fakequant was built for torch {build.TORCH_VERSION} (CUDA {build.CUDA_VERSION}) but torch "
            f"{running} (CUDA {torch.version.cuda}) is installed; install the fakequant wheel built for torch "
            f"{running.split('+')[0]} (its version ends in +torch{running.split('+')[0]}...), or rebuild it with {_REBUILD}"
        )
    if build.VERSION != version:
        raise ImportError(
            f"fakequant's Python package is version {version} but its compiled library was built from version "
            f"{build.VERSION}; rebuild it with {_REBUILD}"
        )


check_build()
from . import _C  # noqa: E402,F401  (registers torch.ops.fakequant)

BUILT_FOR_TORCH = _build.TORCH_VERSION
BUILT_FOR_CUDA = _build.CUDA_VERSION
CUDA_ARCH_LIST = _build.CUDA_ARCH_LIST
