"""Export switches, per thread: what ``fakequant.enable_onnx_export`` and
``fakequant.onnx.export`` turn on, read by the quantizers and the lowerings
while an exporter runs. Nothing here is a class attribute or a global, so an
export on one thread does not change what another thread computes.
"""
from __future__ import annotations

import contextlib
import dataclasses
import threading
import warnings
from typing import Any, Iterator, Optional

from .validation import check_bool

__all__ = ["ExportOptions", "export_options", "current_export_options", "enable_onnx_export",
           "onnx_export_enabled", "set_onnx_export_enabled", "translations_supplied",
           "TranslationWarning", "warn_if_translations_missing"]


@dataclasses.dataclass(frozen=True)
class ExportOptions:
    """Options of fakequant's ONNX export.

    clip_narrow_range: export a narrow range such as ``[-127, 127]`` exactly,
        with a Clip on the int8 tensor between QuantizeLinear and
        DequantizeLinear (default). False drops that Clip, as TensorRT needs;
        the graph then differs from PyTorch where ``x / scale`` rounds to -128.
    """

    clip_narrow_range: bool = True


class _State(threading.local):
    def __init__(self) -> None:
        self.options: Optional[ExportOptions] = None  # ExportOptions or None (the defaults)
        self.onnx_export = False  # inside enable_onnx_export (or fakequant.onnx.export)
        self.translations = False  # inside fakequant.onnx.export or enable_onnx_export


_state = _State()


def current_export_options() -> ExportOptions:
    """The export options of this thread."""
    return _state.options or ExportOptions()


@contextlib.contextmanager
def export_options(**changes: Any) -> Iterator[ExportOptions]:
    """Context manager that sets :class:`ExportOptions` fields for the exports inside it
    (on this thread)."""
    fields = {f.name for f in dataclasses.fields(ExportOptions)}
    unknown = sorted(set(changes) - fields)
    if unknown:
        raise TypeError(f"unknown fakequant ONNX export option(s) {unknown}; the options are {sorted(fields)}")
    for name, value in changes.items():
        check_bool(value, name)
    saved = _state.options
    _state.options = dataclasses.replace(current_export_options(), **changes)
    try:
        yield _state.options
    finally:
        _state.options = saved


def onnx_export_enabled() -> bool:
    """Whether this thread is inside :func:`enable_onnx_export`."""
    return _state.onnx_export


def set_onnx_export_enabled(value: bool) -> None:
    """Turns the export mode of this thread on or off (what :func:`enable_onnx_export`
    does around its body)."""
    _state.onnx_export = check_bool(value, "the ONNX export switch")


def translations_supplied() -> bool:
    """Whether this thread's export is known to carry fakequant's dynamo translations
    (inside ``fakequant.onnx.export`` or :func:`enable_onnx_export`)."""
    return _state.translations


@contextlib.contextmanager
def enable_onnx_export(clip_narrow_range: bool = True) -> Iterator[None]:
    """Context manager for ``torch.onnx.export`` of a quantized model (this thread only).

    Inside it every enabled quantizer checks that it has an amax (a quantizer
    that was never calibrated raises; ``dynamic`` ones export a computed scale,
    with a warning), and the export options apply: ``clip_narrow_range=False``
    drops the Clip that makes a narrow range (``[-127, 127]``) exact, as
    TensorRT needs. Quantizers use fakequant's operators inside it, whatever
    ``TensorQuantizer.use_fb_fake_quant`` says (which reads True inside, as in
    pytorch-quantization). The TorchScript exporter needs nothing more; with
    ``dynamo=True`` pass
    ``custom_translation_table=fakequant.onnx.custom_translation_table()``, or
    call ``fakequant.onnx.export``, which does both. The previous settings come
    back on exit, also when the export raises.
    """
    saved = (_state.onnx_export, _state.translations)
    _state.onnx_export = _state.translations = True
    try:
        with export_options(clip_narrow_range=clip_narrow_range):
            yield
    finally:
        _state.onnx_export, _state.translations = saved


class TranslationWarning(UserWarning):
    """A dynamo ONNX export that may lack fakequant's translations."""


_MISSING = (
    "fakequant: torch.onnx.export(..., dynamo=True) has no translation of fakequant's operators unless "
    "it is given one: call fakequant.onnx.export(model, args, ...) instead, or pass "
    "custom_translation_table=fakequant.onnx.custom_translation_table() inside "
    "`with fakequant.enable_onnx_export():` (which also silences this warning). Without the table the "
    "exporter fails on the {op} node."
)


def warn_if_translations_missing(op: str) -> None:
    """Warns, while the dynamo exporter traces a fakequant operator outside
    ``fakequant.onnx.export`` and ``enable_onnx_export``, which call makes the export work."""
    if _state.translations:
        return
    import torch

    if torch.onnx.is_in_onnx_export() and not torch.jit.is_tracing():
        warnings.warn(_MISSING.format(op=op), TranslationWarning, stacklevel=3)
