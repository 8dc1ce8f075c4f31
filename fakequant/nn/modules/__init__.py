"""pytorch-quantization's module paths (``pytorch_quantization.nn.modules.*``).

Scripts import e.g. ``from pytorch_quantization.nn.modules.tensor_quantizer import
TensorQuantizer`` or ``from pytorch_quantization.nn.modules import _utils``; the
same paths work under ``fakequant.nn.modules`` and name the same objects as
``fakequant.nn``.
"""
import sys

from .. import _utils, clip, quant_conv, quant_instancenorm, quant_linear, quant_pooling, quant_rnn, tensor_quantizer

for _module in (_utils, clip, quant_conv, quant_instancenorm, quant_linear, quant_pooling, quant_rnn,
                tensor_quantizer):
    sys.modules[f"{__name__}.{_module.__name__.rsplit('.', 1)[1]}"] = _module
del _module
