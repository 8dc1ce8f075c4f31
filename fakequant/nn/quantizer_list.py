"""``QuantizerList``: the quantizers of one tensor role split over the members of a group
(the experts of a mixture-of-experts layer), and the rule for members calibration did not reach."""
from __future__ import annotations

from typing import Any, Iterable, List, Optional, Tuple, cast

import torch
from torch import nn

from .tensor_quantizer import TensorQuantizer

__all__ = ["QuantizerList"]


class QuantizerList(nn.ModuleList):
    """One :class:`TensorQuantizer` per member (``quantizers[i]``), each calibrated on what
    member ``i`` sees: an expert's input quantizer collects only the tokens routed to it.

    The rule for a member that calibration did not reach (an expert no calibration token
    was routed to): it takes the largest amax of the members that were calibrated, element
    by element (:meth:`fill_uncalibrated`, which :func:`fakequant.utils.compute_amax`
    calls), so a token routed there later is quantized on the widest range the layer's
    input was seen to need, never clipped by a range that was never measured.
    """

    def __init__(self, quantizers: Iterable[TensorQuantizer]) -> None:
        quantizers = list(quantizers)
        for i, q in enumerate(quantizers):
            if not isinstance(q, TensorQuantizer):
                raise TypeError(f"quantizers[{i}] must be a TensorQuantizer, got {type(q).__name__}")
        super().__init__(quantizers)

    def quantizers(self) -> List[TensorQuantizer]:
        """The members, in order."""
        return [cast(TensorQuantizer, q) for q in self]

    def shared(self) -> Optional[TensorQuantizer]:
        """A member whose output on each row of an input (its last dimension) is what every
        member gives that row, or None. That holds when the members are alike (one
        configuration, the same switches, no learned range, no pre-quantization scale) and
        quantize each row from that row alone: dynamic blocks along the last axis (per token,
        or blocks of a row) whose scales read no amax (integer, E8M0 and llama.cpp's float16
        block scales; not E4M3 block scales, which are relative to a per-tensor amax). A
        calibrated amax such members keep is not read by their forward. Then one call
        quantizes rows bound for different members (the experts' grouped forward,
        :mod:`fakequant.models.experts`)."""
        members = self.quantizers()
        if not members:
            return None
        spec = members[0].spec
        block = spec.kernel_block
        if not (spec.fake_quant and spec.dynamic and not spec.learn_amax and block is not None and block[0] == -1
                and not spec.scales_need_amax):
            return None

        def switches(q: TensorQuantizer) -> Tuple[Any, ...]:
            return (q.spec, q._disabled, q._if_quant, q._if_clip, q._if_calib, q._quantizes_weight)

        for q in members:
            buffers = {name for name, _ in q.named_buffers(recurse=False)}
            if next(q.parameters(), None) is not None or buffers - {"_amax"} or switches(q) != switches(members[0]):
                return None
        return members[0]

    def fill_uncalibrated(self, uncalibrated: Iterable[TensorQuantizer]) -> List[int]:
        """Gives each quantizer of ``uncalibrated`` that is a member the largest amax of the
        calibrated members (element-wise). Returns the indices filled (none when no member
        was calibrated)."""
        missing = {id(q) for q in uncalibrated}
        members = self.quantizers()
        amaxes = [q.amax for q in members if id(q) not in missing and q.amax is not None]
        if not amaxes:
            return []
        widest = torch.stack([a.detach().float() for a in amaxes]).amax(0)
        filled = []
        for i, q in enumerate(members):
            if id(q) in missing:
                q.amax = widest
                filled.append(i)
        return filled
