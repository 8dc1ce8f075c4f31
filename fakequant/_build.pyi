# Type stub of the build information extension (csrc/build_info.cpp).
from typing import Optional

VERSION: str
TORCH_VERSION: str
CUDA_VERSION: Optional[str]  # None for a CPU-only build
CUDA_ARCH_LIST: Optional[str]  # None for a CPU-only build
