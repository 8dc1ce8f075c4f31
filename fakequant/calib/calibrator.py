"""Base class of the calibrators."""

from .._core import check_bool, check_num_bits, normalize_axis, resolve_axes

__all__ = ["_Calibrator"]


def normalize_kept_axes(axis, ndim):
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

    def __init__(self, num_bits=8, axis=None, unsigned=False):
        self._num_bits = check_num_bits(num_bits)
        self._axis = normalize_axis(axis)
        self._unsigned = check_bool(unsigned, "unsigned")

    @property
    def axis(self):
        return self._axis

    @property
    def num_bits(self):
        return self._num_bits

    @property
    def unsigned(self):
        return self._unsigned

    def collect(self, x):
        """Accumulates statistics of tensor ``x``."""
        raise NotImplementedError

    def reset(self):
        """Forgets everything collected."""
        raise NotImplementedError

    def compute_amax(self, *args, **kwargs):
        """The amax (a tensor) of what was collected, or None if nothing was."""
        raise NotImplementedError

    def __repr__(self):
        return f"num_bits={self._num_bits} axis={self._axis} unsigned={self._unsigned}"
