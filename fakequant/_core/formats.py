"""The block-scale formats, each named once.

A descriptor spells the format of its block scales as Model Optimizer does,
``block_sizes["scale_bits"]``: an ``(E, M)`` tuple. That tuple is read in one place,
:meth:`BlockScales.of_scale_bits`, when a descriptor is checked and when a quantizer's spec
is built (``QuantSpec.scale_format``); everything else (the numeric paths, the presets, the
exporters and their refusals) reads the member by its name. ``tests/test_layers.py`` checks
that no ``scale_bits`` tuple is written anywhere else in fakequant/.

Adding a format whose blocks an existing operator computes is one member here (its
``scale_bits`` spelling and its description), the operator arguments it selects in
``fakequant/nn/_paths.py`` (``_DynamicBlocks``), and, if it has a rule of its own from
amax to scales, that rule in ``fakequant/composite/rules.py``.
"""
from __future__ import annotations

import enum
from typing import Any, Dict, Optional, Tuple


class BlockScales(enum.Enum):
    """The format of a quantizer's block scales (``block_sizes["scale_bits"]``)."""

    #: E4M3 block scales under a per-tensor float32 scale (two levels: NVFP4).
    E4M3 = "e4m3"
    #: E8M0 power-of-two block scales (the OCP microscaling formats: MXFP8, MXFP4, ...).
    E8M0 = "e8m0"
    #: float16 block scales computed by llama.cpp's rule (its Q8_0 and Q4_0 blocks,
    #: ``fakequant.ops.fake_quantize_ggml``): not only float16 scales, llama.cpp's rounding too.
    GGML = "ggml"

    @property
    def scale_bits(self) -> Tuple[int, int]:
        """The descriptor's spelling, ``block_sizes["scale_bits"]`` (Model Optimizer's)."""
        return _SCALE_BITS[self]

    @property
    def description(self) -> str:
        """What the format is, in words (for error messages)."""
        return _DESCRIPTIONS[self]

    @property
    def relative_to_tensor_amax(self) -> bool:
        """Whether the block scales are relative to a per-tensor amax (calibrated, or each
        input's): E4M3 (NVFP4). E8M0 and llama.cpp's scales come from their blocks alone."""
        return self is BlockScales.E4M3

    @classmethod
    def of_scale_bits(cls, scale_bits: Any) -> Optional["BlockScales"]:
        """The format that ``block_sizes["scale_bits"]`` names (a tuple or list; None for None).
        ValueError for any other value."""
        if scale_bits is None:
            return None
        key = tuple(scale_bits) if isinstance(scale_bits, (tuple, list)) else scale_bits
        found = _BY_SCALE_BITS.get(key)  # (an unhashable value: TypeError)
        if found is not None:
            return found
        names = [f"{f.scale_bits} ({f.description})" for f in cls]
        allowed = ", ".join(names[:-1]) + " or " + names[-1]
        raise ValueError(f"block_sizes['scale_bits'] must be {allowed}, got {key!r}")


# The one mapping between the descriptor's spelling and the formats.
_SCALE_BITS: Dict[BlockScales, Tuple[int, int]] = {
    BlockScales.E4M3: (4, 3),
    BlockScales.E8M0: (8, 0),
    BlockScales.GGML: (5, 10),
}
_BY_SCALE_BITS: Dict[Any, BlockScales] = {bits: fmt for fmt, bits in _SCALE_BITS.items()}
_DESCRIPTIONS: Dict[BlockScales, str] = {
    BlockScales.E4M3: "E4M3 block scales under a per-tensor scale, NVFP4",
    BlockScales.E8M0: "E8M0 power-of-two block scales, the MX formats",
    BlockScales.GGML: "float16 block scales of llama.cpp's Q8_0 and Q4_0",
}
