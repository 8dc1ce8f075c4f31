"""What every serving format shares: the refusal (of a quantizer it cannot describe, or trained
for a target it does not serve), the import guard, the bit-for-bit check of
what is written against the fake-quantized weight, and the registry of formats.

A format is one class (a :class:`ServingFormat`, registered by name with :func:`register`) in
a module of its own that says how it stores one planned layer: ``weight`` (the format's
arguments of a weight quantizer, the tensors it writes and their dequantization as the
format reads them), ``input`` (its arguments of an input quantizer and tensors), and
``export`` (the files). Walking the model into the layers to write (``_plan.py``) and the MoE
experts (``_experts.py``) are the same for every format and ask the format for each layer.
"""
from __future__ import annotations

import importlib
from typing import Any, ClassVar, Dict, NamedTuple, Optional, Tuple, Type, TypeVar

import torch

from ..nn.tensor_quantizer import TensorQuantizer

__all__ = ["ExportRefused", "LayerPlan", "ServingFormat", "bits_equal", "exact_weight", "format_named",
           "formats", "refuse_other_targets", "register", "refusal"]


class ExportRefused(ValueError):
    """A model the format cannot describe; raised before anything is written."""


def refusal(where: str, why: str, by: Optional[str] = None) -> ExportRefused:
    """The refusal of ``where`` (a quantizer's or module's qualified name) for ``why``; ``by``:
    the format that cannot describe it, named in the message."""
    return ExportRefused(f"{where}: {why}" + ("" if by is None else f"; {by} cannot describe it")
                         + " (nothing was written)")


def refuse_other_targets(model: torch.nn.Module, targets: Tuple[str, ...], by: str) -> None:
    """Refuses ``model`` (the refusal naming the first such quantizer, its target and ``by``, the
    format or exporter) when an enabled quantizer of it was trained for a target not in
    ``targets``: the rules it trained on are not those ``by`` writes."""
    for name, module in model.named_modules():
        if isinstance(module, TensorQuantizer) and module.is_enabled and module.target not in targets:
            raise refusal(name, f"trained for target={module.target!r}, and the export writes the rules of "
                                f"target {' or '.join(map(repr, targets))}: quantize the model for the target that "
                                "serves it (fakequant.quantize_model(..., target=...))", by)


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype, shape and bit patterns (the sign of zero included)."""
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.contiguous().view(-1).view(torch.uint8), b.contiguous().view(-1).view(torch.uint8))


class LayerPlan(NamedTuple):
    """What is written for one quantized Linear: the format's arguments of its weights and
    inputs (dicts; compressed-tensors': ``QuantizationArgs`` fields) and its tensors (local names)."""

    weights: Dict[str, Any]
    inputs: Optional[Dict[str, Any]]
    tensors: Dict[str, torch.Tensor]
    shape: Tuple[int, ...]


class ServingFormat:
    """How one serving format stores a planned layer. Subclasses set the class attributes and
    implement ``weight``, ``input`` and ``export``; :func:`register` makes them reachable by name."""

    #: the name ``export_checkpoint(format=...)`` takes
    name: ClassVar[str]
    #: the importable module of the format's own library (:meth:`library`)
    package: ClassVar[str]
    #: the pip package that has it, for the import error
    distribution: ClassVar[str]
    #: None where the format writes expert weights with one quantizer per expert (a
    #: ``QuantizerList``, NVFP4's per-expert global scale); else why it cannot
    per_expert_weight_quantizers: ClassVar[Optional[str]] = None
    #: the serving targets (``quantize_model(target=...)``, ``TensorQuantizer.target``) whose
    #: rules the format describes; a quantizer trained for another is refused (:func:`refuse_other_targets`)
    targets: ClassVar[Tuple[str, ...]] = ("onnx",)

    def refuse(self, where: str, why: str) -> ExportRefused:
        """The refusal of ``where``, naming this format."""
        return refusal(where, why, self.name)

    def library(self) -> Any:
        """The format's library, imported on first use (the ``serve`` extra)."""
        try:
            return importlib.import_module(self.package)
        except ImportError as e:
            raise ImportError(f"format={self.name!r} needs the {self.distribution} package "
                              f"(pip install 'fakequant[serve]' or pip install {self.distribution})") from e

    def weight(self, where: str, q: Any, weight: torch.Tensor
               ) -> Tuple[Dict[str, Any], Dict[str, torch.Tensor], torch.Tensor]:
        """(the format's arguments of weight quantizer ``q``, the tensors written for ``weight``
        (out, in), the format's dequantization of them, which must equal ``q(weight)`` bit for
        bit: :func:`exact_weight` checks it). Refuses a quantizer the format cannot describe
        before running it."""
        raise NotImplementedError

    def input(self, where: str, q: Any) -> Tuple[Optional[Dict[str, Any]], Dict[str, torch.Tensor]]:
        """(the format's arguments of input quantizer ``q``, None when it is disabled; the
        tensors written for it)."""
        raise NotImplementedError

    def export(self, model: torch.nn.Module, directory: Any, **kwargs: Any) -> Any:
        """Writes ``model`` to ``directory``."""
        raise NotImplementedError


def exact_weight(fmt: ServingFormat, where: str, q: Any, weight: torch.Tensor
                 ) -> Tuple[Dict[str, Any], Dict[str, torch.Tensor], torch.Tensor]:
    """``fmt.weight`` of a weight and its quantizer, and the quantizer's output in the weight's
    dtype; refused unless the format's dequantization of the tensors is that output bit for bit."""
    if weight.dim() != 2:
        raise fmt.refuse(where, f"a weight of {weight.dim()} dimensions")
    args, tensors, dequant = fmt.weight(where, q, weight)
    with torch.no_grad():
        fake = q(weight.detach().cpu())
    if not bits_equal(dequant.to(fake.dtype), fake):
        raise fmt.refuse(where, "its codes times its scales do not reproduce its output "
                                "bit for bit (a rule this exporter does not know)")
    return args, tensors, fake


_FORMATS: Dict[str, ServingFormat] = {}
F = TypeVar("F", bound=Type[ServingFormat])


def register(cls: F) -> F:
    """Class decorator: makes ``cls`` the format named ``cls.name``."""
    if cls.name in _FORMATS:
        raise ValueError(f"a serving format named {cls.name!r} is registered already")
    _FORMATS[cls.name] = cls()
    return cls


def formats() -> Tuple[str, ...]:
    """The registered formats' names, in the order they were registered."""
    return tuple(_FORMATS)


def format_named(format: Any) -> ServingFormat:
    """The registered format ``format``; ValueError naming the argument for any other value."""
    found = _FORMATS.get(format) if isinstance(format, str) else None
    if found is None:
        raise ValueError(f"format must be one of {list(_FORMATS)}, got {format!r}")
    return found

