# Type stub of the compiled operator library (csrc/python_module.cpp). Importing it
# also registers the torch.ops.fakequant operators, which have no Python names here.
from typing import Dict, Tuple

AMAX_EPSILON: float
MIN_NUM_BITS: int
MAX_NUM_BITS: int
E4M3_MAX: float
E5M2_MAX: float
E2M1_MAX: float
# {(exponent_bits, mantissa_bits): (largest finite value, largest exponent)}
FLOAT_FORMATS: Dict[Tuple[int, int], Tuple[float, int]]

def amax_bound(num_bits: int, unsigned: bool, /) -> int: ...
def amax_range(num_bits: int, unsigned: bool, narrow_range: bool, /) -> Tuple[int, int]: ...
