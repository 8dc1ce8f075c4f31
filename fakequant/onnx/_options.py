"""Export options, read by the lowerings while an exporter runs. They are
per-thread state of the bottom layer (``fakequant._core.export_state``), which the
quantizers read too; this module is their ``fakequant.onnx`` name."""
from .._core.export_state import ExportOptions, current_export_options as current, export_options

__all__ = ["ExportOptions", "export_options", "current"]
