"""The class-wide switches of :class:`~fakequant.nn.TensorQuantizer` (its metaclass)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

from .. import _core

if TYPE_CHECKING:
    _ModuleMeta = type
else:
    _ModuleMeta = type(nn.Module)

__all__ = ["_Switches"]


class _Switches(_ModuleMeta):
    """The class-wide switches of :class:`TensorQuantizer`, as pytorch-quantization
    spells them. ``_enable_onnx_export`` is this thread's export mode
    (``fakequant.enable_onnx_export``), not a class attribute; ``use_fb_fake_quant``
    is the user's class-wide choice, and reads True inside the export mode (as
    pytorch-quantization's ``enable_onnx_export`` set it; fakequant's operators
    are used while exporting whatever it says)."""

    @property
    def _enable_onnx_export(cls) -> bool:
        return _core.onnx_export_enabled()

    @_enable_onnx_export.setter
    def _enable_onnx_export(cls, value: bool) -> None:
        _core.set_onnx_export_enabled(bool(value))

    @property
    def use_fb_fake_quant(cls) -> bool:
        return cls._use_fb_fake_quant or _core.onnx_export_enabled()

    @use_fb_fake_quant.setter
    def use_fb_fake_quant(cls, value: bool) -> None:
        cls._use_fb_fake_quant = _core.check_bool(value, "use_fb_fake_quant")

    _use_fb_fake_quant: bool
