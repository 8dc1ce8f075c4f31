"""``QuantizerList``: the quantizers of one tensor role split over the members of a group
(the experts of a mixture-of-experts layer), and the rule for members calibration did not reach."""
from __future__ import annotations

from typing import Iterable, List, cast

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
