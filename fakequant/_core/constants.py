"""The constants and range rules of the C++ library (``fakequant._C``), for Python.

Nothing here is computed again: the values and the two range functions come
from the compiled library, which the kernels use too.
"""
from __future__ import annotations

from .. import _extension  # noqa: F401  (loads the library, refusing one built for another torch)
from typing import Dict, Sequence, Tuple

from .. import _C

#: amax at or below this gives a zero output (and a scale of 1 for ``quantize_amax``).
AMAX_EPSILON: float = _C.AMAX_EPSILON
#: The integer widths the operators implement.
MIN_NUM_BITS: int = _C.MIN_NUM_BITS
MAX_NUM_BITS: int = _C.MAX_NUM_BITS
#: Largest finite values of the small float formats.
E4M3_MAX: float = _C.E4M3_MAX
E5M2_MAX: float = _C.E5M2_MAX
E2M1_MAX: float = _C.E2M1_MAX

#: (E, M) of every small float format (FP8 E4M3/E5M2, FP6 E3M2/E2M3, FP4 E2M1) ->
#: (largest finite value, largest exponent: the MX specification's emax).
FLOAT_FORMATS: Dict[Tuple[int, int], Tuple[float, int]] = dict(_C.FLOAT_FORMATS)
#: (E, M) of every float format a descriptor may name -> largest finite value
#: (FP4 E2M1 only as block-wise elements).
FLOAT_FORMAT_MAX: Dict[Tuple[int, ...], float] = {fmt: value for fmt, (value, _) in FLOAT_FORMATS.items()}
#: (exponent_bits, mantissa_bits) of the formats fake_quantize_fp8 takes (FP8 and FP6)
#: -> largest finite value.
FP8_FORMATS: Dict[Tuple[int, ...], float] = {fmt: value for fmt, value in FLOAT_FORMAT_MAX.items() if sum(fmt) >= 5}
#: num_bits -> the llama.cpp (GGML) block type that llama.cpp's float16 block scales name
#: (``formats.BlockScales.GGML``; the block-scale formats are named in formats.py).
GGML_BLOCK_TYPES: Dict[int, str] = {8: "Q8_0", 4: "Q4_0"}
#: (num_bits, exponent_bits) of the block-wise float elements -> largest finite value.
BLOCK_FLOAT_FORMATS: Dict[Tuple[int, int], float] = {(1 + e + m, e): value for (e, m), value in FLOAT_FORMAT_MAX.items()}


# The library's ranges of every width, read once: looking them up is plain Python,
# which torch.compile traces (it cannot trace a call into the C library).
_RANGES: Dict[Tuple[int, bool, bool], Tuple[int, int]] = {(bits, unsigned, narrow): _C.amax_range(bits, unsigned, narrow)
           for bits in range(MIN_NUM_BITS, MAX_NUM_BITS + 1) for unsigned in (False, True) for narrow in (False, True)}


def amax_range(num_bits: int, unsigned: bool = False, narrow_range: bool = True) -> Tuple[int, int]:
    """``(quant_min, quant_max)`` of the amax family: ``[0, bound]`` unsigned,
    ``[-bound, bound]`` narrow, else ``[-bound - 1, bound]``. ValueError/TypeError
    (the library's) for a ``num_bits`` the operators do not take."""
    if isinstance(num_bits, int) and not isinstance(num_bits, bool):
        found = _RANGES.get((num_bits, bool(unsigned), bool(narrow_range)))
        if found is not None:
            return found
    return _C.amax_range(num_bits, bool(unsigned), bool(narrow_range))


def amax_bound(num_bits: int, unsigned: bool = False) -> int:
    """The largest integer of the amax family's range: ``2^(num_bits - 1 + unsigned) - 1``."""
    return amax_range(num_bits, unsigned)[1]


def float_format_max(fmt: Sequence[int]) -> float:
    """The largest finite value of the float format ``(E, M)``."""
    return FLOAT_FORMAT_MAX[tuple(fmt)]


def min_max_levels(num_bits: int) -> int:
    """The number of steps of the min/max family (``fake_quantize_min_max``):
    ``2^num_bits - 1`` steps between ``min_range`` and ``max_range``, which is the
    unsigned bound of the amax family."""
    return amax_bound(num_bits, True)
