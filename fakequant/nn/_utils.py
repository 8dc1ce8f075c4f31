"""Mixins that give a module its input (and weight) quantizers."""
from __future__ import annotations

import copy
import functools
import inspect
from typing import Any, Dict, FrozenSet, List, Literal, Optional, Set, Tuple, Type, Union, cast, overload

from torch import nn

from ..tensor_quant import QUANT_DESC_8BIT_PER_TENSOR, QuantDescriptor, ScaledQuantDescriptor
from .tensor_quantizer import TensorQuantizer

__all__ = ["QuantMixin", "QuantInputMixin", "pop_quant_desc_in_kwargs"]


def _check_desc(value: Any, name: str) -> ScaledQuantDescriptor:
    if not isinstance(value, QuantDescriptor):
        raise TypeError(f"{name} must be a QuantDescriptor, got {value!r} ({type(value).__name__})")
    if not value.fake_quant:
        raise ValueError(f"{name}: Only fake quantization is supported by quantized modules, got fake_quant=False")
    return value


class QuantInputMixin:
    """Adds an input quantizer (``_input_quantizer``) to a module.

    Class attribute ``default_quant_desc_input`` is the descriptor used when
    the constructor gets no ``quant_desc_input``; set it per class with
    :meth:`set_default_quant_desc_input`.
    """

    default_quant_desc_input: ScaledQuantDescriptor = QUANT_DESC_8BIT_PER_TENSOR
    # Set by init_quantizer (a submodule of the nn.Module this is mixed into).
    _input_quantizer: TensorQuantizer

    @classmethod
    def set_default_quant_desc_input(cls, value: ScaledQuantDescriptor) -> None:
        """Sets this class's default input descriptor (a copy of ``value``)."""
        cls.default_quant_desc_input = copy.deepcopy(_check_desc(value, "quant_desc_input"))

    def init_quantizer(self, quant_desc_input: ScaledQuantDescriptor) -> None:
        """Creates ``self._input_quantizer`` from ``quant_desc_input``."""
        _check_desc(quant_desc_input, "quant_desc_input")
        self._fake_quant = True
        self._input_quantizer = TensorQuantizer(quant_desc_input)

    @property
    def input_quantizer(self) -> TensorQuantizer:
        return self._input_quantizer


class QuantMixin:
    """Adds input and weight quantizers (``_input_quantizer``, ``_weight_quantizer``).

    Class attributes ``default_quant_desc_input`` / ``default_quant_desc_weight``
    are used when the constructor gets no descriptors; set them per class with
    :meth:`set_default_quant_desc_input` / :meth:`set_default_quant_desc_weight`.
    """

    default_quant_desc_input: ScaledQuantDescriptor = QUANT_DESC_8BIT_PER_TENSOR
    default_quant_desc_weight: ScaledQuantDescriptor = QUANT_DESC_8BIT_PER_TENSOR
    # Set by init_quantizer (submodules of the nn.Module this is mixed into): one of each,
    # or with num_layers a list of each.
    _input_quantizer: TensorQuantizer
    _weight_quantizer: TensorQuantizer
    _input_quantizers: nn.ModuleList
    _weight_quantizers: nn.ModuleList

    @classmethod
    def set_default_quant_desc_input(cls, value: ScaledQuantDescriptor) -> None:
        """Sets this class's default input descriptor (a copy of ``value``)."""
        cls.default_quant_desc_input = copy.deepcopy(_check_desc(value, "quant_desc_input"))

    @classmethod
    def set_default_quant_desc_weight(cls, value: ScaledQuantDescriptor) -> None:
        """Sets this class's default weight descriptor (a copy of ``value``)."""
        cls.default_quant_desc_weight = copy.deepcopy(_check_desc(value, "quant_desc_weight"))

    def init_quantizer(
        self,
        quant_desc_input: ScaledQuantDescriptor,
        quant_desc_weight: ScaledQuantDescriptor,
        num_layers: Optional[int] = None,
    ) -> None:
        """Creates the quantizers: ``_input_quantizer`` and ``_weight_quantizer``,
        or with ``num_layers`` the lists ``_input_quantizers`` / ``_weight_quantizers``."""
        _check_desc(quant_desc_input, "quant_desc_input")
        _check_desc(quant_desc_weight, "quant_desc_weight")
        self._fake_quant = True
        if num_layers is None:
            self._input_quantizer = TensorQuantizer(quant_desc_input)
            self._weight_quantizer = TensorQuantizer(quant_desc_weight)
            weights = [self._weight_quantizer]
        else:
            if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
                raise ValueError(f"num_layers must be a positive int or None, got {num_layers!r}")
            self._input_quantizers = nn.ModuleList(TensorQuantizer(quant_desc_input) for _ in range(num_layers))
            self._weight_quantizers = nn.ModuleList(TensorQuantizer(quant_desc_weight) for _ in range(num_layers))
            # (nn.ModuleList is not generic: it holds the TensorQuantizers made just above)
            weights = cast(List[TensorQuantizer], list(self._weight_quantizers))
        for q in weights:
            q._quantizes_weight = True  # see TensorQuantizer._load_calibrated_amax

    @property
    def input_quantizer(self) -> TensorQuantizer:
        return self._input_quantizer

    @property
    def weight_quantizer(self) -> TensorQuantizer:
        return self._weight_quantizer


@functools.lru_cache(maxsize=None)
def _float_keywords(quant_cls: type) -> Optional[FrozenSet[str]]:
    """The keyword arguments the ``__init__`` of the module ``quant_cls`` quantizes takes
    (the first class of its MRO that is no quant mixin and defines one; through torch's
    classes that pass ``**kwargs`` on, as ``nn.LSTM`` to ``nn.RNNBase``); None if it takes
    any."""
    names: Set[str] = set()
    for cls in quant_cls.__mro__:
        if issubclass(cls, (QuantMixin, QuantInputMixin)) or "__init__" not in vars(cls):
            continue
        if cls in (nn.Module, object):
            break
        params = inspect.signature(cls.__init__).parameters.values()
        names.update(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
        if not cls.__module__.startswith("torch."):
            return None  # (its **kwargs may be its own)
    return frozenset(names)


def _unknown_keywords(quant_cls: type, kwargs: Dict[str, Any]) -> List[str]:
    known = _float_keywords(quant_cls)
    if known is None:
        return []
    return sorted(set(kwargs) - known - {"quant_desc_input", "quant_desc_weight", "self"})


@overload
def take_quant_descs(
    quant_cls: Type[Union[QuantMixin, QuantInputMixin]], kwargs: Dict[str, Any], input_only: Literal[True]
) -> ScaledQuantDescriptor: ...


@overload
def take_quant_descs(
    quant_cls: Type[QuantMixin], kwargs: Dict[str, Any], input_only: Literal[False] = ...
) -> Tuple[ScaledQuantDescriptor, ScaledQuantDescriptor]: ...


@overload
def take_quant_descs(
    quant_cls: Type[Union[QuantMixin, QuantInputMixin]], kwargs: Dict[str, Any], input_only: bool
) -> Union[ScaledQuantDescriptor, Tuple[ScaledQuantDescriptor, ScaledQuantDescriptor]]: ...


def take_quant_descs(
    quant_cls: Any, kwargs: Dict[str, Any], input_only: bool = False
) -> Union[ScaledQuantDescriptor, Tuple[ScaledQuantDescriptor, ScaledQuantDescriptor]]:
    """Pops ``quant_desc_input`` (and ``quant_desc_weight``) from the dict
    ``kwargs`` (defaults: ``quant_cls``'s), leaving the other keys."""
    unused = _unknown_keywords(quant_cls, kwargs)
    if unused:
        raise TypeError(f"Unused keys: {unused}: {quant_cls.__name__} takes the keyword arguments of the module it "
                        "quantizes, and quant_desc_input / quant_desc_weight")
    desc_input = kwargs.pop("quant_desc_input", quant_cls.default_quant_desc_input)
    if input_only:
        if "quant_desc_weight" in kwargs:
            raise TypeError(f"{quant_cls.__name__} quantizes its input only; it takes no quant_desc_weight")
        return desc_input
    return desc_input, kwargs.pop("quant_desc_weight", quant_cls.default_quant_desc_weight)


@overload
def pop_quant_desc_in_kwargs(
    quant_cls: Type[Union[QuantMixin, QuantInputMixin]], input_only: Literal[True], **kwargs: Any
) -> ScaledQuantDescriptor: ...


@overload
def pop_quant_desc_in_kwargs(
    quant_cls: Type[QuantMixin], input_only: Literal[False] = ..., **kwargs: Any
) -> Tuple[ScaledQuantDescriptor, ScaledQuantDescriptor]: ...


def pop_quant_desc_in_kwargs(
    quant_cls: Any, input_only: bool = False, **kwargs: Any
) -> Union[ScaledQuantDescriptor, Tuple[ScaledQuantDescriptor, ScaledQuantDescriptor]]:
    """The descriptors in ``kwargs`` (or ``quant_cls``'s defaults):
    ``quant_desc_input``, or ``(quant_desc_input, quant_desc_weight)``.

    Raises:
        TypeError: if ``kwargs`` holds other keys.
    """
    unused = sorted(set(kwargs) - {"quant_desc_input", "quant_desc_weight"})
    if unused:
        raise TypeError(f"Unused keys: {unused}: these keyword arguments are unused (it takes quant_desc_input "
                        "and quant_desc_weight only)")
    return take_quant_descs(quant_cls, kwargs, input_only)
