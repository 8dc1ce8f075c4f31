"""How each ``torch.ops.fakequant`` operator becomes ONNX, for every exporter: one lowering
per operator family, written against a small graph-builder interface (``Builder``) that the
TorchScript symbolics, the dynamo translations and the traced nodes of a plain
``torch.onnx.export`` each implement, so that the graph is the same whichever route runs.
What the graph must reproduce, and when a QDQ pair does: ``_common.py``'s description."""
from ._common import (
    BLOCK_MIN_OPSET, BOOL, BFLOAT16, DOUBLE, FLOAT, FLOAT16, FLOAT8E4M3FN, FLOAT8E5M2, INT4, INT8, INT16,
    ONNX_FLOAT_TYPES, ONNX_TYPES, UINT4, UINT8, UINT16, ZERO_CHANNEL_SCALE, Builder, ExportWarning, choose_qtype,
)
from .affine import lower_affine, lower_min_max
from .amax import lower_amax
from .blockwise import lower_blockwise
from .fp8 import FP8_MIN_OPSET, lower_fp8

__all__ = ["BLOCK_MIN_OPSET", "BOOL", "BFLOAT16", "DOUBLE", "FLOAT", "FLOAT16", "FLOAT8E4M3FN", "FLOAT8E5M2",
           "FP8_MIN_OPSET", "INT4", "INT8", "INT16", "ONNX_FLOAT_TYPES", "ONNX_TYPES", "UINT4", "UINT8", "UINT16", "ZERO_CHANNEL_SCALE",
           "Builder", "ExportWarning", "choose_qtype", "lower_affine", "lower_amax", "lower_blockwise", "lower_fp8",
           "lower_min_max"]
