"""fakequant: fake quantization for quantization-aware training.

The operators (``fakequant.fake_quantize_*``) live in :mod:`fakequant.ops`; the
pytorch-quantization-shaped API in :mod:`fakequant.tensor_quant`,
:mod:`fakequant.nn` (``from fakequant import nn as quant_nn``),
:mod:`fakequant.calib` and :mod:`fakequant.quant_modules`; what works on whole models in
``fakequant.models``.
"""
import importlib
import sys
import types

from ._version import __version__
from . import _moved

from ._extension import BUILT_FOR_CUDA, BUILT_FOR_TORCH, CUDA_ARCH_LIST
from .composite.compiled import compiled_path, set_compiled_path
from .ops import (
    amax_bound,
    fake_quant,
    fake_quant_grad,
    fake_quantize_affine,
    fake_quantize_amax,
    fake_quantize_blockwise,
    fake_quantize_fp8,
    fake_quantize_lsq,
    fake_quantize_min_max,
    fake_quantize_per_channel_affine,
    fake_quantize_per_tensor_affine,
    fake_quantize_per_tensor_affine_cachemask,
    fake_quantize_per_channel_affine_cachemask,
    fp8_max,
    mask_backward,
    quantize_amax,
    unpack_mask,
)
from . import calib, models, nn, optim, quant_modules, tensor_quant, utils
from .quant_modules import deactivate, enable_onnx_export, initialize, quantize_model
from .tensor_quant import QuantDescriptor, ScaledQuantDescriptor
from .utils.calibrate import calibrate
from .serve import export_checkpoint

# pytorch-quantization's import paths of calibrate_weights, which walks a model (the model
# level) and so is not the calib package's own (fakequant/calib/__init__.py).
calib.calibrate_weights = calib.histogram.calibrate_weights = utils.calibrate_weights  # type: ignore[attr-defined]
from . import onnx  # TorchScript export symbolics (dynamo: fakequant.onnx.export / custom_translation_table)

if "transformers" in sys.modules:  # from_pretrained of a fakequant checkpoint (fakequant.models.pretrained)
    models.pretrained.register()


def __getattr__(name: str) -> types.ModuleType:
    """The modules' old attribute paths (``fakequant.presets``): the module at the old import
    path, which is the one at the new path (fakequant/_moved.py)."""
    if f"{__name__}.{name}" in _moved.MOVED:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
