"""What the operator modules share (csrc/ops/common.cpp and host.h on the C++ side): the
``torch.ops.fakequant`` namespace, the parameters as tensors (:class:`_Params` and its
caches), the exceptions of torch's replacements, and the fake kernels' metadata checks.
"""
import functools
import math
import numbers
from typing import Any, Callable, Dict, Tuple, TypeVar, Union, cast

import torch

from .. import _extension
from .._core.errors import TypeAndRuntimeError, ValueAndRuntimeError


def _operators() -> Any:
    """The operators as fakequant.ops calls them: ``_ops.<name>(*args)`` is
    ``torch.ops.fakequant.<name>.default(*args)``. In eager code it is fakequant._C's function
    of that name (csrc/python_calls.cpp), which calls the operator through the dispatcher
    without torch.ops' boxed path where the arguments are plain, and passes anything else to
    the overload; Dynamo traces the overload in its place (``torch.compiler.substitute_in_graph``),
    so a compiled graph holds the same operator. Call with every argument, positionally."""
    calls = {}
    for name in _extension._C.OPERATORS:
        eager = getattr(_extension._C, name)
        overload = getattr(torch.ops.fakequant, name).default

        def traced(*args: Any, _overload: Any = overload) -> Any:
            return _overload(*args)

        torch.compiler.substitute_in_graph(eager, skip_signature_check=True)(traced)
        calls[name] = eager
    return type("_Operators", (), {"__slots__": (), **calls})()


_ops = _operators()
TensorOrNumber = Union[torch.Tensor, float, int]


def _as_tensor(value: TensorOrNumber, like: torch.Tensor, dtype: torch.dtype, name: str) -> torch.Tensor:
    """A tensor as is, or a Python number as a new tensor on like's device."""
    if isinstance(value, torch.Tensor):
        return value
    kind = type(value)
    if kind is not float and kind is not int and (kind is bool or not isinstance(value, numbers.Real)):
        raise TypeError(f"fakequant: {name} must be a tensor or a number, got {type(value).__name__}")
    if not dtype.is_floating_point:  # zero points: integers within int32
        if not (math.isfinite(value) and value == int(value) and -(2**31) <= value < 2**31):
            raise ValueError(f"fakequant: {name} must be an integer in the int32 range, got {value!r}")
        value = int(value)
    return torch.tensor(value, dtype=dtype, device=like.device)


# (module-level names: no attribute lookups on every call of _Params)
_is_compiling = torch.compiler.is_compiling
_dispatch_modes = torch._C._len_torch_dispatch_stack


class _Params:
    """An operator's parameters (scale and zero point, amax, ...) as the tensors it takes:
    tensors as they are, Python numbers made tensors once per (values, device) rather than
    on every call (a tensor each, and on CUDA a host-to-device copy that a CUDA graph
    cannot capture). The operators only read them. Each cache is emptied when it reaches
    MAX_CACHED entries."""

    MAX_CACHED = 1024

    def __init__(self, *params: Tuple[str, torch.dtype]) -> None:
        self.params = params  # (name, dtype) each
        self.cache: Dict[Tuple[Any, ...], Tuple[torch.Tensor, ...]] = {}

    def __call__(self, like: torch.Tensor, *values: TensorOrNumber) -> Tuple[torch.Tensor, ...]:
        key = None
        # Not when traced, fake or under a dispatch mode: a tensor of that world instead.
        if type(like) is torch.Tensor and not _is_compiling() and not _dispatch_modes():
            for v in values:
                if type(v) is not float and type(v) is not int:
                    break
            else:
                # (0.0 and -0.0 are one key: the rules treat them alike for every parameter)
                key = (*values, like.device)
                cached = self.cache.get(key)
                if cached is not None:
                    return cached
        if key is None:
            return self._make(like, values)
        # Normal tensors even under inference_mode: LSQ saves its scale for backward,
        # which an inference tensor cannot be.
        with torch.inference_mode(False):
            made = self._make(like, values)
        if len(self.cache) >= self.MAX_CACHED:
            self.cache.clear()
        self.cache[key] = made
        return made

    def _make(self, like: torch.Tensor, values: Tuple[TensorOrNumber, ...]) -> Tuple[torch.Tensor, ...]:
        return tuple(_as_tensor(v, like, dtype, name) for v, (name, dtype) in zip(values, self.params))


_F = TypeVar("_F", bound=Callable[..., Any])


# torch's words where torch's own tests match on them (test_workflow_ops.py): (what
# fakequant's message says, torch's message for the same error). They are added to the
# messages of the replacements of torch's functions only: fakequant's other operators keep
# their own (docs/design.md, "Errors").
_TORCH_WORDS = (
    ("zero_point must hold integers in [quant_min, quant_max]",
     "`zero_point` must be between `quant_min` and `quant_max`."),
)


def _with_torch_words(args: Tuple[Any, ...]) -> Tuple[Any, ...]:
    """An exception's args, torch's words appended to its message where it has some."""
    if len(args) == 1 and isinstance(args[0], str):
        for ours, torchs in _TORCH_WORDS:
            if ours in args[0] and torchs not in args[0]:
                return (f"{args[0]} (torch: {torchs})",)
    return args


def _raises_like_torch(fn: _F) -> _F:
    """For the replacements of torch's functions: a bad argument raises an exception that
    is both fakequant's type and torch's (RuntimeError), so ``except RuntimeError`` in code
    written for torch still catches it (ValueAndRuntimeError, TypeAndRuntimeError); where
    torch's tests match on torch's message, the message holds torch's words too."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (ValueAndRuntimeError, TypeAndRuntimeError) as e:
            e.args = _with_torch_words(e.args)
            raise
        except RuntimeError:
            raise
        except ValueError as e:
            raise ValueAndRuntimeError(*_with_torch_words(e.args)) from e
        except TypeError as e:
            raise TypeAndRuntimeError(*_with_torch_words(e.args)) from e

    return cast(_F, wrapper)  # (the same signature: functools.wraps)


_SCALE_ZERO_POINT = _Params(("scale", torch.float32), ("zero_point", torch.int32))
_SCALE = _Params(("scale", torch.float32))
_ZERO_POINT = _Params(("zero_point", torch.int32))
_AMAX = _Params(("amax", torch.float32))
_SCALE_AMAX = _Params(("scale_amax", torch.float32))
_MIN_MAX = _Params(("min_range", torch.float32), ("max_range", torch.float32))


# --- fake kernels: shapes, dtypes and strides without computing -------------
# They run under torch.compile/export tracing, and for tensors on the meta
# device, where the C++ checks do not: the cheap metadata checks are repeated.

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def _check_meta(input: torch.Tensor, input_name: str = "input", /, **params: torch.Tensor) -> None:
    if input.dtype not in _FLOAT_DTYPES:
        raise TypeError(
            f"fakequant: {input_name} must be float32, float16, bfloat16 or float64, got {input.dtype}"
        )
    for name, t in params.items():
        if t.device != input.device:
            raise ValueError(
                f"fakequant: {name} is on {t.device} but {input_name} is on {input.device}; "
                "both must be on the same device"
            )


def _new_mask(y: torch.Tensor, packed: bool = True) -> torch.Tensor:
    if packed:
        return y.new_empty(((y.numel() + 7) // 8,), dtype=torch.uint8)
    return torch.empty_like(y, dtype=torch.bool)


def _first(
    result: Tuple[torch.Tensor, torch.Tensor], return_mask: bool
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """An operator's ``(output, mask)``, or its output alone."""
    return result if return_mask else result[0]


def along_last_axis(input: torch.Tensor, axis: int, rule: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``rule`` (which works along the last axis, as the block kernels do) applied along
    ``axis`` of ``input``: the axis moved last and back. An axis out of range raises IndexError."""
    nd = max(input.dim(), 1)
    if not -nd <= axis < nd:
        raise IndexError(f"fakequant: axis {axis} is out of range for input with {input.dim()} dimensions")
    axis %= nd
    moved = input.dim() > 1 and axis != input.dim() - 1
    y = rule(input.movedim(axis, -1) if moved else input)
    return y.movedim(-1, axis) if moved else y
