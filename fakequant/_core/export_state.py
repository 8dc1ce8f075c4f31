"""Export state, per thread: what ``fakequant.enable_onnx_export`` and
``fakequant.onnx.export`` turn on, read by the quantizers and the lowerings
while an exporter runs. Nothing here is a class attribute or a global, so an
export on one thread does not change what another thread computes.
"""
from __future__ import annotations

import contextlib
import dataclasses
import threading
from typing import Any, Callable, Dict, Iterator, Optional

import torch

from .validation import check_bool

__all__ = ["ExportOptions", "export_options", "current_export_options", "enable_onnx_export",
           "onnx_export_enabled", "set_onnx_export_enabled", "supplying_translations", "TranslationError",
           "set_symbolic_lowerings", "lower_symbolically", "refuse_untranslated", "exporting", "dynamo_exporting", "flag_on"]


@dataclasses.dataclass(frozen=True)
class ExportOptions:
    """Options of fakequant's ONNX export.

    clip_narrow_range: export a narrow range such as ``[-127, 127]`` exactly,
        with a Clip on the int8 tensor between QuantizeLinear and
        DequantizeLinear (default). False drops that Clip, as TensorRT needs;
        the graph then differs from PyTorch where ``x / scale`` rounds to -128.
    opset_version: the opset a plain ``torch.onnx.export(..., dynamo=True)``
        builds fakequant's nodes for (None: torch's default, 20, or the
        format's minimum where higher: 19 for FP8, 21 for block-wise formats). A traced operator cannot see the ``opset_version``
        given to ``torch.onnx.export``: the exporter converts the nodes to a
        higher one and refuses a lower one; set this to the same value for the
        graph :func:`fakequant.onnx.export` writes at that opset (int4 and int16
        types at 21, for example). :func:`fakequant.onnx.export` needs none: its
        translations see the opset.
    """

    clip_narrow_range: bool = True
    opset_version: Optional[int] = None


class _State(threading.local):
    def __init__(self) -> None:
        self.options: Optional[ExportOptions] = None  # ExportOptions or None (the defaults)
        self.onnx_export = False  # inside enable_onnx_export (or fakequant.onnx.export)
        self.translations = False  # inside fakequant.onnx.export's dynamo export (the exporter has the table)


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
        if name == "opset_version":
            if value is not None and not (type(value) is int and value >= 13):
                raise ValueError(f"fakequant: opset_version must be None or an int >= 13, got {value!r}")
        else:
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


@contextlib.contextmanager
def supplying_translations() -> Iterator[None]:
    """Inside it, this thread's dynamo exporter is given fakequant's translations
    (``fakequant.onnx.export`` passes ``custom_translation_table``): the operators stay
    in the traced graph instead of emitting their nodes (:func:`lower_symbolically`)."""
    saved = _state.translations
    _state.translations = True
    try:
        yield
    finally:
        _state.translations = saved


@contextlib.contextmanager
def enable_onnx_export(clip_narrow_range: bool = True) -> Iterator[None]:
    """Context manager for ``torch.onnx.export`` of a quantized model (this thread only).

    Inside it every enabled quantizer checks that it has an amax (a quantizer
    that was never calibrated raises; ``dynamic`` ones export a computed scale,
    with a warning), and the export options apply: ``clip_narrow_range=False``
    drops the Clip that makes a narrow range (``[-127, 127]``) exact, as
    TensorRT needs. Quantizers use fakequant's operators inside it, whatever
    ``TensorQuantizer.use_fb_fake_quant`` says (which reads True inside, as in
    pytorch-quantization). Neither exporter needs more. The previous settings
    come back on exit, also when the export raises.
    """
    saved = _state.onnx_export
    _state.onnx_export = True
    try:
        with export_options(clip_narrow_range=clip_narrow_range):
            yield
    finally:
        _state.onnx_export = saved


class TranslationError(RuntimeError, ValueError):
    """A dynamo ONNX export reached a ``torch.ops.fakequant`` node it has no translation
    for: an ``ExportedProgram`` made beforehand by ``torch.export.export`` (whose
    operators were traced before the export could lower them). A RuntimeError, as
    torch's exporter errors are."""


_symbolic_lowerings: Optional[Dict[str, Callable[..., Any]]] = None


def set_symbolic_lowerings(lowerings: Optional[Dict[str, Callable[..., Any]]]) -> None:
    """The operators' ONNX lowerings for a plain dynamo export (``{op name: function}``,
    ``fakequant.onnx.symbolic_dynamo``, on ``import fakequant``); None where torch has no
    ``torch.onnx.ops.symbolic``."""
    global _symbolic_lowerings
    _symbolic_lowerings = lowerings


_NO_SYMBOLIC = (
    "fakequant: a plain torch.onnx.export(..., dynamo=True) of fakequant's operators needs "
    "torch.onnx.ops.symbolic (torch >= 2.8), which torch {version} lacks: call "
    "fakequant.onnx.export(model, args, f) (it passes fakequant's custom_translation_table), or "
    "torch.onnx.export(..., dynamo=False)"
)


def lower_symbolically(op: str, *args: Any) -> Any:
    """What operator ``op`` (``torch.ops.fakequant.<op>``) gives while torch's dynamo exporter
    traces it outside ``fakequant.onnx.export``: its ONNX nodes, emitted with
    ``torch.onnx.ops.symbolic`` (same outputs as the operator); None when no such export
    runs (the caller then calls the operator)."""
    # (torch.compiler.is_exporting first: it is False in eager code and costs ~30 ns, where
    # torch.onnx.is_in_onnx_export costs ~1 us, on every operator call)
    if not torch.compiler.is_exporting() or _state.translations or not dynamo_exporting():
        return None  # (the TorchScript exporter traces the operators and has their symbolics)
    if _symbolic_lowerings is None:
        raise TranslationError(_NO_SYMBOLIC.format(version=torch.__version__))
    return _symbolic_lowerings[op](*args)


_UNTRANSLATED = (
    "fakequant: torch.onnx.export(..., dynamo=True) reached the fakequant::{op} node of a graph "
    "traced beforehand (an ExportedProgram from torch.export.export), which it has no translation "
    "for. Call fakequant.onnx.export(exported_program, args, f), which gives the exporter "
    "fakequant's translations (or pass custom_translation_table=fakequant.onnx.custom_translation_table() "
    "to torch.onnx.export); a model (nn.Module) exports with a plain torch.onnx.export."
)


def refuse_untranslated(op: str) -> None:
    """Raises :class:`TranslationError` where the dynamo exporter retraces a fakequant
    operator it will have no translation for (an ExportedProgram given to torch.onnx.export
    without fakequant's table); nothing otherwise. Called by the operators' fake kernels."""
    if not _state.translations and dynamo_exporting():
        raise TranslationError(_UNTRANSLATED.format(op=op))


def exporting() -> bool:
    """Whether an ONNX exporter (either) is tracing: the graph it writes is for inference,
    so observers neither observe nor update buffers while it runs. (Cheap outside a trace:
    torch.onnx.is_in_onnx_export is asked only inside torch.export's or torch.jit's.)"""
    return (torch.compiler.is_exporting() or torch.jit.is_tracing()) and torch.onnx.is_in_onnx_export()


def dynamo_exporting() -> bool:
    """Whether torch's dynamo exporter is tracing (``torch.onnx.export``, ``dynamo=True``)."""
    return torch.onnx.is_in_onnx_export() and not torch.jit.is_tracing()


def flag_on(flag: Any) -> bool:
    """A module's on/off buffer (torch.ao's ``fake_quant_enabled``) as an export reads it:
    its value under the TorchScript exporter's trace; on under the dynamo exporter, whose
    trace has no values to read (fake tensors)."""
    if torch.jit.is_tracing() or not exporting():
        return bool(flag.reshape(-1)[0])
    return True
