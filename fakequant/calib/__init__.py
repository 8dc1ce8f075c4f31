"""Calibrators: collect statistics of tensors and compute their amax.

Statistics only: this package knows tensors, not modules or quantizers
(``calibrate_weights`` reads any module's ``weight`` and ``weight_quantizer``).
"""
from .calibrator import _Calibrator
from .max import MaxCalibrator
from .histogram import HistogramCalibrator, calibrate_weights
from .reduce_amax import reduce_amax

__all__ = ["MaxCalibrator", "HistogramCalibrator", "calibrate_weights", "reduce_amax"]
