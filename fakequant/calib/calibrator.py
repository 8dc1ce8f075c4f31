"""Base class of the calibrators."""
from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple, Union

from .._core import check_bool, check_num_bits, normalize_axis, resolve_axes

__all__ = ["_Calibrator"]


def normalize_kept_axes(axis: Optional[Union[int, Sequence[int]]], ndim: int) -> Tuple[int, ...]:
    """The (sorted, non-negative) axes kept by a calibrator with ``axis`` on an
    ``ndim``-dimensional tensor: () for per-tensor."""
    if axis is None:
        return ()
    return tuple(sorted(resolve_axes(axis, ndim, "calibrator axis")))


class _Calibrator:
    """Base of calibrators: ``collect`` tensors, then ``compute_amax``.

    Args:
        num_bits: bits of the quantization being calibrated (an int, or an (E, M) tuple).
        axis: None (one amax), an int or a tuple of ints: the axes that keep their own amax.
        unsigned: whether the quantization is unsigned.
    """

    def __init__(
        self,
        num_bits: Union[int, Tuple[int, int]] = 8,
        axis: Optional[Union[int, Sequence[int]]] = None,
        unsigned: bool = False,
    ) -> None:
        self._num_bits = check_num_bits(num_bits)
        self._axis = normalize_axis(axis)
        self._unsigned = check_bool(unsigned, "unsigned")

    @property
    def axis(self) -> Optional[Union[int, Tuple[int, ...]]]:
        return self._axis

    @property
    def num_bits(self) -> Union[int, Tuple[int, int]]:
        """The number of bits (or (E, M) format) of the quantizer being calibrated; a quantizer sets
        its calibrator's to its own when it changes."""
        return self._num_bits

    @num_bits.setter
    def num_bits(self, value: Union[int, Tuple[int, int]]) -> None:
        self._num_bits = check_num_bits(value)

    @property
    def unsigned(self) -> bool:
        return self._unsigned

    @unsigned.setter
    def unsigned(self, value: bool) -> None:
        self._unsigned = check_bool(value, "unsigned")

    def collect(self, x: Any) -> None:
        """Accumulates statistics of tensor ``x``."""
        raise NotImplementedError

    def reset(self) -> None:
        """Forgets everything collected."""
        raise NotImplementedError

    def compute_amax(self, *args: Any, **kwargs: Any) -> Any:
        """The amax (a tensor) of what was collected, or None if nothing was."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"num_bits={self._num_bits} axis={self._axis} unsigned={self._unsigned}"
