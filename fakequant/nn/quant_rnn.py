"""Quantized LSTM and LSTMCell.

As in pytorch-quantization, an LSTM step is treated as the one fused GEMM an
inference engine runs: the input quantizer sees ``cat([x_t, h_{t-1}], 1)`` and
the weight quantizer sees ``cat([W_ih, W_hh], 1)`` (so the input and recurrent
paths share a scale). Each layer and direction has its own pair of quantizers
(``_input_quantizers[k]``, ``_weight_quantizers[k]`` with
``k = layer * num_directions + direction``); the cell has
``_input_quantizer`` / ``_weight_quantizer``. The weights are quantized once per
forward, not once per time step.
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple, Union, overload

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.utils.rnn import PackedSequence

from .. import tensor_quant
from . import _utils

_Weights = Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]

__all__ = ["QuantLSTM", "QuantLSTMCell", "LSTM", "LSTMCell"]


def _quant_fused_weights(
    weight_quantizer: nn.Module, w_ih: torch.Tensor, w_hh: torch.Tensor
) -> Tuple[torch.Tensor, ...]:
    fused = weight_quantizer(torch.cat([w_ih, w_hh], 1))
    return fused.split([w_ih.size(1), w_hh.size(1)], 1)


def _lstm_step(
    x: torch.Tensor,
    h: torch.Tensor,
    c: torch.Tensor,
    w_ih: torch.Tensor,
    w_hh: torch.Tensor,
    b_ih: Optional[torch.Tensor],
    b_hh: Optional[torch.Tensor],
    input_quantizer: nn.Module,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """One LSTM step with the activations quantized together; weights already quantized."""
    x, h = input_quantizer(torch.cat([x, h], 1)).split([x.size(1), h.size(1)], 1)
    gates = F.linear(x, w_ih, b_ih) + F.linear(h, w_hh, b_hh)
    i, f, g, o = gates.chunk(4, 1)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    h = torch.sigmoid(o) * torch.tanh(c)
    return h, c


class QuantLSTM(nn.LSTM, _utils.QuantMixin):
    """Quantized ``nn.LSTM`` (same constructor and parameters; ``proj_size`` must be 0).

    Accepts padded input (``batch_first`` or not, batched or unbatched) and
    ``PackedSequence`` input, with ``hx=(h_0, c_0)`` as ``nn.LSTM``.
    """

    default_quant_desc_input = tensor_quant.QUANT_DESC_8BIT_PER_TENSOR
    default_quant_desc_weight = tensor_quant.QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        quant_desc_input, quant_desc_weight = _utils.take_quant_descs(type(self), kwargs)
        super().__init__(*args, **kwargs)
        if self.proj_size != 0:
            raise ValueError(f"QuantLSTM does not support projections; proj_size must be 0, got {self.proj_size}")
        num_directions = 2 if self.bidirectional else 1
        self.init_quantizer(quant_desc_input, quant_desc_weight, num_layers=self.num_layers * num_directions)

    def _layer_params(self, layer: int, direction: int) -> _Weights:
        suffix = f"_l{layer}" + ("_reverse" if direction == 1 else "")
        w_ih = getattr(self, "weight_ih" + suffix)
        w_hh = getattr(self, "weight_hh" + suffix)
        b_ih = getattr(self, "bias_ih" + suffix) if self.bias else None
        b_hh = getattr(self, "bias_hh" + suffix) if self.bias else None
        return w_ih, w_hh, b_ih, b_hh

    @overload
    def forward(
        self, input: torch.Tensor, hx: Optional[Tuple[torch.Tensor, torch.Tensor]] = None
    ) -> Tuple[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]: ...

    @overload
    def forward(
        self, input: PackedSequence, hx: Optional[Tuple[torch.Tensor, torch.Tensor]] = None
    ) -> Tuple[PackedSequence, Tuple[torch.Tensor, torch.Tensor]]: ...

    def forward(
        self, input: Union[torch.Tensor, PackedSequence], hx: Optional[Tuple[torch.Tensor, torch.Tensor]] = None
    ) -> Tuple[Union[torch.Tensor, PackedSequence], Tuple[torch.Tensor, torch.Tensor]]:
        packed = isinstance(input, PackedSequence)
        num_directions = 2 if self.bidirectional else 1
        steps: List[torch.Tensor]
        batch_sizes_list: Optional[List[int]]
        sorted_indices: Optional[torch.Tensor]
        unsorted_indices: Optional[torch.Tensor]
        if isinstance(input, PackedSequence):  # (packed)
            data, batch_sizes, sorted_indices, unsorted_indices = input
            batch_sizes_list = batch_sizes.tolist()
            steps = self._split_packed(data, batch_sizes_list)
            batch = batch_sizes_list[0]
            unbatched = False
        else:
            if input.dim() not in (2, 3):
                raise ValueError(f"QuantLSTM: expected a 2-D or 3-D input, got {input.dim()}-D")
            unbatched = input.dim() == 2
            if unbatched:
                input = input.unsqueeze(1)
            elif self.batch_first:
                input = input.transpose(0, 1)
            if input.size(-1) != self.input_size:
                raise ValueError(f"QuantLSTM: input.size(-1) must be input_size={self.input_size}, "
                                 f"got {input.size(-1)}")
            batch = input.size(1)
            steps = list(input.unbind(0))
            batch_sizes_list = None
            sorted_indices = unsorted_indices = None

        expected = (self.num_layers * num_directions, batch, self.hidden_size)
        if hx is None:
            zeros = steps[0].new_zeros(expected)
            h0, c0 = zeros, zeros
        else:
            h0, c0 = hx
            if unbatched:
                h0, c0 = h0.unsqueeze(1), c0.unsqueeze(1)
            if packed and sorted_indices is not None:
                h0, c0 = h0.index_select(1, sorted_indices), c0.index_select(1, sorted_indices)
            for name, t in (("h_0", h0), ("c_0", c0)):
                if tuple(t.shape) != expected:
                    raise ValueError(f"QuantLSTM: {name} must have shape {expected}, got {tuple(t.shape)}")

        hs: List[torch.Tensor] = []
        cs: List[torch.Tensor] = []
        for layer in range(self.num_layers):
            outputs = []
            for direction in range(num_directions):
                k = layer * num_directions + direction
                w_ih, w_hh, b_ih, b_hh = self._layer_params(layer, direction)
                w_ih, w_hh = _quant_fused_weights(self._weight_quantizers[k], w_ih, w_hh)
                out, h, c = self._run_direction(
                    steps, h0[k], c0[k], (w_ih, w_hh, b_ih, b_hh), self._input_quantizers[k],
                    reverse=direction == 1, batch_sizes=batch_sizes_list,
                )
                outputs.append(out)
                hs.append(h)
                cs.append(c)
            steps = [torch.cat(parts, 1) for parts in zip(*outputs)] if num_directions == 2 else outputs[0]
            if self.dropout and self.training and layer < self.num_layers - 1:
                steps = [F.dropout(s, p=self.dropout, training=True) for s in steps]

        h_n, c_n = torch.stack(hs), torch.stack(cs)
        if packed:
            packed_output = PackedSequence(torch.cat(steps, 0), batch_sizes, sorted_indices, unsorted_indices)
            if unsorted_indices is not None:
                h_n, c_n = h_n.index_select(1, unsorted_indices), c_n.index_select(1, unsorted_indices)
            return packed_output, (h_n, c_n)
        output = torch.stack(steps, 0)
        if unbatched:
            return output.squeeze(1), (h_n.squeeze(1), c_n.squeeze(1))
        if self.batch_first:
            output = output.transpose(0, 1)
        return output, (h_n, c_n)

    @staticmethod
    def _split_packed(data: torch.Tensor, batch_sizes: List[int]) -> List[torch.Tensor]:
        return list(torch.split(data, batch_sizes, 0))

    @staticmethod
    def _run_direction(
        steps: Sequence[torch.Tensor],
        h: torch.Tensor,
        c: torch.Tensor,
        weights: _Weights,
        input_quantizer: nn.Module,
        reverse: bool,
        batch_sizes: Optional[List[int]],
    ) -> Tuple[List[torch.Tensor], torch.Tensor, torch.Tensor]:
        """Runs one direction over the time steps. With ``batch_sizes`` (packed,
        sorted input) step ``t`` updates only the first ``batch_sizes[t]`` rows;
        the other rows keep their state (finished sequences in the forward
        direction, not yet started ones in the reverse direction)."""
        order = range(len(steps) - 1, -1, -1) if reverse else range(len(steps))
        outputs: List[Any] = [None] * len(steps)  # (a tensor each, once the loop has run)
        for t in order:
            x = steps[t]
            n = x.size(0)
            if batch_sizes is None or n == h.size(0):
                h, c = _lstm_step(x, h, c, *weights, input_quantizer)
                outputs[t] = h
            else:
                h_new, c_new = _lstm_step(x, h[:n], c[:n], *weights, input_quantizer)
                outputs[t] = h_new
                h = torch.cat([h_new, h[n:]], 0)
                c = torch.cat([c_new, c[n:]], 0)
        return outputs, h, c


class QuantLSTMCell(nn.LSTMCell, _utils.QuantMixin):
    """Quantized ``nn.LSTMCell`` (same constructor and parameters)."""

    default_quant_desc_input = tensor_quant.QUANT_DESC_8BIT_PER_TENSOR
    default_quant_desc_weight = tensor_quant.QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, **kwargs: Any) -> None:
        quant_desc_input, quant_desc_weight = _utils.take_quant_descs(type(self), kwargs)
        super().__init__(input_size, hidden_size, bias, **kwargs)
        self.init_quantizer(quant_desc_input, quant_desc_weight)

    def forward(
        self, input: torch.Tensor, hx: Optional[Tuple[torch.Tensor, torch.Tensor]] = None
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        if input.dim() not in (1, 2):
            raise ValueError(f"QuantLSTMCell: expected a 1-D or 2-D input, got {input.dim()}-D")
        unbatched = input.dim() == 1
        if unbatched:
            input = input.unsqueeze(0)
        if input.size(1) != self.input_size:
            raise ValueError(f"QuantLSTMCell: input.size(-1) must be input_size={self.input_size}, "
                             f"got {input.size(1)}")
        if hx is None:
            h = c = input.new_zeros(input.size(0), self.hidden_size)
        else:
            h, c = hx
            if unbatched:
                h, c = h.unsqueeze(0), c.unsqueeze(0)
        for name, t in (("h", h), ("c", c)):
            if tuple(t.shape) != (input.size(0), self.hidden_size):
                raise ValueError(f"QuantLSTMCell: {name} must have shape {(input.size(0), self.hidden_size)}, "
                                 f"got {tuple(t.shape)}")
        w_ih, w_hh = _quant_fused_weights(self._weight_quantizer, self.weight_ih, self.weight_hh)
        h, c = _lstm_step(input, h, c, w_ih, w_hh, self.bias_ih, self.bias_hh, self._input_quantizer)
        if unbatched:
            return h.squeeze(0), c.squeeze(0)
        return h, c


LSTM = QuantLSTM
LSTMCell = QuantLSTMCell
