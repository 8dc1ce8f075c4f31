"""Helpers QAT scripts import: :func:`reduce_amax`, :func:`calibrate`, logging helpers."""
from .reduce_amax import reduce_amax
from .calibrate import calibrate, collect_stats, compute_amax
from .quant_logging import reset_logger_handler

__all__ = ["reduce_amax", "calibrate", "collect_stats", "compute_amax", "reset_logger_handler"]
