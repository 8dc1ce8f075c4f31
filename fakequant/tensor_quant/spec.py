"""What a quantizer computes: the part of its descriptor the numeric paths and the
calibrators read, derived once (:meth:`QuantSpec.of`), and refused there when fakequant
does not implement it."""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional, Tuple, Union

from .._core import BlockScales, check_bool, check_num_bits
from .descriptor import ScaledQuantDescriptor

__all__ = ["QuantSpec", "TARGETS"]

#: The serving targets whose rules a quantizer can follow (``QuantSpec.target``,
#: ``fakequant.quantize_model(target=...)``): ``"onnx"`` the library's contract (ONNX Runtime,
#: TensorRT, Model Optimizer), ``"vllm"`` compressed-tensors as vLLM serves it (docs/serving.md).
TARGETS = ("onnx", "vllm")


@dataclasses.dataclass(frozen=True)
class QuantSpec:
    """The configuration of a :class:`~fakequant.nn.TensorQuantizer`, read by its numeric
    paths (``fakequant.nn._paths``) and its calibrator. Frozen: a quantizer's setters
    replace it (``dataclasses.replace``), and ``__post_init__`` checks the values that can
    change that way.

    ``block_sizes`` holds the int (axis) keys of the descriptor's only; ``dynamic`` is also
    true for ``block_sizes["type"] == "dynamic"``; ``scale_bits`` is ``block_sizes["scale_bits"]``
    (the descriptor's spelling, kept as given: pickles hold it), and ``scale_format`` the format
    it names, decided here once (``BlockScales.of_scale_bits``) and read by name everywhere
    else; ``centered`` says the descriptor has a (dynamic ``max_min``) ``bias``. ``target`` is
    the serving target whose rules the quantizer follows (one of ``TARGETS``; not a descriptor
    argument: :func:`fakequant.quantize_model` sets it on every quantizer).
    """

    num_bits: Union[int, Tuple[int, int]] = 8
    unsigned: bool = False
    narrow_range: bool = False
    fake_quant: bool = True
    axis: Optional[Union[int, Tuple[int, ...]]] = None
    block_sizes: Optional[Dict[int, Optional[int]]] = None
    dynamic: bool = False
    scale_bits: Optional[Tuple[int, int]] = None
    centered: bool = False
    scale_amax: Optional[float] = None
    learn_amax: bool = False
    target: str = "onnx"
    #: The format of the block scales (``scale_bits`` read once); not an argument.
    scale_format: Optional[BlockScales] = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "num_bits", check_num_bits(self.num_bits))
        for name in ("unsigned", "narrow_range"):
            check_bool(getattr(self, name), name)
        object.__setattr__(self, "scale_format", BlockScales.of_scale_bits(self.scale_bits))
        if self.target not in TARGETS:
            raise ValueError(f"target must be one of {TARGETS}, got {self.target!r}")
        if self.scale_bits is not None and not (self.dynamic and self.kernel_block is not None):
            raise NotImplementedError("block_sizes['scale_bits'] needs dynamic blocks along one axis "
                                      "('type': 'dynamic', one axis with an int block size)")

    @classmethod
    def of(cls, desc: ScaledQuantDescriptor) -> "QuantSpec":
        """The spec of descriptor ``desc`` (which checked its arguments); raises
        NotImplementedError for the descriptions fakequant does not compute."""
        block_sizes: Dict[Any, Any] = desc.block_sizes or {}
        blocks = {k: v for k, v in block_sizes.items() if isinstance(k, int)} or None
        dynamic = desc.dynamic or block_sizes.get("type") == "dynamic"
        if block_sizes.get("scale_block_sizes") is not None:
            raise NotImplementedError("block_sizes['scale_block_sizes'] (blocks of block scales) is not implemented")
        # Model Optimizer's dynamic "max_min" bias along the axis of dynamic blocks: the blocks
        # are quantized about their centre (fake_quantize_blockwise(centered=True)).
        bias = desc.bias
        if bias is not None:
            axes = [k for k in bias if isinstance(k, int)]
            if not (bias.get("type") == "dynamic" and bias.get("method") == "max_min" and dynamic
                    and blocks is not None and len(blocks) == 1 and axes == list(blocks)):
                raise NotImplementedError(
                    f"bias={bias!r}: only a dynamic 'max_min' bias along the axis of dynamic blocks is implemented, "
                    "e.g. per-token asymmetric: type='dynamic', block_sizes={-1: None}, "
                    "bias={-1: None, 'type': 'dynamic', 'method': 'max_min'}")
        return cls(num_bits=desc.num_bits, unsigned=desc.unsigned, narrow_range=desc.narrow_range,
                   fake_quant=desc.fake_quant, axis=desc.axis, block_sizes=blocks, dynamic=dynamic,
                   scale_bits=block_sizes.get("scale_bits"), centered=bias is not None,
                   scale_amax=desc.scale_amax, learn_amax=desc.learn_amax)

    @property
    def scales_need_amax(self) -> bool:
        """Whether the block scales are relative to a per-tensor amax (E4M3 block scales,
        NVFP4: calibrated, or each input's). E8M0 (MX) and llama.cpp's float16 block scales
        come from their blocks alone."""
        return self.scale_format is not None and self.scale_format.relative_to_tensor_amax

    @classmethod
    def arguments(cls) -> Tuple[str, ...]:
        """The names of the fields that are arguments (all but ``scale_format``, which is derived):
        what ``dataclasses.replace`` takes, and what a pickled quantizer holds."""
        return tuple(f.name for f in dataclasses.fields(cls) if f.init)

    @property
    def kernel_block(self) -> Optional[Tuple[int, Optional[int]]]:
        """``(axis, block_size)`` when the blocks run along one axis, which
        ``fake_quantize_blockwise`` computes dynamically in one pass; else None. A
        ``block_size`` of None is the whole axis (per token, the size read per input)."""
        if self.block_sizes is None or len(self.block_sizes) != 1:
            return None
        (axis, size), = self.block_sizes.items()
        return axis, size
