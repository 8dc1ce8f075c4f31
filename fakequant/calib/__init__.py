"""Calibrators: collect statistics of tensors and compute their amax.

Statistics only: this package knows tensors, not modules or quantizers. Its modules:
``max`` and ``histogram`` (the calibrators: collection, merge across ranks, amax),
``_amax_search`` (the histogram's amax searches), ``_histogram_merge`` (the common bin
grid of several ranks), ``_distributed`` (the collectives).

``calibrate_weights`` walks a model's modules, so it lives at the model level
(:func:`fakequant.utils.calibrate_weights`); ``fakequant.calib.calibrate_weights`` and
``fakequant.calib.histogram.calibrate_weights``, pytorch-quantization's import paths, are
set to it by the ``fakequant`` package when it is imported.
"""
from .calibrator import _Calibrator
from .max import MaxCalibrator
from .histogram import HistogramCalibrator
from .reduce_amax import reduce_amax

__all__ = ["MaxCalibrator", "HistogramCalibrator", "reduce_amax"]
