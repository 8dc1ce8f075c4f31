"""What works on whole models, above the quantizers and quantized modules: named recipes
(:mod:`~fakequant.models.presets`), transformers' attention (:mod:`~fakequant.models.hf`)
and fused mixture-of-experts modules (:mod:`~fakequant.models.experts`), save and load through
``from_pretrained`` (:mod:`~fakequant.models.pretrained`), quantization-aware distillation
(:mod:`~fakequant.models.distill`), and the layers a conversion leaves in float
(``_float_layers``). :mod:`fakequant.quant_modules` (pytorch-quantization's path) converts a
model with them.
"""
from . import distill, experts, hf, presets, pretrained
