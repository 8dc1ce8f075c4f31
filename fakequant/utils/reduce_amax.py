"""pytorch-quantization's import path of :func:`~fakequant.calib.reduce_amax` (a statistic,
which lives in :mod:`fakequant.calib`)."""
from ..calib.reduce_amax import reduce_amax

__all__ = ["reduce_amax"]
