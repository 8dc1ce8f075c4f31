"""ONNX export of fakequant models as QuantizeLinear/DequantizeLinear (QDQ) graphs.

Both of torch's exporters are reached through their public extension points
only:

* TorchScript (``dynamo=False``): symbolic functions registered with
  ``torch.onnx.register_custom_op_symbolic`` (``fakequant.onnx.symbolic_torchscript``) on
  ``import fakequant`` (:func:`register`), so a plain ``torch.onnx.export``
  works;
* dynamo (``dynamo=True``, torch's default): while a plain ``torch.onnx.export``
  traces the model, each fakequant operator emits its ONNX nodes with
  ``torch.onnx.ops.symbolic`` (``fakequant.onnx.symbolic_dynamo``);
  :func:`export` instead hands the exporter the translations of
  ``translation_dynamo`` (``custom_translation_table``), which also export an
  ``ExportedProgram`` traced beforehand. Both write the same graph.

:func:`export` adds fakequant's options and checks. The graph and its
numerics are described in README.md ("Export to ONNX").
"""
from __future__ import annotations

import os
from typing import Any, Callable, Dict, Optional, Tuple, Union

import torch

from .. import _core
from . import _lowering, _options, symbolic_dynamo, symbolic_torchscript, translation_dynamo  # noqa: F401
from .._core import TranslationError, enable_onnx_export, supplying_translations
from ._lowering import ExportWarning
from ._options import ExportOptions, export_options
from ..serve._base import refuse_other_targets
from .translation_dynamo import custom_translation_table

__all__ = ["export", "export_options", "ExportOptions", "ExportWarning", "TranslationError",
           "custom_translation_table", "register", "enable_onnx_export"]


def register() -> Dict[torch._ops.OpOverload, Callable[..., Any]]:
    """Registers the TorchScript exporter's symbolic functions of the
    ``torch.ops.fakequant`` operators (``torch.onnx.register_custom_op_symbolic``)
    and hands the operators their lowerings for a plain dynamo export.
    Runs on ``import fakequant``; calling it again is harmless. Returns
    :func:`custom_translation_table`, the dynamo exporter's translations, which
    ``torch.onnx.export(..., dynamo=True, custom_translation_table=...)`` takes."""
    symbolic_torchscript.register()
    symbolic_dynamo.register()
    return custom_translation_table()


def export(
    model: Union[torch.nn.Module, torch.export.ExportedProgram, torch.jit.ScriptModule, torch.jit.ScriptFunction],
    args: Tuple[Any, ...],
    f: Optional[Union[str, os.PathLike]] = None,
    *,
    dynamo: bool = True,
    opset_version: Optional[int] = None,
    clip_narrow_range: bool = True,
    custom_translation_table: Optional[Dict[Any, Callable[..., Any]]] = None,
    **kwargs: Any,
) -> Optional[torch.onnx.ONNXProgram]:
    """``torch.onnx.export`` of a fakequant model, inside
    :func:`fakequant.enable_onnx_export` (every enabled quantizer must have an
    amax, or be ``dynamic``).

    Args:
        model, args, f: as ``torch.onnx.export``.
        dynamo: the exporter, as ``torch.onnx.export`` (default True).
        opset_version: ONNX opset; fakequant needs 13 or more (int4/uint4 and
            int16 QDQ from 21). Default: torch's default. The dynamo exporter
            builds opset 18; below that, this function converts the graph
            with ONNX's converter before or after optimizing it, whichever
            works, and raises if neither does (torch would silently keep
            opset 18).
        clip_narrow_range: keep the Clip that makes a narrow range such as
            ``[-127, 127]`` exact (default); False drops it, for TensorRT.
        custom_translation_table: more dynamo translations; fakequant's are added.
        **kwargs: passed to ``torch.onnx.export``.

    Returns:
        What ``torch.onnx.export`` returns (an ``ONNXProgram`` with dynamo).

    ONNX Runtime runs the graph with PyTorch's numbers in a session of level
    ``ORT_ENABLE_BASIC`` or below. Its default session fuses int8 QDQ pairs around a
    MatMul/Gemm/Conv into int8 kernels whose uint8 x int8 sums saturate on x86 CPUs without
    VNNI (AVX2; AVX-512 without VNNI): outputs can then differ by a large share of their value.
    There, set the session option ``session.qdqisint8allowed`` to ``"1"`` (int8 x int8 kernels
    with 32-bit sums, for signed activations) or ``graph_optimization_level = ORT_ENABLE_BASIC``
    (docs/export.md, "ONNX Runtime on x86 CPUs without VNNI").
    """
    if isinstance(model, torch.nn.Module):  # (vLLM's rules, target="vllm", are not ONNX's)
        refuse_other_targets(model, ("onnx",), "ONNX")
    if opset_version is not None and opset_version < symbolic_torchscript.MIN_OPSET:
        raise ValueError(f"fakequant ONNX export needs opset_version >= {symbolic_torchscript.MIN_OPSET}, "
                         f"got {opset_version}")
    if not dynamo:
        if custom_translation_table:
            raise ValueError("custom_translation_table is for the dynamo exporter (dynamo=True)")
        if opset_version is not None:
            kwargs["opset_version"] = opset_version
        with enable_onnx_export(clip_narrow_range=clip_narrow_range):
            return torch.onnx.export(model, args, f, dynamo=False, **kwargs)

    table = translation_dynamo.custom_translation_table()
    table.update(custom_translation_table or {})
    kwargs["custom_translation_table"] = table
    convert_to = None
    if opset_version is not None and opset_version < translation_dynamo.BUILD_OPSET:
        # torch converts before it optimizes, and gives up (keeping opset 18)
        # where ONNX's converter has no adapter; convert_opset tries both orders.
        convert_to, opset_version = opset_version, translation_dynamo.BUILD_OPSET
        optimize = kwargs.pop("optimize", True)
        kwargs["optimize"] = False
    if opset_version is not None:
        kwargs["opset_version"] = opset_version
    save = {k: kwargs.pop(k) for k in ("export_params", "keep_initializers_as_inputs", "external_data")
            if k in kwargs}
    with enable_onnx_export(clip_narrow_range=clip_narrow_range), supplying_translations():
        program = torch.onnx.export(model, args, None if convert_to else f, dynamo=True, **kwargs, **(
            {} if convert_to else save))
    if convert_to is not None:
        assert program is not None  # (the dynamo exporter returns an ONNXProgram)
        translation_dynamo.convert_opset(program, convert_to, optimize)
        if f is not None:
            program.save(f, include_initializers=save.get("export_params", True),
                         keep_initializers_as_inputs=save.get("keep_initializers_as_inputs", False),
                         external_data=save.get("external_data", None))
    return program

register()
