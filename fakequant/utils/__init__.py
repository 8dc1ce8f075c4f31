"""Helpers QAT scripts import: :func:`reduce_amax`, :func:`calibrate`, :func:`calibrate_weights`,
FSDP2 helpers, logging helpers."""
from .reduce_amax import reduce_amax
from .calibrate import calibrate, calibrate_weights, collect_stats, compute_amax
from .fsdp import prepare_fully_shard, register_quantizer_buffers
from .quant_logging import reset_logger_handler

__all__ = ["reduce_amax", "calibrate", "calibrate_weights", "collect_stats", "compute_amax", "prepare_fully_shard",
           "register_quantizer_buffers", "reset_logger_handler"]
