"""Export options, read by the lowerings while an exporter runs."""
import contextlib
import dataclasses
import threading


@dataclasses.dataclass(frozen=True)
class ExportOptions:
    """Options of fakequant's ONNX export.

    clip_narrow_range: export a narrow range such as ``[-127, 127]`` exactly,
        with a Clip on the int8 tensor between QuantizeLinear and
        DequantizeLinear (default). False drops that Clip, as TensorRT needs;
        the graph then differs from PyTorch where ``x / scale`` rounds to -128.
    """

    clip_narrow_range: bool = True


_local = threading.local()


def current() -> ExportOptions:
    return getattr(_local, "options", None) or ExportOptions()


@contextlib.contextmanager
def export_options(**changes):
    """Context manager that sets :class:`ExportOptions` fields for the exports inside it."""
    fields = {f.name for f in dataclasses.fields(ExportOptions)}
    unknown = sorted(set(changes) - fields)
    if unknown:
        raise TypeError(f"unknown fakequant ONNX export option(s) {unknown}; the options are {sorted(fields)}")
    for name, value in changes.items():
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be a bool, got {value!r}")
    saved = getattr(_local, "options", None)
    _local.options = dataclasses.replace(current(), **changes)
    try:
        yield _local.options
    finally:
        _local.options = saved
