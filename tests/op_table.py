"""The operator table: one entry per ``torch.ops.fakequant`` operator, read by every
cross-cutting test (registration and opcheck, gradcheck, reference, double backward,
compiled, fuzz rules, invalid arguments, CPU against CUDA, emulated CUDA, ONNX cases).

Adding an operator is one ``OpEntry`` in ``TABLE`` (plus its kernels and wrapper: the
checklist in csrc/README.md). An entry holds:

- ``variants``: the operator's calls, each a function of a sample input ``x`` giving the
  operator's full argument tuple (parameters built on ``x``'s device, channel counts
  from ``x``'s shape). ``per_tensor`` variants work on any shape (a 0-d or 1-D input too).
- ``reference``: the plain-PyTorch rule (fakequant.composite.rules, as tests/reference.py) of
  a variant's arguments: the expected output and bool mask (None: not compared).
- ``backward``: "mask" where the backward is the packed mask's (the double-backward test
  reads those), "lsq" for LSQ's own formulas, None where there is no autograd formula.
- ``compiled``: calls of the public wrapper, ``(name, fn(x) -> y)``, that test_compiled
  runs under torch.compile.
- ``gradcheck``: float64 gradcheck cases.
- ``invalid``: invalid arguments, with the exception type and a message fragment.
- ``rules``: which arguments the README's rules reject (the fuzz tests decide validity by it).
- ``onnx``: the operator's own ONNX cases (tests/onnx_cases.py and test_onnx_fp8_block read them).

Sample inputs come from ``sample_input(layout, dtype, device)``: one 2x8x6x5 tensor of
values about +-2 (with NaN, +-inf, +-0, ties and values beyond the ranges where
``special``), viewed in each of ``LAYOUTS``.
"""
import dataclasses
import inspect
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

import fakequant
import reference as ref

ops = torch.ops.fakequant

# --- sample inputs -------------------------------------------------------------------------

SPECIAL = [float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e-30, -1e-30, 2.5, -2.5, 2.5 / 127 * 0.5,
           -2.5 / 127 * 0.5, 2.5 / 127 * 1.5, 1e4, -1e4, 3.0, -3.0]

# The views every layout test takes of one base tensor: dense ones (the kernels keep
# their layout) and non-dense ones (a strided copy).
LAYOUTS = ("contiguous", "channels_last", "transposed", "channels_last_3d", "permuted", "sliced")


def sample_input(layout: str, dtype=torch.float64, device="cpu", special: bool = True, seed: int = 0):
    """One input in ``layout``: the base is randn(2, 8, 6, 5) * 2 (float64, then ``dtype``), with
    SPECIAL at its first elements and reversed at its last ones where ``special``."""
    g = torch.Generator().manual_seed(seed)
    base = (torch.randn(2, 8, 6, 5, generator=g, dtype=torch.float64) * 2).to(dtype)
    if special:
        flat = base.view(-1)
        flat[: len(SPECIAL)] = torch.tensor(SPECIAL, dtype=torch.float64).to(dtype)
        flat[-len(SPECIAL):] = torch.tensor(SPECIAL[::-1], dtype=torch.float64).to(dtype)
    base = base.to(device)
    if layout == "contiguous":
        return base
    if layout == "channels_last":
        return base.to(memory_format=torch.channels_last)
    if layout == "transposed":
        return base.reshape(16, 30).t()
    if layout == "channels_last_3d":
        return base.reshape(2, 8, 3, 2, 5).contiguous(memory_format=torch.channels_last_3d)
    if layout == "permuted":
        return base.reshape(6, 8, 10).permute(2, 0, 1)
    if layout == "sliced":
        return base[:, ::2, 1:, ::2]
    raise ValueError(f"unknown layout {layout!r}")


def samples(dtype=torch.float64, device="cpu", layouts: Sequence[str] = LAYOUTS, special: bool = True):
    """(layout, input) for each layout."""
    return [(layout, sample_input(layout, dtype, device, special)) for layout in layouts]


# --- parameter helpers (on x's device, shaped from x) ------------------------------------------


def scalar(x, v, dtype=torch.float32):
    return torch.tensor(v, dtype=dtype, device=x.device)


def vector(x, v, dtype=torch.float32):
    return torch.tensor([v], dtype=dtype, device=x.device)


def channels(x, values, dtype=torch.float32, axis=1):
    """One value per index of ``axis`` (``values`` cycled), a vector."""
    n = x.shape[axis]
    return torch.tensor([values[i % len(values)] for i in range(n)], dtype=dtype, device=x.device)


def per_channel(x, values, axis=1):
    """One value per index of ``axis`` (cycled), shaped to broadcast against x."""
    shape = [1] * x.dim()
    shape[axis] = x.shape[axis]
    return channels(x, values, axis=axis).reshape(shape)


def fused_buffers(x, n):
    """Fresh buffers of torch's fused observer: running min/max, scale, zero point."""
    d = x.device
    return (torch.full((n,), float("inf"), device=d), torch.full((n,), float("-inf"), device=d),
            torch.ones(n, device=d), torch.zeros(n, dtype=torch.int32, device=d))


def _unpacked(out, mask):
    """A bool mask as the operator returned it, or its packed mask unpacked for ``out``."""
    return mask if mask.dtype == torch.bool else fakequant.unpack_mask(mask, out)


# --- the parts of an entry --------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    args: Callable[[torch.Tensor], tuple]  # x -> the operator's arguments
    per_tensor: bool = False  # the arguments suit an input of any shape
    packed: bool = True  # the mask output (where there is one) is packed at 1 bit per element
    clips: bool = True  # some sample elements fall outside the range: the mask has both values


@dataclasses.dataclass(frozen=True)
class Invalid:
    """Arguments (the entry's ``invalid_base`` with ``changes``) that raise ``exc``
    with ``match`` in the message. ``value``: a check of parameter values (run on CUDA
    tensors only with FAKEQUANT_CHECK_VALUES=1)."""
    changes: Dict[str, object]
    exc: type
    match: str
    value: bool = False

    def arguments(self, base: Dict[str, object]) -> tuple:
        args = dict(base)
        args.update(self.changes)
        return tuple(args.values())


@dataclasses.dataclass(frozen=True)
class GradCheck:
    """gradcheck (and gradgradcheck where ``twice``) of ``make(device) -> (fn, inputs)``."""
    name: str
    make: Callable[[str], Tuple[Callable, tuple]]
    eps: float = 1e-6
    atol: float = 1e-5
    twice: bool = True


@dataclasses.dataclass(frozen=True)
class OnnxCase:
    """A module calling the operator, exported and compared with ONNX Runtime. ``inputs``:
    whose inputs it takes ("qdq": test_onnx_qdq.inputs, "fp8_block": test_onnx_fp8_block.inputs);
    ``graph``: what test_onnx_fp8_block expects the graph to hold."""
    make: Callable[[], torch.nn.Module]
    inputs: str = "qdq"
    min_opset: int = 13
    exporters: Tuple[str, ...] = ("dynamo", "torchscript")
    graph: str = "qdq"


@dataclasses.dataclass(frozen=True)
class OpEntry:
    name: str  # torch.ops.fakequant.<name>
    wrapper: Optional[Callable]  # its typed wrapper in fakequant.ops (None: called only by another op's backward)
    variants: List[Variant]
    reference: Optional[Callable[[tuple], Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]]] = None
    no_reference: str = ""  # why there is none
    backward: Optional[str] = "mask"  # "mask", "lsq" or None
    stateful: bool = False  # mutates its arguments (each call needs fresh ones)
    keeps_layout: bool = True  # the output of a dense input is laid out as the input
    # outputs that are sums over many elements in an order of each device's own (CUDA
    # against CPU: equal within float32 rounding, not bit for bit)
    reduced_outputs: Tuple[int, ...] = ()
    compiled: List[Tuple[str, Callable[[torch.Tensor], torch.Tensor]]] = dataclasses.field(default_factory=list)
    gradcheck: List[GradCheck] = dataclasses.field(default_factory=list)
    invalid_base: Optional[Callable[[], Dict[str, object]]] = None
    invalid: List[Invalid] = dataclasses.field(default_factory=list)
    rules: Optional[Callable[..., set]] = None
    onnx: Dict[str, OnnxCase] = dataclasses.field(default_factory=dict)

    @property
    def op(self):
        return getattr(ops, self.name)


# --- the rules (README, csrc/include/fakequant/arg_checks.h): which arguments are invalid -------
# Each returns the names of the arguments that break a rule; "value:<name>" for a rule on
# parameter values (checked on CUDA only with FAKEQUANT_CHECK_VALUES=1).

FLOATS = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def _device_and_dtype(x, params, xname="input"):
    bad = set()
    if x.dtype not in FLOATS:
        bad.add(xname)
    for name, t in params.items():
        if t.device != x.device:
            bad.add(name)
    return bad


def _broadcasts(p, x):
    if p.dim() > x.dim():
        return False
    return all(ps == xs or ps == 1 for ps, xs in zip(reversed(p.shape), reversed(x.shape)))


def rules_affine(x, scale, zp, axis, qmin, qmax):
    bad = _device_and_dtype(x, {"scale": scale, "zero_point": zp})
    if not scale.dtype.is_floating_point:
        bad.add("scale")
    if zp.dtype == torch.bool or zp.dtype.is_complex:
        bad.add("zero_point")
    if qmin > qmax or qmin < INT32_MIN or qmax > INT32_MAX:
        bad.add("quant_min")
    n = 1
    if axis is not None:
        if not -x.dim() <= axis < x.dim():
            return bad | {"axis"}
        n = x.shape[axis]
    if scale.numel() != n:
        bad.add("scale")
    if zp.numel() != n:
        bad.add("zero_point")
    if bad or scale.device.type == "meta" or zp.device.type == "meta":
        return bad
    s = scale.detach().cpu().float()
    if not bool((torch.isfinite(s) & (s > 0)).all()):
        bad.add("value:scale")
    z = zp.detach().cpu().double()
    if not bool(((z == z.round()) & (z >= qmin) & (z <= qmax)).all()):
        bad.add("value:zero_point")
    return bad


def rules_amax(x, amax, num_bits):
    bad = _device_and_dtype(x, {"amax": amax})
    if not amax.dtype.is_floating_point:
        bad.add("amax")
    if not 2 <= num_bits <= 16:
        bad.add("num_bits")
    if not _broadcasts(amax, x):
        bad.add("amax")
    if bad or amax.device.type == "meta":
        return bad
    a = amax.detach().cpu().float()
    if not bool((torch.isfinite(a) & (a >= 0)).all()):
        bad.add("value:amax")
    return bad


def rules_min_max(x, lo, hi, num_bits):
    bad = _device_and_dtype(x, {"min_range": lo, "max_range": hi})
    for name, t in (("min_range", lo), ("max_range", hi)):
        if not t.dtype.is_floating_point or not _broadcasts(t, x):
            bad.add(name)
    if not 2 <= num_bits <= 16:
        bad.add("num_bits")
    if bad or lo.device.type == "meta" or hi.device.type == "meta":
        return bad
    step = (hi.detach().cpu().float() - lo.detach().cpu().float()) / float(2**num_bits - 1)
    if not bool((torch.isfinite(step) & (step > 0)).all()):
        bad |= {"value:min_range", "value:max_range"}
    return bad


def rules_mask_backward(grad, mask):
    bad = _device_and_dtype(grad, {"mask": mask}, "grad")
    if mask.dtype == torch.bool:
        if mask.shape != grad.shape:
            bad.add("mask")
    elif mask.dtype != torch.uint8 or mask.dim() != 1 or mask.numel() != (grad.numel() + 7) // 8:
        bad.add("mask")
    return bad


# --- invalid arguments ------------------------------------------------------------------------

_X = torch.randn(4, 3, 5, generator=torch.Generator().manual_seed(0))


def _affine_base():
    return dict(input=_X, scale=torch.tensor([0.1]), zero_point=torch.tensor([0], dtype=torch.int32), axis=None,
                quant_min=-128, quant_max=127)


INVALID_AFFINE = [
    Invalid(dict(scale=torch.tensor([0.0])), ValueError, "scale", value=True),
    Invalid(dict(scale=torch.tensor([-0.5])), ValueError, "scale", value=True),
    Invalid(dict(scale=torch.tensor([float("nan")])), ValueError, "scale", value=True),
    Invalid(dict(scale=torch.tensor([float("inf")])), ValueError, "scale", value=True),
    Invalid(dict(scale=torch.tensor([1e-50], dtype=torch.float64)), ValueError, "scale", value=True),  # 0 as float32
    Invalid(dict(quant_min=10, quant_max=5), ValueError, "quant_min"),
    Invalid(dict(quant_min=-(2**40)), ValueError, "quant_min"),
    Invalid(dict(zero_point=torch.tensor([200])), ValueError, "zero_point", value=True),
    Invalid(dict(zero_point=torch.tensor([0.5])), ValueError, "zero_point", value=True),
    Invalid(dict(zero_point=torch.tensor([True])), TypeError, "zero_point"),
    Invalid(dict(axis=3, scale=torch.ones(3), zero_point=torch.zeros(3)), IndexError, "axis"),
    Invalid(dict(axis=-4, scale=torch.ones(3), zero_point=torch.zeros(3)), IndexError, "axis"),
    Invalid(dict(axis=1, scale=torch.ones(4), zero_point=torch.zeros(4)), ValueError, "scale"),
    Invalid(dict(axis=1, scale=torch.ones(3), zero_point=torch.zeros(2)), ValueError, "zero_point"),
    Invalid(dict(scale=torch.ones(2), zero_point=torch.zeros(2)), ValueError, "scale"),
    Invalid(dict(input=torch.ones(3, dtype=torch.int32)), TypeError, "input"),
    Invalid(dict(input=torch.ones(3, dtype=torch.complex64)), TypeError, "input"),
    Invalid(dict(scale=torch.tensor([1], dtype=torch.int32)), TypeError, "scale"),
    Invalid(dict(scale=torch.tensor([1.0], device="meta")), ValueError, "scale"),
    Invalid(dict(zero_point=torch.tensor([0], device="meta")), ValueError, "zero_point"),
]


def _amax_base():
    return dict(input=_X, amax=torch.tensor(1.0), num_bits=8, unsigned=False, narrow_range=True)


INVALID_AMAX = [
    Invalid(dict(amax=torch.tensor(-1.0)), ValueError, "amax", value=True),
    Invalid(dict(amax=torch.tensor(float("nan"))), ValueError, "amax", value=True),
    Invalid(dict(amax=torch.tensor([1.0, -2.0, 1.0])), ValueError, "amax"),  # (3,) against (4, 3, 5)
    Invalid(dict(amax=torch.ones(4, 1, 2)), ValueError, "amax"),  # not broadcastable
    Invalid(dict(amax=torch.ones(4, 3, 5, 1)), ValueError, "amax"),  # more dims than input
    Invalid(dict(amax=torch.ones(4, 2, 1)), ValueError, "amax"),
    Invalid(dict(amax=torch.tensor(1, dtype=torch.int64)), TypeError, "amax"),
    Invalid(dict(num_bits=1), ValueError, "num_bits"),
    Invalid(dict(num_bits=17), ValueError, "num_bits"),
    Invalid(dict(input=torch.ones(3, dtype=torch.int64)), TypeError, "input"),
    Invalid(dict(amax=torch.tensor(1.0, device="meta")), ValueError, "amax"),
]


def _min_max_base():
    return dict(input=_X, min_range=torch.tensor(-1.0), max_range=torch.tensor(1.0), num_bits=8)


INVALID_MIN_MAX = [
    Invalid(dict(min_range=torch.tensor(1.0), max_range=torch.tensor(1.0)), ValueError, "max_range", value=True),
    Invalid(dict(min_range=torch.tensor(2.0), max_range=torch.tensor(1.0)), ValueError, "max_range", value=True),
    Invalid(dict(max_range=torch.tensor(float("inf"))), ValueError, "max_range", value=True),
    Invalid(dict(min_range=torch.ones(7)), ValueError, "min_range"),
    Invalid(dict(max_range=torch.ones(2, 1, 1)), ValueError, "max_range"),
    Invalid(dict(num_bits=0), ValueError, "num_bits"),
    Invalid(dict(min_range=torch.tensor(0)), TypeError, "min_range"),
]


def _mask_base():
    return dict(grad=torch.ones(10), mask=torch.zeros(2, dtype=torch.uint8))


INVALID_MASK = [
    Invalid(dict(mask=torch.zeros(1, dtype=torch.uint8)), ValueError, "mask"),
    Invalid(dict(mask=torch.zeros(2, 1, dtype=torch.uint8)), ValueError, "mask"),
    Invalid(dict(mask=torch.zeros(9, dtype=torch.bool)), ValueError, "mask"),
    Invalid(dict(mask=torch.zeros(2, dtype=torch.int32)), TypeError, "mask"),
    Invalid(dict(grad=torch.ones(10, dtype=torch.int32)), TypeError, "grad"),
    Invalid(dict(mask=torch.zeros(2, dtype=torch.uint8, device="meta")), ValueError, "mask"),
]


# --- gradcheck ----------------------------------------------------------------------------------
# A fake quantizer is piecewise constant, and its backward is the straight-through
# estimator. With steps far below gradcheck's finite-difference eps, the numerical
# Jacobian of the quantizer is that of the STE (1 inside the range, 0 outside), so
# gradcheck checks the backward against the forward.


def _away_from(x, edges, margin):
    for e in edges:
        x = torch.where((x - e).abs() < margin, x + 3 * margin, x)
    return x


def _gradcheck_affine(device):
    s = 2.0**-40  # float32 scale; steps of 1e-12
    g = torch.Generator().manual_seed(0)
    x = (torch.rand(40, generator=g, dtype=torch.float64).to(device) - 0.5) * 2**-7
    x = _away_from(x, [-(2**31) * s, (2**31 - 1) * s], 1e-4).requires_grad_()  # some outside the range
    scale = torch.tensor([s], device=device)
    zp = torch.tensor([0], device=device)
    return (lambda t: fakequant.fake_quantize_affine(t, scale, zp, None, -(2**31) + 1, 2**31 - 1)), (x,)


def _range_input(device):
    # 16 bits over [-1, 1]: steps of 3e-5, eps 1e-2, so the quotients are 1 within 0.3%.
    g = torch.Generator().manual_seed(0)
    x = (torch.rand(60, generator=g, dtype=torch.float64).to(device) - 0.5) * 4
    return _away_from(x, [-1.0, 1.0, -0.5, 1.5], 0.03).requires_grad_()


def _gradcheck_mask(boolean):
    def make(device):
        g = torch.Generator().manual_seed(0)
        grad = torch.randn(5, 7, generator=g, dtype=torch.float64).to(device).requires_grad_()
        if boolean:
            mask = (torch.rand(5, 7, generator=g) > 0.5).to(device)
        else:
            mask = ops.fake_quantize_amax(torch.randn(5, 7, generator=g, dtype=torch.float64).to(device),
                                          torch.tensor(1.0, device=device), 8, False, True)[1]
        return (lambda t: ops.mask_backward(t, mask)), (grad,)
    return make


# --- ONNX cases of single operators -------------------------------------------------------------


class _Affine(torch.nn.Module):
    """torch's fake-quant family (fakequant's replacements), the cachemask forms included."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("scale", torch.tensor([0.01, 0.02, 0.03, 0.05]))
        self.register_buffer("zero_point", torch.tensor([0, -5, 7, 1], dtype=torch.int32))

    def forward(self, x):
        return (fakequant.fake_quantize_per_tensor_affine(x, 0.02, 3, 0, 255),
                fakequant.fake_quantize_per_channel_affine(x, self.scale, self.zero_point, 1, -128, 127),
                fakequant.fake_quantize_per_tensor_affine_cachemask(x, 0.05, -2, -128, 127)[0],
                fakequant.fake_quantize_per_channel_affine_cachemask(x, self.scale, self.zero_point, 1, -128, 127)[0],
                fakequant.ops._fake_quantize_learnable_per_tensor_affine(
                    x, torch.tensor([0.03]), torch.tensor([4.0]), 0, 255, 1.0))


class _Call(torch.nn.Module):
    """A module whose forward is ``fn``."""

    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


def _lsq_learned_scale():
    """LSQ with a learned scale (one per channel) and a fixed zero point."""
    scale = torch.nn.Parameter(torch.tensor([0.01, 0.02, 0.03, 0.05]))

    class Lsq(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = scale

        def forward(self, x):
            return fakequant.fake_quantize_lsq(x, self.scale, 3, 1, -128, 127, grad_factor=1.0)
    return Lsq()


# --- references of the variants ------------------------------------------------------------------


def _ref_affine(args):
    x, scale, zp, axis, qmin, qmax = args[:6]
    return ref.fake_quantize_affine(x, scale.float(), zp, None if axis is None else axis % x.dim(), qmin, qmax)


def _ref_lsq(args):
    # LSQ's forward value is the affine operator's (ref.fake_quantize_lsq gives its gradients)
    x, scale, zp, axis, qmin, qmax = args[:6]
    return ref.fake_quantize_affine(x, scale.detach().float(), zp.detach(),
                                    None if axis is None else axis % x.dim(), qmin, qmax)[0], None


def _ref_lsq_backward(args):
    grad, x, scale, zp, axis, qmin, qmax = args[:7]
    _, mask = ref.fake_quantize_affine(x, scale.float(), zp, None if axis is None else axis % x.dim(), qmin, qmax)
    return torch.where(mask, grad, torch.zeros_like(grad)), None


def _ref_mask_backward(args):
    grad, mask = args[:2]
    if mask.dtype == torch.bool:
        keep = mask
    else:  # bit i belongs to element i in the memory order of the forward's output
        like = torch.empty_strided(grad.shape, args[2], device=grad.device) if len(args) > 2 \
            else torch.empty_like(grad)  # (grad's layout where dense, else contiguous)
        keep = fakequant.unpack_mask(mask, like)
    return torch.where(keep, grad, torch.zeros_like(grad)), None


def _mask_with_strides(x):
    y, packed = ops.fake_quantize_amax(x.detach(), scalar(x, 1.5), 8, False, True)
    grad = torch.randn(x.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    return grad.to(x.device, x.dtype).requires_grad_(x.requires_grad), packed, list(y.stride())


def _ref_blockwise(args):
    x, block_size, num_bits, unsigned, narrow, ebits, sa, _check, e8m0, centered = args
    return ref.fake_quantize_blockwise(x, block_size, num_bits, unsigned, narrow, ebits, sa, e8m0, centered)


def _amax_variants(prefix):
    return [
        Variant(prefix, lambda x: (x, scalar(x, 3.0), 8, False, True), per_tensor=True),
        Variant(f"{prefix}_unsigned", lambda x: (x, scalar(x, 3.0), 4, True, False), per_tensor=True),
        Variant(f"{prefix}_per_channel", lambda x: (x, per_channel(x, [1.2, 0.5, 2.0]) + 0.3, 4, False, True)),
    ]


def _ste_amax(device):
    return (lambda t: fakequant.fake_quantize_amax(t, 1.0, num_bits=16)), (_range_input(device),)


def _ste_min_max(device):
    return (lambda t: fakequant.fake_quantize_min_max(t, -0.5, 1.5, num_bits=16)), (_range_input(device),)


def rules_ggml(x, block_size, num_bits):
    bad = _device_and_dtype(x, {})
    if block_size < 1:
        bad.add("block_size")
    if num_bits not in (4, 8):
        bad.add("num_bits")
    return bad


def _ggml_base():
    return dict(input=_X, block_size=32, num_bits=8)


INVALID_GGML = [
    Invalid(dict(block_size=0), ValueError, "block_size"),
    Invalid(dict(num_bits=6), ValueError, "num_bits"),
    Invalid(dict(num_bits=2), ValueError, "num_bits"),
    Invalid(dict(input=torch.ones(3, dtype=torch.int64)), TypeError, "input"),
]


# --- the table ------------------------------------------------------------------------------------

TABLE: List[OpEntry] = [
    OpEntry(
        name="fake_quantize_affine",
        wrapper=fakequant.ops.fake_quantize_affine,
        variants=[
            Variant("affine", lambda x: (x, vector(x, 0.05), vector(x, 3, torch.int32), None, -20, 20),
                    per_tensor=True),
            Variant("affine_per_channel", lambda x: (x, channels(x, [0.02, 0.05, 0.08, 0.03]),
                                                     channels(x, [0, -2, 4], torch.int32), 1, -16, 15)),
            Variant("affine_unsigned_bool_mask", lambda x: (x, vector(x, 0.02), vector(x, 1, torch.int32), None,
                                                            0, 255, False), per_tensor=True, packed=False),
        ],
        reference=_ref_affine,
        compiled=[
            ("affine per tensor", lambda x: fakequant.fake_quantize_per_tensor_affine(x, 0.02, 3, -128, 127)),
            ("affine per channel", lambda x: fakequant.fake_quantize_per_channel_affine(
                x, channels(x, [0.02, 0.5, 1e-3]), channels(x, [0, 7, 255], torch.int32), 1, 0, 255)),
        ],
        gradcheck=[GradCheck("int32 range", _gradcheck_affine)],
        invalid_base=_affine_base,
        invalid=INVALID_AFFINE,
        rules=rules_affine,
        onnx={"torch_affine_family": OnnxCase(_Affine)},
    ),
    OpEntry(
        name="fake_quantize_amax",
        wrapper=fakequant.ops.fake_quantize_amax,
        variants=_amax_variants("amax"),
        reference=lambda a: ref.fake_quantize_amax(*a[:5]),
        compiled=[
            ("amax per tensor", lambda x: fakequant.fake_quantize_amax(x, torch.tensor(2.5, device=x.device))),
            ("amax per channel, 4-bit unsigned", lambda x: fakequant.fake_quantize_amax(
                x, per_channel(x, [2.5, 0.0, 1e-30, 100.0]), 4, True)),
            ("amax 8-bit wide range", lambda x: fakequant.fake_quantize_amax(
                x, torch.tensor(3.0, device=x.device), 8, False, False)),
        ],
        gradcheck=[GradCheck("16 bits", _ste_amax, eps=1e-2, atol=1e-2, twice=False)],
        invalid_base=_amax_base,
        invalid=INVALID_AMAX,
        rules=rules_amax,
    ),
    OpEntry(
        name="quantize_amax",
        wrapper=fakequant.ops.quantize_amax,
        variants=_amax_variants("quantize_amax"),
        reference=lambda a: ref.quantize_amax(*a[:5]),
        # (its backward is the mask too, as pytorch-quantization's tensor_quant: not the
        # derivative of x / s, so it is not gradchecked)
        invalid_base=_amax_base,
        invalid=INVALID_AMAX,
        rules=rules_amax,
    ),
    OpEntry(
        name="fake_quantize_min_max",
        wrapper=fakequant.ops.fake_quantize_min_max,
        variants=[
            Variant("min_max", lambda x: (x, scalar(x, -2.5), scalar(x, 3.0), 4), per_tensor=True),
            Variant("min_max_8_bits", lambda x: (x, scalar(x, -0.7), scalar(x, 1.1), 8), per_tensor=True),
            Variant("min_max_per_channel", lambda x: (x, -per_channel(x, [1.0, 0.5]), per_channel(x, [2.0, 1.5]), 5)),
        ],
        reference=lambda a: ref.fake_quantize_min_max(*a[:4]),
        compiled=[("min/max", lambda x: fakequant.fake_quantize_min_max(
            x, torch.tensor(-1.0, device=x.device), torch.tensor(2.5, device=x.device), 4))],
        gradcheck=[GradCheck("16 bits", _ste_min_max, eps=1e-2, atol=1e-2, twice=False)],
        invalid_base=_min_max_base,
        invalid=INVALID_MIN_MAX,
        rules=rules_min_max,
    ),
    OpEntry(
        name="mask_backward",
        wrapper=fakequant.ops.mask_backward,
        variants=[
            Variant("mask_packed", lambda x: (x, ops.fake_quantize_amax(x.detach(), scalar(x, 1.5), 8, False,
                                                                        True)[1]), per_tensor=True),
            Variant("mask_bool", lambda x: (x, (torch.rand(x.shape, generator=torch.Generator().manual_seed(1))
                                                > 0.5).to(x.device)), per_tensor=True),
            # a contiguous gradient for a forward output laid out as x: the bits in its memory order
            Variant("mask_packed_strides", lambda x: _mask_with_strides(x)),
        ],
        reference=_ref_mask_backward,
        gradcheck=[GradCheck("packed", _gradcheck_mask(False), eps=1e-6, atol=1e-5),
                   GradCheck("bool", _gradcheck_mask(True), eps=1e-6, atol=1e-5)],
        invalid_base=_mask_base,
        invalid=INVALID_MASK,
        rules=rules_mask_backward,
    ),
    OpEntry(
        name="fake_quantize_fp8",
        wrapper=fakequant.ops.fake_quantize_fp8,
        variants=[
            Variant("fp8_e4m3", lambda x: (x, scalar(x, 3.0), 4, 3), per_tensor=True),
            Variant("fp8_e5m2", lambda x: (x, scalar(x, 3.0), 5, 2), per_tensor=True),
            Variant("fp6_e3m2", lambda x: (x, scalar(x, 3.0), 3, 2), per_tensor=True),
            Variant("fp6_e2m3", lambda x: (x, scalar(x, 3.0), 2, 3), per_tensor=True),
            Variant("fp8_e5m2_per_channel", lambda x: (x, per_channel(x, [1.3, 2.0, 0.6]), 5, 2)),
        ],
        reference=lambda a: ref.fake_quantize_fp8(*a[:4]),
        compiled=[
            ("fp8 E4M3", lambda x: fakequant.fake_quantize_fp8(x, torch.tensor(2.5, device=x.device))),
            ("fp8 E5M2 per channel", lambda x: fakequant.fake_quantize_fp8(x, per_channel(x, [2.5, 1000.0]), 5, 2)),
            ("fp6 E3M2", lambda x: fakequant.fake_quantize_fp8(x, torch.tensor(3.0, device=x.device), 3, 2)),
        ],
    ),
    OpEntry(
        name="fake_quantize_blockwise",
        wrapper=fakequant.ops.fake_quantize_blockwise,
        variants=[
            Variant("blockwise_int8_ragged", lambda x: (x, 4, 8, False, True, 0, None, True, False, False),
                    per_tensor=True, clips=False),
            # unsigned: the negative elements clip, so the mask has both values
            Variant("blockwise_uint3", lambda x: (x, 3, 3, True, False, 0, None, True, False, False), per_tensor=True),
            Variant("blockwise_nvfp4", lambda x: (x, 16, 4, False, True, 2, scalar(x, 2.0), True, False, False),
                    per_tensor=True),
            Variant("blockwise_fp8", lambda x: (x, 16, 8, False, True, 4, None, True, False, False),
                    per_tensor=True, clips=False),
            Variant("blockwise_mxfp4", lambda x: (x, 32, 4, False, True, 2, None, True, True, False), per_tensor=True),
            Variant("blockwise_centered_int8", lambda x: (x, max(x.shape[-1:] or (1,)), 8, False, False, 0, None,
                                                          True, False, True), per_tensor=True, clips=False),
        ],
        reference=_ref_blockwise,
        # (the layout is kept only where each block is contiguous in memory: fakequant/ops/blockwise.py)
        keeps_layout=False,
        compiled=[
            ("blockwise int4 blocks of 16", lambda x: fakequant.fake_quantize_blockwise(x, 16, 4)),
            ("blockwise NVFP4", lambda x: fakequant.fake_quantize_blockwise(
                x, 16, 4, exponent_bits=2, scale_amax=torch.tensor(100.0, device=x.device))),
            ("blockwise MXFP8", lambda x: fakequant.fake_quantize_blockwise(
                x, 32, 8, exponent_bits=4, e8m0_scale=True)),
            ("blockwise per token int8 centered", lambda x: fakequant.fake_quantize_blockwise(
                x, x.shape[-1], 8, narrow_range=False, centered=True)),
        ],
        onnx={"blocks_asym_e2m1": OnnxCase(lambda: _Call(lambda x: fakequant.fake_quantize_blockwise(
            x, 16, 4, exponent_bits=2, centered=True)), "fp8_block", 21, ("dynamo",), "arithmetic")},
    ),
    OpEntry(
        name="fake_quantize_ggml",
        wrapper=fakequant.ops.fake_quantize_ggml,
        variants=[
            # (the sample's last dimension is 5: blocks of 4 and a short one, one short block of 32)
            Variant("ggml_q8_0", lambda x: (x, 4, 8), per_tensor=True, clips=False),
            Variant("ggml_q4_0", lambda x: (x, 4, 4), per_tensor=True),
            Variant("ggml_q8_0_b32", lambda x: (x, 32, 8), per_tensor=True, clips=False),
            Variant("ggml_q4_0_b3", lambda x: (x, 3, 4), per_tensor=True),
        ],
        reference=lambda a: ref.fake_quantize_ggml(*a),
        keeps_layout=False,
        compiled=[
            ("ggml Q8_0", lambda x: fakequant.ops.fake_quantize_ggml(x, 32, 8)),
            ("ggml Q4_0 blocks of 4", lambda x: fakequant.ops.fake_quantize_ggml(x, 4, 4)),
        ],
        invalid_base=_ggml_base,
        invalid=INVALID_GGML,
        rules=rules_ggml,
    ),
    OpEntry(
        name="fake_quantize_lsq",
        wrapper=fakequant.ops.fake_quantize_lsq,
        variants=[
            Variant("lsq", lambda x: (x, scalar(x, 0.05), scalar(x, 2.0), None, -128, 127, 1.0), per_tensor=True),
            Variant("lsq_learned_scale", lambda x: (x, vector(x, 0.02).requires_grad_(), vector(x, 1, torch.int32),
                                                    None, -128, 127, 0.5), per_tensor=True),
            # LSQ+: a learned float zero point per channel
            Variant("lsq_per_channel", lambda x: (x, channels(x, [0.01, 0.02, 0.03]).requires_grad_(),
                                                  channels(x, [0, -2, 4]).requires_grad_(), 1, -8, 7, 1.0)),
            Variant("lsq_unsigned", lambda x: (x, vector(x, 0.02), vector(x, 1, torch.int32), None, 0, 255, 1.0),
                    per_tensor=True),
        ],
        reference=_ref_lsq,
        backward="lsq",
        onnx={
            "lsq_learned_scale": OnnxCase(_lsq_learned_scale),
            "lsq_per_channel": OnnxCase(lambda: _Call(lambda x: fakequant.fake_quantize_lsq(
                x, torch.tensor([0.01, 0.02, 0.03, 0.05]), torch.tensor([0, -5, 7, 1], dtype=torch.int32), 1,
                -128, 127)), "fp8_block", 13, ("dynamo", "torchscript"), "qdq"),
        },
    ),
    OpEntry(
        name="fake_quantize_lsq_backward",
        wrapper=None,  # no wrapper: fake_quantize_lsq's autograd formula calls it
        variants=[
            Variant("lsq_backward", lambda x: (
                torch.randn(x.shape, generator=torch.Generator().manual_seed(4), dtype=torch.float64).to(
                    x.device, x.dtype), x.detach(), scalar(x, 0.05), scalar(x, 1.0), None, -8, 7, 0.75),
                per_tensor=True),
            Variant("lsq_backward_per_channel", lambda x: (
                torch.randn(x.shape, generator=torch.Generator().manual_seed(4), dtype=torch.float64).to(
                    x.device, x.dtype), x.detach(), channels(x, [0.01, 0.02, 0.03]),
                channels(x, [0, -2, 4], torch.int32), 1, -8, 7, 0.25)),
            Variant("lsq_backward_unsigned", lambda x: (
                torch.randn(x.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64).to(
                    x.device, x.dtype), x.detach(), vector(x, 0.02), vector(x, 1, torch.int32), None, 0, 255, 1.0),
                per_tensor=True),
        ],
        reference=_ref_lsq_backward,
        backward=None,
        reduced_outputs=(1, 2),  # grad_scale, grad_zero_point
    ),
    OpEntry(
        name="fused_moving_avg_obs_fake_quant",
        wrapper=fakequant.ops.fused_moving_avg_obs_fake_quant,
        variants=[
            Variant("fused_observer", lambda x: (x.detach(), torch.tensor([1], device=x.device),
                                                 torch.tensor([1], device=x.device), *fused_buffers(x, 1),
                                                 0.01, 0, 255, 0, False, False), per_tensor=True),
            Variant("fused_observer_per_channel", lambda x: (x.detach(), torch.tensor([1], device=x.device),
                                                             torch.tensor([0], device=x.device),
                                                             *fused_buffers(x, x.shape[1]),
                                                             0.01, -128, 127, 1, True, True)),
        ],
        no_reference="torch's operator, with its buffers updated in place: tests/test_ao_flows.py and "
                     "test_torch_family.py compare it with torch's",
        backward=None,  # (its autograd is an autograd.Function in fakequant/ops/observer.py)
        stateful=True,
    ),
]

OPS: Dict[str, OpEntry] = {e.name: e for e in TABLE}
assert len(OPS) == len(TABLE), "one entry per operator"


def variants(where: Callable[[OpEntry, Variant], bool] = lambda e, v: True):
    """(entry, variant) pairs, in table order."""
    return [(e, v) for e in TABLE for v in e.variants if where(e, v)]


def variant_ids(pairs) -> List[str]:
    return [v.name for _, v in pairs]


def compiled_calls():
    """(name, fn(x) -> y) of every public call that test_compiled runs."""
    return [c for e in TABLE for c in e.compiled]


def invalid_cases():
    """(entry, Invalid) pairs."""
    return [(e, case) for e in TABLE for case in e.invalid]


def invalid_ids(pairs) -> List[str]:
    return [_invalid_id(e, c) for e, c in pairs]


def _invalid_id(entry, case) -> str:
    changes = ",".join(f"{k}={_short(v)}" for k, v in case.changes.items())
    return f"{entry.name}-{changes}"


def _short(v):
    if isinstance(v, torch.Tensor):
        kind = "meta " if v.device.type == "meta" else ""
        text = f"{kind}{str(v.dtype).replace('torch.', '')}{list(v.shape)}"
        if v.numel() <= 3 and v.device.type != "meta":
            text += ":" + "/".join(f"{e:g}" if isinstance(e, float) else str(e) for e in v.reshape(-1).tolist())
        return text
    return str(v)


def violations(entry: OpEntry, args: tuple) -> set:
    """The names of the arguments of ``args`` that break the entry's rules (which read
    the operator's leading arguments)."""
    return entry.rules(*args[:len(inspect.signature(entry.rules).parameters)])


def to_device(value, device):
    """A CPU tensor argument moved to ``device`` (strides kept); anything else as it is."""
    if isinstance(value, torch.Tensor) and value.device.type == "cpu":
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=device).copy_(value)
    return value


def gradcheck_cases():
    return [(e, c) for e in TABLE for c in e.gradcheck]


def gradcheck_ids(pairs) -> List[str]:
    return [f"{e.name}-{c.name}" for e, c in pairs]


def onnx_cases(inputs: str) -> Dict[str, OnnxCase]:
    """The operators' ONNX cases that take ``inputs``, by name."""
    out = {}
    for e in TABLE:
        for name, case in e.onnx.items():
            if case.inputs == inputs:
                assert name not in out, f"two ONNX cases named {name}"
                out[name] = case
    return out


def expected(entry: OpEntry, args: tuple):
    """The entry's reference outputs for ``args``: (y, bool mask or None)."""
    return entry.reference(args)


def check_against_reference(entry: OpEntry, args: tuple, out, assert_same, bits_equal, what=""):
    """The operator's outputs ``out`` for ``args`` equal the reference, bit for bit."""
    y = out if isinstance(out, torch.Tensor) else out[0]
    ey, emask = expected(entry, args)
    assert_same(y, ey)
    if emask is not None and not isinstance(out, torch.Tensor):
        assert bits_equal(_unpacked(y, out[1]).cpu(), emask.cpu()), f"{what}: mask"

