"""The modules that moved, and the old import paths that still reach them (docs/layout.md).

Each old path is a small module that calls :func:`alias`, which makes it the very module at the
new path (``fakequant.presets is fakequant.models.presets``: the same functions, globals and
state, so that pickles, monkeypatching and ``isinstance`` see one object). The old paths that
were public and documented (in docs/api.md) warn with a ``DeprecationWarning`` on import;
private ones (a leading underscore) stay silent, as do pytorch-quantization's paths, which
never moved. fakequant's own modules import the new paths (tests/test_layers.py checks it);
the warning names the user's import, not the package's.
"""
from __future__ import annotations

import importlib
import sys
import types
import warnings
from typing import Dict, Optional

__all__ = ["MOVED", "DEPRECATED", "alias"]

#: old import path -> new import path.
MOVED: Dict[str, str] = {
    "fakequant.presets": "fakequant.models.presets",
    "fakequant.hf": "fakequant.models.hf",
    "fakequant.experts": "fakequant.models.experts",
    "fakequant.pretrained": "fakequant.models.pretrained",
    "fakequant.distill": "fakequant.models.distill",
    "fakequant._float_layers": "fakequant.models._float_layers",
    "fakequant._experts_linear": "fakequant.models._experts_linear",
    "fakequant.reference": "fakequant.composite.rules",
    "fakequant._composite": "fakequant.composite.compiled",
    "fakequant._self_check": "fakequant._diagnostics.self_check",
    "fakequant._gpu_check": "fakequant._diagnostics.gpu_check",
    "fakequant._core.switches": "fakequant._core.export_state",
    "fakequant.nn._schemes": "fakequant.nn._paths",
}

#: The old paths that were public and documented: importing them warns.
DEPRECATED = frozenset(old for old in MOVED if not any(part.startswith("_") for part in old.split(".")))


def _importer() -> Optional[types.FrameType]:
    """The frame whose code asked for the old path: the first one outside the import machinery
    and outside the package's own ``__init__`` (its ``__getattr__`` imports ``fakequant.presets``
    for ``fakequant.presets``)."""
    frame: Optional[types.FrameType] = sys._getframe(3)  # _importer <- alias <- the old module's body <- its importer
    while frame is not None and (frame.f_code.co_filename.startswith("<frozen importlib")
                                 or frame.f_globals.get("__name__") in ("importlib", "fakequant")):
        frame = frame.f_back
    return frame


def alias(old: str) -> types.ModuleType:
    """Makes the module at the old path ``old`` the one at its new path (:data:`MOVED`), with a
    ``DeprecationWarning`` at the importing line where ``old`` is in :data:`DEPRECATED` and the
    importer is not fakequant's own module."""
    module = importlib.import_module(MOVED[old])
    sys.modules[old] = module
    frame = _importer() if old in DEPRECATED else None
    importer = "" if frame is None else frame.f_globals.get("__name__", "<string>")  # (warnings.warn's default)
    if frame is not None and not importer.startswith("fakequant."):
        warnings.warn_explicit(f"{old} is now {MOVED[old]}; the old import path will go in a later release",
                               DeprecationWarning, frame.f_code.co_filename, frame.f_lineno, importer,
                               frame.f_globals.setdefault("__warningregistry__", {}))
    return module
