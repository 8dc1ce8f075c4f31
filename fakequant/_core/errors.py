"""Exceptions that are two types at once: where pytorch-quantization 2.2.1 raised
another type than the one fakequant's rules give (docs/design.md, Errors), fakequant
raises a class derived from both, so that ``except`` clauses written for either
catch it. Each class is named for what it is (first base: fakequant's rule).
"""

__all__ = ["TypeAndValueError", "ValueAndRuntimeError", "TypeAndRuntimeError", "TypeAndAttributeError"]


class TypeAndValueError(TypeError, ValueError):
    """A wrong value where pytorch-quantization raised TypeError (a ``num_bits`` tuple
    that is no supported format, ``learn_amax`` with an ``axis``, lists of per-group
    values of the wrong length): both a ValueError and a TypeError."""


class ValueAndRuntimeError(ValueError, RuntimeError):
    """A wrong value where pytorch-quantization raised RuntimeError (a MaxCalibrator
    fed a tensor that gives another amax shape), or torch did (a zero point outside
    ``[quant_min, quant_max]`` given to a replacement of ``torch.fake_quantize_*``):
    both a ValueError and a RuntimeError."""


class TypeAndRuntimeError(TypeError, RuntimeError):
    """An argument of the wrong type given to one of torch's fake-quant functions that
    fakequant replaces, where torch raised RuntimeError: both a TypeError and a
    RuntimeError."""


class TypeAndAttributeError(TypeError, AttributeError):
    """An argument of the wrong type where pytorch-quantization failed with
    AttributeError on using it (``model=None`` in the ``optim`` helpers): both a
    TypeError and an AttributeError."""
