"""Optimizer helpers for QAT (pytorch-quantization's ``optim`` package)."""
from . import helper
from .helper import freeze_parameters, group_parameters, match_parameters, quant_weight_inplace

__all__ = ["helper", "match_parameters", "group_parameters", "freeze_parameters", "quant_weight_inplace"]
