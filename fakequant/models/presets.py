"""Named quantization recipes: the descriptors of a model's weight and input quantizers.

``fakequant.quantize_model(model, preset="W8A8")`` converts a model with them. The
spellings follow Model Optimizer's configurations where it has one (its
``INT8_DEFAULT_CFG``, ``FP8_DEFAULT_CFG``, ``FP8_PER_CHANNEL_PER_TOKEN_CFG``,
``NVFP4_DEFAULT_CFG``, ``MXFP8_DEFAULT_CFG``, ``MXFP4_DEFAULT_CFG``), so that a recipe reads
the same in both libraries:

========================  ================================================  ==============================================
preset                    weights                                           inputs (activations)
========================  ================================================  ==============================================
``W8A8``                  int8, per output channel (``axis=0``)             int8, per token (dynamic, ``{-1: None}``)
``W8A8_ASYM``             int8, per output channel                          int8, per token, asymmetric (max_min bias)
``W4A8``                  int4, dynamic blocks of 32 along the last axis    int8, per token
``W4A16``                 int4, dynamic blocks of 128 along the last axis   not quantized (input quantizers disabled)
``INT8``                  int8, per output channel                          int8, per tensor (calibrated)
``FP8``                   FP8 E4M3, per tensor (calibrated)                 FP8 E4M3, per tensor (calibrated)
``FP8_PER_CHANNEL``       FP8 E4M3, per output channel                      FP8 E4M3, per token
``NVFP4``                 E2M1, blocks of 16, E4M3 block scales             the same
``MXFP8``                 E4M3, blocks of 32, E8M0 block scales             the same
``MXFP4``                 E2M1, blocks of 32, E8M0 block scales             the same
``GGUF_Q8_0``             llama.cpp's Q8_0: blocks of 32, float16 scales    Q8_0 blocks of 32 along each row (dynamic)
``GGUF_Q4_0``             llama.cpp's Q4_0: blocks of 32, float16 scales    Q8_0 blocks of 32 along each row (dynamic)
========================  ================================================  ==============================================

``W4A16`` is compressed-tensors' (and llm-compressor's) W4A16 scheme: int4 weights in groups
of 128 input features, activations left in float.

The GGUF presets train on llama.cpp's own grids (:func:`fakequant.ops.fake_quantize_ggml`):
what the model learns is what ``fakequant.serve.gguf.export_gguf`` writes and llama.cpp runs.
Their inputs are rounded to Q8_0 as llama.cpp's CPU matmul rounds the activations it multiplies
with Q8_0 and Q4_0 weights (docs/serving_gguf.md says where its SIMD code rounds differently).

A preset is a :class:`Preset` (two :class:`~fakequant.tensor_quant.QuantDescriptor`
keyword dicts, ``input`` None for weight-only recipes); :func:`get` returns it by name
(case-insensitive). Layers to keep in
float (``lm_head``, by default) are :func:`fakequant.quantize_model`'s business.
"""
from __future__ import annotations

from typing import Any, Dict, NamedTuple, Optional, Tuple, Union

from .._core import BlockScales
from ..tensor_quant import QuantDescriptor, ScaledQuantDescriptor

__all__ = ["Preset", "PRESETS", "get"]


class Preset(NamedTuple):
    """A recipe: the ``QuantDescriptor`` keyword arguments of weights and of inputs (None:
    the inputs stay in float, a weight-only recipe)."""

    weight: Dict[str, Any]
    input: Optional[Dict[str, Any]]
    description: str

    def descriptors(self) -> Tuple[Optional[ScaledQuantDescriptor], ScaledQuantDescriptor]:
        """``(quant_desc_input, quant_desc_weight)``, as :func:`fakequant.quantize_model` takes them;
        ``quant_desc_input`` is None for a weight-only recipe."""
        return (None if self.input is None else QuantDescriptor(**self.input)), QuantDescriptor(**self.weight)


_PER_TOKEN: Dict[str, Any] = {"type": "dynamic", "block_sizes": {-1: None}}


def _blocks(num_bits: Union[int, Tuple[int, int]], size: int, scales: BlockScales) -> Dict[str, Any]:
    """Dynamic blocks of ``size`` along the last axis with block scales of format ``scales``
    (written in the descriptor's spelling, ``scale_bits``)."""
    return {"num_bits": num_bits, "block_sizes": {-1: size, "type": "dynamic", "scale_bits": scales.scale_bits}}


def _mx(num_bits: Tuple[int, int]) -> Dict[str, Any]:
    return _blocks(num_bits, 32, BlockScales.E8M0)


_NVFP4: Dict[str, Any] = _blocks((2, 1), 16, BlockScales.E4M3)

def _ggml(num_bits: int) -> Dict[str, Any]:
    # float16 block scales, computed as llama.cpp computes them
    return _blocks(num_bits, 32, BlockScales.GGML)


PRESETS: Dict[str, Preset] = {
    "W8A8": Preset({"num_bits": 8, "axis": 0}, {"num_bits": 8, **_PER_TOKEN},
                   "int8 per-channel weights, int8 per-token activations"),
    "W8A8_ASYM": Preset({"num_bits": 8, "axis": 0},
                        {"num_bits": 8, **_PER_TOKEN, "bias": {-1: None, "type": "dynamic", "method": "max_min"}},
                        "int8 per-channel weights, int8 per-token asymmetric activations"),
    "W4A8": Preset({"num_bits": 4, "block_sizes": {-1: 32, "type": "dynamic"}}, {"num_bits": 8, **_PER_TOKEN},
                   "int4 weights in blocks of 32, int8 per-token activations"),
    "W4A16": Preset({"num_bits": 4, "block_sizes": {-1: 128, "type": "dynamic"}}, None,
                    "int4 weights in blocks of 128, float activations (weight-only)"),
    "INT8": Preset({"num_bits": 8, "axis": 0}, {"num_bits": 8},
                   "int8 per-channel weights, int8 per-tensor calibrated activations"),
    "FP8": Preset({"num_bits": (4, 3)}, {"num_bits": (4, 3)},
                  "FP8 E4M3 per-tensor weights and calibrated activations"),
    "FP8_PER_CHANNEL": Preset({"num_bits": (4, 3), "axis": 0}, {"num_bits": (4, 3), **_PER_TOKEN},
                              "FP8 E4M3 per-channel weights, per-token activations"),
    "NVFP4": Preset(_NVFP4, _NVFP4, "E2M1 in blocks of 16 with E4M3 block scales (weights and activations)"),
    "MXFP8": Preset(_mx((4, 3)), _mx((4, 3)), "OCP MXFP8 (E4M3, blocks of 32, E8M0 scales)"),
    "MXFP4": Preset(_mx((2, 1)), _mx((2, 1)), "OCP MXFP4 (E2M1, blocks of 32, E8M0 scales)"),
    "GGUF_Q8_0": Preset(_ggml(8), _ggml(8), "llama.cpp Q8_0 weights, inputs rounded to Q8_0 as llama.cpp's CPU matmul"),
    "GGUF_Q4_0": Preset(_ggml(4), _ggml(8), "llama.cpp Q4_0 weights, inputs rounded to Q8_0 as llama.cpp's CPU matmul"),
}


def get(name: Union[str, Preset]) -> Preset:
    """The preset named ``name`` (case-insensitive), or ``name`` itself if it is a :class:`Preset`."""
    if isinstance(name, Preset):
        return name
    if not isinstance(name, str):
        raise TypeError(f"preset must be a preset name (str) or a Preset, got {type(name).__name__}")
    preset = PRESETS.get(name.upper())
    if preset is None:
        raise ValueError(f"preset must be one of {sorted(PRESETS)}, got {name!r}")
    return preset
