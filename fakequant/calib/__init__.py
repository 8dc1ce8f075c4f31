"""Calibrators: collect statistics of tensors and compute their amax."""
from .calibrator import _Calibrator
from .max import MaxCalibrator
from .histogram import HistogramCalibrator, calibrate_weights

__all__ = ["MaxCalibrator", "HistogramCalibrator", "calibrate_weights"]
