"""Calibration of a quantized model: feed it data, then set every amax."""
from __future__ import annotations

import numbers
import warnings
from typing import TYPE_CHECKING, Any, Callable, Iterable, List, Optional, Sized, Tuple, cast

import torch

from ..calib import HistogramCalibrator, MaxCalibrator, _distributed
from ..calib.histogram import METHODS as HISTOGRAM_METHODS
from ..nn.quantizer_list import QuantizerList
from ..nn.tensor_quantizer import TensorQuantizer

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = ["calibrate", "collect_stats", "compute_amax", "calibrate_weights"]

def _quantizers(model: torch.nn.Module) -> List[Tuple[str, TensorQuantizer]]:
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    found = [(name, m) for name, m in model.named_modules() if isinstance(m, TensorQuantizer)]
    if not found:
        raise ValueError("model has no TensorQuantizer: quantize it first (quant_nn modules, "
                         "quant_modules.initialize() or fakequant.quantize_model)")
    return found


def _move(batch: Any, device: Optional[torch.device]) -> Any:
    if device is None:
        return batch
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (list, tuple)):
        return type(batch)(_move(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: _move(v, device) for k, v in batch.items()}
    return batch


def _default_forward(model: torch.nn.Module, batch: Any) -> Any:
    # (inputs, labels) pairs feed the inputs; dicts are keyword arguments.
    if isinstance(batch, dict):
        return model(**batch)
    if isinstance(batch, (list, tuple)):
        return model(batch[0])
    return model(batch)


def collect_stats(model: torch.nn.Module, data: Iterable, num_batches: Optional[int] = None,
                  forward_fn: Optional[Callable[[torch.nn.Module, Any], Any]] = None, progress: bool = True) -> int:
    """Runs ``model`` on batches of ``data`` with every calibrator collecting.

    Quantizers with a calibrator collect instead of quantizing (and do not
    clip); quantizers without one are bypassed. The model runs in eval mode under ``no_grad``;
    its mode and every quantizer's switches are restored afterwards, even on
    an exception.

    Args:
        model: a quantized model.
        data: an iterable of batches (a DataLoader): tensors, ``(inputs, labels)``
            sequences (the first item is fed) or dicts (fed as keyword arguments).
            Tensors are moved to the device of the model's parameters.
        num_batches: stop after this many batches (default: all of ``data``).
        forward_fn: ``forward_fn(model, batch)`` runs one batch, for other layouts.
        progress: show a tqdm progress bar.

    Returns:
        The number of batches run.
    """
    return _collect_stats(model, data, num_batches, forward_fn, progress, allow_empty=False)


def _collect_stats(
    model: torch.nn.Module,
    data: Iterable,
    num_batches: Optional[int],
    forward_fn: Optional[Callable[[torch.nn.Module, Any], Any]],
    progress: bool,
    allow_empty: bool,
) -> int:
    if num_batches is not None and (isinstance(num_batches, bool) or not isinstance(num_batches, numbers.Integral)
                                    or num_batches < 1):
        raise ValueError(f"num_batches must be a positive int or None, got {num_batches!r}")
    if forward_fn is not None and not callable(forward_fn):
        raise TypeError(f"forward_fn must be callable, got {type(forward_fn).__name__}")
    quantizers = _quantizers(model)
    param = next(model.parameters(), None)
    device = param.device if param is not None else None
    run = forward_fn or _default_forward

    saved = [(q, q._disabled, q._if_quant, q._if_calib, q._if_clip) for _, q in quantizers]
    was_training = model.training
    total: Optional[int] = num_batches
    # (cast: mypy's hasattr narrowing does not make data Sized)
    if total is None and hasattr(data, "__len__"):
        total = len(cast(Sized, data))
    elif total is not None and hasattr(data, "__len__"):
        total = min(total, len(cast(Sized, data)))
    count = 0
    try:
        for _, q in quantizers:
            if q._calibrator is not None:
                q.disable_quant()
                q.enable_calib()
                q._if_clip = False  # the layers below see unclipped values while calibrating
            else:
                q.disable()
        model.eval()
        from tqdm.auto import tqdm

        with torch.no_grad(), tqdm(total=total, desc="calibrating", unit="batch", disable=not progress) as bar:
            for batch in data:
                if num_batches is not None and count >= num_batches:
                    break
                run(model, _move(batch, device))
                count += 1
                bar.update(1)
    finally:
        for q, disabled, if_quant, if_calib, if_clip in saved:
            q._disabled, q._if_quant, q._if_calib, q._if_clip = disabled, if_quant, if_calib, if_clip
        model.train(was_training)
    if count == 0 and not allow_empty:
        raise ValueError("data yielded no batch to calibrate with")
    return count


def _will_sync(sync: Optional[bool], group: Optional[ProcessGroup]) -> bool:
    if sync is not None and not isinstance(sync, bool):
        raise TypeError(f"sync must be a bool or None, got {sync!r}")
    return sync is not False and _distributed.is_distributed(group)


def _sync_calibrators(
    quantizers: List[Tuple[str, TensorQuantizer]], sync: Optional[bool], group: Optional[ProcessGroup]
) -> None:
    """Merges every calibrator's statistics over the ranks of torch.distributed
    (all ranks call this, with the same model): afterwards they agree."""
    if not _will_sync(sync, group):
        return
    for _, q in quantizers:
        calibrator = q._calibrator
        if calibrator is not None and hasattr(calibrator, "sync"):
            calibrator.sync(group)


def _reshard(model: torch.nn.Module) -> None:
    """Reshards the FSDP2 (``fully_shard``) modules of ``model`` that a forward left
    unsharded (the root, under ``no_grad``): their registered parameters are then the
    sharded ones, which the learned ranges set here must reach (a value written to an
    unsharded parameter is dropped when it is resharded)."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # (a torch without FSDP2)
        return
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.reshard()


def compute_amax(model: torch.nn.Module, method: str = "max", strict: bool = False, *,
                 sync: Optional[bool] = None, group: Optional[ProcessGroup] = None, **kwargs: Any) -> int:
    """Loads every calibrator's amax into its quantizer.

    Quantizers with a ``MaxCalibrator`` (the default ``calib_method="max"``)
    take the max; quantizers with ``learn_amax`` also start their learned
    range there (``init_learn_amax``). Quantizers with a ``HistogramCalibrator``
    (``calib_method="histogram"``) take ``compute_amax(method, **kwargs)``:
    ``method`` is ``"entropy"``, ``"mse"``, ``"percentile"`` (with
    ``percentile=...``) or ``"max"``.

    Under torch.distributed (DDP, FSDP: each rank calibrated on its own
    batches) every rank must call this, with the same model: the calibrators
    first merge what all ranks collected (:meth:`~fakequant.calib.MaxCalibrator.sync`: all-reduce
    MAX; :meth:`~fakequant.calib.HistogramCalibrator.sync`: histograms summed on a common grid),
    so every rank sets the same amax.

    Args:
        strict: raise if a calibrator saw no data; otherwise (default) warn and
            leave that quantizer's amax as it was (dynamic if it had none). Disabled
            quantizers see no data and are skipped.
        sync: merge the calibrators over the ranks of ``group`` first. Default
            None: when torch.distributed is initialised with more than one rank.
        group: the process group (default: the world).

    Returns:
        The number of quantizers whose amax was set.
    """
    if method not in HISTOGRAM_METHODS:
        raise ValueError(f"method must be one of {list(HISTOGRAM_METHODS)}, got {method!r}")
    quantizers = _quantizers(model)
    _sync_calibrators(quantizers, sync, group)
    _reshard(model)
    loaded = 0
    uncalibrated = []
    for name, q in quantizers:
        calibrator = q._calibrator
        if calibrator is None:
            continue
        if isinstance(calibrator, MaxCalibrator):
            amax = calibrator.compute_amax()
        else:
            amax = calibrator.compute_amax(method, **kwargs)
        if amax is None:
            if q._disabled:  # (bypassed, it sees no data: a weight-only preset's input quantizers)
                continue
            uncalibrated.append((name, q))
            continue
        if not q._load_calibrated_amax(amax, f"quantizer {name!r}"):
            continue
        if q.learn_amax:  # start the learned range at the calibrated one
            q.init_learn_amax()
        loaded += 1
    return loaded + _fill_uncalibrated(model, uncalibrated, strict)


def _fill_uncalibrated(model: torch.nn.Module, uncalibrated: List[Tuple[str, TensorQuantizer]], strict: bool) -> int:
    """The quantizers that collected no data: members of a QuantizerList (the experts that
    no calibration token was routed to) take the list's rule; any other is an error with
    ``strict``, else a warning, its amax unchanged. Returns how many were filled."""
    if not uncalibrated:
        return 0
    filled = 0
    left = {id(q): name for name, q in uncalibrated}
    for list_name, group in model.named_modules():
        if isinstance(group, QuantizerList):
            indices = group.fill_uncalibrated(q for _, q in uncalibrated)
            members = group.quantizers()
            for i in indices:
                left.pop(id(members[i]), None)
                if members[i].learn_amax:
                    members[i].init_learn_amax()
            if indices:
                filled += len(indices)
                warnings.warn(f"{len(indices)} of the {len(group)} quantizers of {list_name!r} (experts "
                              f"{indices[:8]}{'...' if len(indices) > 8 else ''}) collected no data during "
                              "calibration; they take the largest amax of the others", stacklevel=3)
    for name in left.values():
        if strict:
            raise RuntimeError(f"quantizer {name!r} collected no data during calibration")
        warnings.warn(f"quantizer {name!r} collected no data during calibration; its amax is unchanged", stacklevel=3)
    return filled


def calibrate(model: torch.nn.Module, data: Iterable, num_batches: Optional[int] = None, method: str = "max", *,
              forward_fn: Optional[Callable[[torch.nn.Module, Any], Any]] = None, progress: bool = True,
              sync: Optional[bool] = None, group: Optional[ProcessGroup] = None, **kwargs: Any) -> torch.nn.Module:
    """Calibrates a quantized model in one call: resets the calibrators, runs
    :func:`collect_stats` (with a tqdm progress bar), then :func:`compute_amax`.

    Args:
        model: a quantized model (quant_nn modules, ``quant_modules.initialize()``
            or ``fakequant.quantize_model``).
        data: batches, as for :func:`collect_stats`.
        num_batches: how many batches to use (default: all).
        method: the amax rule (``"entropy"``, ``"mse"``, ``"percentile"``, ``"max"``).
            Other than ``"max"``, it applies to every per-tensor quantizer: those
            built with the default max calibrator collect a histogram for this call
            (their own calibrator is back afterwards). Per-channel and block
            quantizers (weights, typically) take the max, as the histogram rules are
            per tensor; if no quantizer is per tensor, ``ValueError``.
        forward_fn: ``forward_fn(model, batch)`` for batches of other layouts.
        progress: show the progress bar.
        sync, group: under torch.distributed, merge the statistics of every
            rank first (see :func:`compute_amax`); every rank calls
            ``calibrate`` on its own share of the data and ends with the same amax.
        **kwargs: passed to ``HistogramCalibrator.compute_amax`` (``percentile``,
            ``start_bin``, ``stride``).

    Returns:
        ``model``, calibrated in place, in the mode it was in.
    """
    if method not in HISTOGRAM_METHODS:
        raise ValueError(f"method must be one of {list(HISTOGRAM_METHODS)}, got {method!r}")
    quantizers = _quantizers(model)
    swapped = _histograms_for(method, quantizers)
    try:
        for _, q in quantizers:
            if q._calibrator is not None:
                q._calibrator.reset()
        # Under torch.distributed a rank whose share of the data is empty still
        # takes part in the merge (and gets the amax of the others).
        syncing = _will_sync(sync, group)
        _collect_stats(model, data, num_batches, forward_fn, progress, allow_empty=syncing)
        compute_amax(model, method, sync=sync, group=group, **kwargs)
    finally:
        for q, calibrator in swapped:
            q._calibrator = calibrator
    return model


def _histograms_for(
    method: str, quantizers: List[Tuple[str, TensorQuantizer]]
) -> List[Tuple[TensorQuantizer, MaxCalibrator]]:
    """For a method other than max: a histogram calibrator in place of each per-tensor
    quantizer's max calibrator; returns (quantizer, its own calibrator) to put back."""
    if method == "max":
        return []
    swapped: List[Tuple[TensorQuantizer, MaxCalibrator]] = []
    per_tensor = 0
    for _, q in quantizers:
        calibrator = q._calibrator
        if calibrator is None or q.spec.axis is not None or q.spec.block_sizes is not None:
            continue
        per_tensor += 1
        if isinstance(calibrator, MaxCalibrator):
            swapped.append((q, calibrator))
            q._calibrator = q._new_calibrator(histogram=True)
    if per_tensor == 0:
        raise ValueError(f"calibrate(method={method!r}): no quantizer of this model is per tensor, and the "
                         "histogram methods set a per-tensor amax; use method='max'")
    return swapped


def calibrate_weights(
    model: torch.nn.Module,
    method: str = "percentile",
    perchannel: bool = True,
    percentile: float = 99.99,
    num_bins: int = 2048,
) -> None:
    """Sets the weight amax of every quantized module in ``model`` from its weight.

    Args:
        model: a module holding quantized modules (with ``weight`` and ``weight_quantizer``).
        method: ``"max"``, ``"percentile"``, ``"mse"`` or ``"entropy"``; this, not the
            weight quantizer's own calibrator, decides the method.
        perchannel: one amax per output channel (axis 1 for transposed
            convolutions, 0 otherwise) if True, else one per tensor.
        percentile: for ``method="percentile"``.
        num_bins: histogram bins.

    Any module with a ``weight`` tensor and a ``weight_quantizer`` qualifies;
    torch's ``transposed`` attribute of convolutions says where their output
    channels are. The quantizer's ``num_bits``, ``unsigned`` and ``narrow_range``
    set the calibration's.
    """
    if method not in HISTOGRAM_METHODS:
        raise ValueError(f"method must be one of {list(HISTOGRAM_METHODS)}, got {method!r}")
    for module in model.modules():
        quantizer = getattr(module, "weight_quantizer", None) if hasattr(module, "_weight_quantizer") else None
        # (a module whose quantizer sees its weight in another layout, GPT-2's Conv1D, says so)
        view = getattr(module, "_weight_for_quantizer", None)
        weight = view() if callable(view) else getattr(module, "weight", None)
        if quantizer is None or not isinstance(weight, torch.Tensor):
            continue
        axis = (1 if getattr(module, "transposed", False) else 0) if perchannel else None
        calibrator = HistogramCalibrator(quantizer.num_bits, axis, quantizer.unsigned, num_bins=num_bins,
                                         narrow_range=quantizer.narrow_range)
        calibrator.collect(weight)
        if method == "percentile":
            amax = calibrator.compute_amax("percentile", percentile=percentile)
        else:
            amax = calibrator.compute_amax(method)
        quantizer._set_amax_buffer(amax)
