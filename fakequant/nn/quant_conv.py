"""Quantized convolutions: the float modules applied to fake-quantized input and weight.

Each class subclasses its ``torch.nn`` counterpart (same constructor, same
``weight``/``bias``, so pretrained weights load and ``isinstance(m, nn.Conv2d)``
holds) and adds ``_input_quantizer`` / ``_weight_quantizer``. Descriptors come
from the keyword arguments ``quant_desc_input`` / ``quant_desc_weight`` or the
class defaults (per-tensor input, per-output-channel weight: axis 0 of a
convolution's weight ``(out, in / groups, *kernel)``, axis 1 of a transposed
convolution's ``(in, out / groups, *kernel)``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, List, Optional, Tuple

import torch
from torch import nn
from torch.nn import functional as F

from .. import tensor_quant
from . import _utils

if TYPE_CHECKING:
    # What the mixins below find in the torch.nn convolution they are mixed into
    # (a base class for the type checker only: at run time they derive from object).
    from torch.nn.modules.conv import _ConvNd as _ConvBase, _ConvTransposeNd as _ConvTransposeBase
else:
    _ConvBase = _ConvTransposeBase = object

__all__ = [
    "Conv1d", "QuantConv1d", "Conv2d", "QuantConv2d", "Conv3d", "QuantConv3d",
    "ConvTranspose1d", "QuantConvTranspose1d", "ConvTranspose2d", "QuantConvTranspose2d",
    "ConvTranspose3d", "QuantConvTranspose3d",
]


class _QuantConvNd(_utils.QuantMixin, _ConvBase):
    """Shared forward of QuantConv1d/2d/3d."""

    default_quant_desc_input = tensor_quant.QUANT_DESC_8BIT_PER_TENSOR

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        quant_desc_input, quant_desc_weight = _utils.take_quant_descs(type(self), kwargs)
        super().__init__(*args, **kwargs)
        self.init_quantizer(quant_desc_input, quant_desc_weight)

    def _quant(self, input: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(quantized input, quantized weight)``."""
        return self._input_quantizer(input), self._weight_quantizer(self.weight)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        quant_input, quant_weight = self._quant(input)
        # _conv_forward handles every padding_mode (zeros, reflect, replicate, circular).
        return self._conv_forward(quant_input, quant_weight, self.bias)


class QuantConv1d(_QuantConvNd, nn.Conv1d):
    """Quantized ``nn.Conv1d``."""

    default_quant_desc_weight = tensor_quant.QUANT_DESC_8BIT_CONV1D_WEIGHT_PER_CHANNEL


class QuantConv2d(_QuantConvNd, nn.Conv2d):
    """Quantized ``nn.Conv2d``."""

    default_quant_desc_weight = tensor_quant.QUANT_DESC_8BIT_CONV2D_WEIGHT_PER_CHANNEL


class QuantConv3d(_QuantConvNd, nn.Conv3d):
    """Quantized ``nn.Conv3d``."""

    default_quant_desc_weight = tensor_quant.QUANT_DESC_8BIT_CONV3D_WEIGHT_PER_CHANNEL


class _QuantConvTransposeNd(_QuantConvNd, _ConvTransposeBase):
    """Shared forward of QuantConvTranspose1d/2d/3d (construction and quantizers as
    _QuantConvNd)."""

    _num_spatial_dims: int = 0
    _conv_transpose: Optional[Callable[..., torch.Tensor]] = None

    def forward(self, input: torch.Tensor, output_size: Optional[List[int]] = None) -> torch.Tensor:
        if self.padding_mode != "zeros":
            raise ValueError(f"{type(self).__name__} supports padding_mode='zeros' only, got {self.padding_mode!r}")
        # (ignore: torch annotates _output_padding's sizes as lists, while the module holds them as
        # tuples; torch's own ConvTranspose*d.forward ignores the same arg-type errors)
        output_padding = self._output_padding(
            input, output_size, self.stride, self.padding, self.kernel_size, self._num_spatial_dims,  # type: ignore[arg-type]
            self.dilation,  # type: ignore[arg-type]
        )
        quant_input, quant_weight = self._quant(input)
        conv_transpose = type(self)._conv_transpose
        assert conv_transpose is not None  # (set by each subclass)
        return conv_transpose(
            quant_input, quant_weight, self.bias, self.stride, self.padding, output_padding, self.groups,
            self.dilation,
        )


class QuantConvTranspose1d(_QuantConvTransposeNd, nn.ConvTranspose1d):
    """Quantized ``nn.ConvTranspose1d``."""

    default_quant_desc_weight = tensor_quant.QUANT_DESC_8BIT_CONVTRANSPOSE1D_WEIGHT_PER_CHANNEL
    _num_spatial_dims = 1
    _conv_transpose = staticmethod(F.conv_transpose1d)


class QuantConvTranspose2d(_QuantConvTransposeNd, nn.ConvTranspose2d):
    """Quantized ``nn.ConvTranspose2d``."""

    default_quant_desc_weight = tensor_quant.QUANT_DESC_8BIT_CONVTRANSPOSE2D_WEIGHT_PER_CHANNEL
    _num_spatial_dims = 2
    _conv_transpose = staticmethod(F.conv_transpose2d)


class QuantConvTranspose3d(_QuantConvTransposeNd, nn.ConvTranspose3d):
    """Quantized ``nn.ConvTranspose3d``."""

    default_quant_desc_weight = tensor_quant.QUANT_DESC_8BIT_CONVTRANSPOSE3D_WEIGHT_PER_CHANNEL
    _num_spatial_dims = 3
    _conv_transpose = staticmethod(F.conv_transpose3d)


# Short names, so that `quant_nn.Conv2d` drops into code written for `nn.Conv2d`.
Conv1d = QuantConv1d
Conv2d = QuantConv2d
Conv3d = QuantConv3d
ConvTranspose1d = QuantConvTranspose1d
ConvTranspose2d = QuantConvTranspose2d
ConvTranspose3d = QuantConvTranspose3d
