"""Argument validation, each rule once. Errors name the argument, the value and
what is allowed (TypeError for a wrong type, ValueError for a wrong value)."""
from __future__ import annotations

import math
import numbers
from typing import TYPE_CHECKING, Any, List, Literal, Optional, Tuple, Union, overload

from .constants import FLOAT_FORMAT_MAX, FP8_FORMATS, MAX_NUM_BITS, MIN_NUM_BITS
from .errors import TypeAndValueError

if TYPE_CHECKING:
    import torch

__all__ = ["is_int", "check_tensor", "check_int", "check_float", "check_bool", "check_num_bits",
           "check_integer_num_bits", "check_fp8_format", "normalize_axis", "resolve_axes"]


def is_int(value: object) -> bool:
    """An integer that is not a bool."""
    kind = type(value)
    if kind is int:  # the common case first: these checks run on every operator call
        return True
    return kind is not bool and isinstance(value, numbers.Integral)


def check_tensor(value: Any, name: str) -> torch.Tensor:
    if not isinstance(value, _tensor_type()):
        raise TypeError(f"fakequant: {name} must be a torch.Tensor, got {type(value).__name__}")
    return value


def _tensor_type() -> type[torch.Tensor]:
    # torch is imported here, not with this module (fakequant._core imports without
    # torch); no global is cached, since a global set after a first torch.compile trace
    # would fail that trace's guard and recompile it.
    import torch

    return torch.Tensor


@overload
def check_int(value: Any, name: str, optional: Literal[False] = ...) -> int: ...


@overload
def check_int(value: Any, name: str, optional: bool) -> Optional[int]: ...


def check_int(value: Any, name: str, optional: bool = False) -> Optional[int]:
    """``value`` as an int (None too, when ``optional``)."""
    if optional and value is None:
        return None
    if not is_int(value):
        raise TypeError(f"fakequant: {name} must be an int, got {value!r}")
    return int(value)


def check_float(value: Any, name: str) -> float:
    """``value`` as a finite float."""
    if type(value) is float and math.isfinite(value):
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"fakequant: {name} must be a float, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"fakequant: {name} must be finite, got {value!r}")
    return value


def check_bool(value: Any, name: str) -> bool:
    if value is not True and value is not False:
        raise TypeError(f"{name} must be a bool, got {value!r} ({type(value).__name__})")
    return value


def _check_bits_range(num_bits: int, name: str, formats_too: bool) -> int:
    if not MIN_NUM_BITS <= num_bits <= MAX_NUM_BITS:
        formats = f" or an (E, M) tuple in {list(FLOAT_FORMAT_MAX)}" if formats_too else ""
        raise ValueError(f"{name} must be an integer in [{MIN_NUM_BITS}, {MAX_NUM_BITS}]{formats}, got {num_bits!r}")
    return int(num_bits)


def check_integer_num_bits(num_bits: Any, name: str = "num_bits") -> int:
    """An integer width the operators implement: an int in [MIN_NUM_BITS, MAX_NUM_BITS]."""
    if not is_int(num_bits):
        raise TypeError(f"{name} must be an int, got {num_bits!r}")
    return _check_bits_range(num_bits, name, formats_too=False)


def _pq_num_bits_text(num_bits: object) -> str:
    # pytorch-quantization 2.2.1's words for a num_bits that is neither an int nor
    # (4, 3) (a TypeError there), kept inside ours for scripts that match them.
    return f"num_bits must be a postive integer or tuple (4,3), not {type(num_bits)}"


def check_num_bits(num_bits: Any, name: str = "num_bits") -> Union[int, Tuple[int, int]]:
    """Validates a descriptor's ``num_bits``: an integer width (as
    :func:`check_integer_num_bits`) or an ``(E, M)`` tuple of a supported float
    format; returns it normalised (lists become tuples). A tuple of two ints that
    is no supported format raises :class:`TypeAndValueError` (pytorch-quantization
    raised TypeError); any other type TypeError."""
    if is_int(num_bits):
        return _check_bits_range(num_bits, name, formats_too=True)
    if isinstance(num_bits, (tuple, list)) and len(num_bits) == 2 and all(is_int(v) for v in num_bits):
        fmt = (int(num_bits[0]), int(num_bits[1]))
        if fmt not in FLOAT_FORMAT_MAX:
            raise TypeAndValueError(f"{name}={fmt!r}: the supported (E, M) formats are {list(FLOAT_FORMAT_MAX)} "
                                    f"({_pq_num_bits_text(num_bits)})")
        return fmt
    raise TypeError(
        f"{name} must be an int or an (E, M) tuple of two ints, got {num_bits!r} "
        f"({_pq_num_bits_text(num_bits)})"
    )


def check_fp8_format(exponent_bits: Any, mantissa_bits: Any) -> Tuple[int, int]:
    """``(exponent_bits, mantissa_bits)`` of an FP8 or FP6 format: (4, 3) E4M3, (5, 2)
    E5M2, (3, 2) E3M2 or (2, 3) E2M3."""
    exponent_bits = check_int(exponent_bits, "exponent_bits")
    mantissa_bits = check_int(mantissa_bits, "mantissa_bits")
    if (exponent_bits, mantissa_bits) not in FP8_FORMATS:
        raise ValueError(
            "fakequant: (exponent_bits, mantissa_bits) must be (4, 3) for FP8 E4M3, (5, 2) for FP8 E5M2, "
            f"(3, 2) for FP6 E3M2 or (2, 3) for FP6 E2M3, got ({exponent_bits}, {mantissa_bits})"
        )
    return exponent_bits, mantissa_bits


def resolve_axes(axes: Any, ndim: int, what: str = "axis") -> List[int]:
    """The non-negative positions (a list, in the given order) of ``axes`` (an int or a
    sequence of ints, negative ones counted from the end) in a tensor of ``ndim`` dimensions."""
    given = (axes,) if is_int(axes) else tuple(axes)
    out = []
    for a in given:
        if not -ndim <= a < ndim:
            raise ValueError(f"{what} {a} is out of range for a tensor with {ndim} dimensions")
        out.append(int(a) % ndim)
    if len(set(out)) != len(out):
        raise ValueError(f"{what} {axes!r} names a dimension twice")
    return out


def normalize_axis(axis: Any) -> Optional[Union[int, Tuple[int, ...]]]:
    """None, an int, or a tuple of distinct ints (a list becomes a tuple)."""
    if axis is None:
        return None
    if is_int(axis):
        return int(axis)
    if isinstance(axis, (tuple, list)) and all(is_int(a) for a in axis):
        if len(set(axis)) != len(axis):
            raise ValueError(f"axis must not repeat an axis, got {axis!r}")
        return tuple(int(a) for a in axis)
    raise TypeError(f"axis must be None, an int or a tuple of ints, got {axis!r} ({type(axis).__name__})")
