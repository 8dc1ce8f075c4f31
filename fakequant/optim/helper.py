"""Grouping and freezing parameters by name, and in-place weight quantization."""
from __future__ import annotations

import re
import warnings
from typing import Any, Dict, Iterator, List, Optional, Pattern, Sequence

import torch

from .._core import TypeAndAttributeError, TypeAndValueError

__all__ = ["match_parameters", "group_parameters", "freeze_parameters", "quant_weight_inplace"]


def _check_patterns(patterns: Sequence[str], name: str = "patterns") -> List[Pattern[str]]:
    if isinstance(patterns, str) or not all(isinstance(p, str) for p in patterns):
        raise TypeError(f"{name} must be a list of regular expressions (str), got {patterns!r}")
    return [re.compile(p) for p in patterns]


def _check_patterns_list(patterns_list: Any) -> List[List[Pattern[str]]]:
    """``patterns_list`` compiled, checked before anything else (as pytorch-quantization did)."""
    if not isinstance(patterns_list, (list, tuple)) or not all(isinstance(p, list) for p in patterns_list):
        raise TypeError(f"patterns_list must be list of list of patterns (a list of lists of regular "
                        f"expressions), got {patterns_list!r}")
    return [_check_patterns(p) for p in patterns_list]


def _check_model(model: Any) -> torch.nn.Module:
    # pytorch-quantization failed on model.named_parameters() (AttributeError), when the
    # optimizer read the group; here at the call, naming the argument, as both types.
    if not callable(getattr(model, "named_parameters", None)):
        raise TypeAndAttributeError(
            f"model must be a torch.nn.Module (with named_parameters()), got {type(model).__name__} "
            f"({type(model).__name__!r} object has no attribute 'named_parameters')")
    return model


def match_parameters(model: torch.nn.Module, patterns: Sequence[str]) -> Iterator[torch.nn.Parameter]:
    """Yields the parameters of ``model`` whose name matches (``re.search``) any of ``patterns``.

    Raises:
        TypeAndAttributeError: (a TypeError and an AttributeError) if ``model`` is not a
            module (None, say), on the call.
    """
    _check_model(model)
    compiled = _check_patterns(patterns)
    return _matching(model, compiled)


def _matching(model: torch.nn.Module, compiled: List[Pattern[str]]) -> Iterator[torch.nn.Parameter]:
    for name, param in model.named_parameters():
        if any(p.search(name) for p in compiled):
            yield param


def group_parameters(
    model: torch.nn.Module,
    patterns_list: List[List[str]],
    lrs: Optional[Sequence[float]] = None,
    momentums: Optional[Sequence[float]] = None,
    weight_decays: Optional[Sequence[float]] = None,
) -> List[Dict[str, Any]]:
    """Optimizer parameter groups, one per list of patterns in ``patterns_list``.

    Args:
        model: a module.
        patterns_list: a list of lists of regular expressions; group ``i`` holds
            the parameters matching ``patterns_list[i]`` (the lists should not overlap).
        lrs, momentums, weight_decays: optional per-group values, one per group.

    Returns:
        A list of dicts for ``torch.optim`` (``[{"params": ..., "lr": ...}, ...]``).

    Raises:
        TypeError: if ``patterns_list`` is not a list of lists of patterns (checked first).
        TypeAndValueError: if ``lrs``, ``momentums`` or ``weight_decays`` has another
            length than ``patterns_list`` (pytorch-quantization: TypeError).
        TypeAndAttributeError: if ``model`` is not a module (pytorch-quantization:
            AttributeError, once the optimizer read the group).
    """
    compiled = _check_patterns_list(patterns_list)
    per_group = [(key, values) for key, values in (("lr", lrs), ("momentum", momentums),
                                                   ("weight_decay", weight_decays)) if values is not None]
    for key, values in per_group:
        if len(values) != len(patterns_list):
            raise TypeAndValueError(f"{key}s has {len(values)} values for {len(patterns_list)} groups "
                                    f"(len({key}s) must match len(patterns_list))")
    _check_model(model)
    groups: List[Dict[str, Any]] = [{"params": list(_matching(model, patterns))} for patterns in compiled]
    for key, values in per_group:
        for group, value in zip(groups, values):
            group[key] = value
    return groups


def freeze_parameters(model: torch.nn.Module, patterns: Sequence[str]) -> None:
    """Sets ``requires_grad=False`` on the parameters whose name matches any of ``patterns``."""
    for param in match_parameters(model, patterns):
        param.requires_grad_(False)


def quant_weight_inplace(model: torch.nn.Module) -> None:
    """Replaces the weight of every quantized module by its quantized value
    (for relax-and-round schemes; the float weight is lost)."""
    for module in model.modules():
        quantizer = getattr(module, "_weight_quantizer", None)
        view = getattr(module, "_weight_for_quantizer", None)  # (a view of the weight, written through)
        weight = view() if callable(view) else getattr(module, "weight", None)
        if quantizer is None or not isinstance(weight, torch.Tensor):
            continue
        if not quantizer.fake_quant:
            warnings.warn("in-place real (integer) quantization of a weight: inference only", stacklevel=2)
        with torch.no_grad():
            weight.copy_(quantizer(weight))
