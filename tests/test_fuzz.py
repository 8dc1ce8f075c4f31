"""A hypothesis campaign over every public operator and function: random shapes,
strides, dtypes, devices and parameters, valid and invalid. Every call either
matches the plain-PyTorch reference (reference.py), bit for bit with the mask and
the gradient, or raises ValueError/TypeError/IndexError naming the argument.

Which calls are valid is decided from the arguments actually built, by the rules
the README states (each operator's ``rules`` in tests/op_table.py), so an argument that is invalid by
accident (an integer zero point rounded by float32, a float64 scale that is 0 as
float32) is caught as well as the deliberate mutations.

The regular suite runs a small, derandomized sample (FUZZ_DEFAULT examples per
test); ``make fuzz`` sets FAKEQUANT_FUZZ_EXAMPLES (examples per test, random
seeds) for at least 10,000 cases and prints the count (FAKEQUANT_FUZZ_COUNT_FILE).
"""
import json
import math
import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fakequant
import op_table
from conftest import DEVICES, assert_same, bits_equal
from fakequant import tensor_quant
from fakequant.nn import _input_amax
from fakequant.tensor_quant import QuantDescriptor
from fakequant.utils import reduce_amax
from op_table import FLOATS, INT32_MAX, INT32_MIN

ops = torch.ops.fakequant

FUZZ_DEFAULT = 30
EXAMPLES = int(os.environ.get("FAKEQUANT_FUZZ_EXAMPLES", "0"))
settings.register_profile(
    "fakequant-ci", max_examples=FUZZ_DEFAULT, deadline=None, derandomize=True, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
# Random seeds when run by hand (`make fuzz` explores); fixed under CI=true, so that
# a submission lands or fails on its own merits, and any failure replays exactly.
settings.register_profile(
    "fakequant-fuzz", max_examples=max(EXAMPLES, 1), deadline=None, derandomize=bool(os.environ.get("CI")),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
FUZZ = settings.get_profile("fakequant-fuzz" if EXAMPLES else "fakequant-ci")

NOT_FLOATS = [torch.int32, torch.int64, torch.uint8, torch.bool, torch.complex64]
CLEAN = (ValueError, TypeError, IndexError)

# Cases run per test, and how many were valid: written for `make fuzz`.
COUNTS = {}


def count(test, valid):
    c = COUNTS.setdefault(test, {"cases": 0, "valid": 0, "invalid": 0})
    c["cases"] += 1
    c["valid" if valid else "invalid"] += 1


@pytest.fixture(scope="module", autouse=True)
def _write_counts():
    yield
    path = os.environ.get("FAKEQUANT_FUZZ_COUNT_FILE")
    if path:
        total = {k: sum(c[k] for c in COUNTS.values()) for k in ("cases", "valid", "invalid")}
        with open(path, "w") as f:
            json.dump({"total": total, "per_test": COUNTS}, f, indent=1)


# --- tensors --------------------------------------------------------------------------


LAYOUTS = ["contiguous", "permuted", "sliced", "expanded", "offset", "channels_last"]


def _values(shape, gen, mode, spread):
    n = math.prod(shape)
    if mode == "grid":  # exact ties for power-of-two steps
        k = torch.randint(-300, 300, (n,), generator=gen).double()
        half = torch.randint(0, 2, (n,), generator=gen).double() * 0.5
        v = (k + half) * spread
    else:
        v = torch.randn(n, generator=gen, dtype=torch.float64) * spread
    if mode == "special" and n:
        specials = torch.tensor([math.nan, math.inf, -math.inf, 0.0, -0.0, 1e-30, 6e4, -1e38], dtype=torch.float64)
        pick = torch.randint(0, 3, (n,), generator=gen) == 0
        idx = torch.randint(0, specials.numel(), (n,), generator=gen)
        v = torch.where(pick, specials[idx], v)
    return v.reshape(shape)


@st.composite
def tensors(draw, dtype=None, shape=None, device=None, layouts=LAYOUTS, modes=("normal", "grid", "special")):
    """A tensor of a random shape, dtype, layout and values (NaN, inf, ties)."""
    dtype = dtype if dtype is not None else draw(st.sampled_from(FLOATS))
    device = device if device is not None else draw(st.sampled_from(DEVICES))
    if shape is None:
        shape = tuple(draw(st.lists(st.integers(0, 5), min_size=0, max_size=4)))
        if draw(st.integers(0, 9)) == 0 and shape:
            shape = shape[:-1] + (draw(st.integers(30, 300)),)  # some long rows (vector loops, several bytes)
    mode = draw(st.sampled_from(modes))
    spread = draw(st.sampled_from([2.0**-7, 2.0**-3, 1.0, 2.0, 2.0**6, 2.0**12])) if mode == "grid" else \
        draw(st.sampled_from([1e-6, 0.05, 1.0, 3.0, 100.0, 1e5]))
    layout = draw(st.sampled_from(layouts))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    nd = len(shape)

    def cast(v):
        if dtype.is_floating_point:
            return v.to(dtype)
        if dtype == torch.bool:
            return v > 0
        if dtype.is_complex:
            return v.to(dtype)
        return v.clamp(-100, 100).to(dtype)

    if layout == "permuted" and nd >= 2:
        perm = draw(st.permutations(range(nd)))
        inv = [perm.index(i) for i in range(nd)]
        base = cast(_values(tuple(shape[p] for p in perm), gen, mode, spread))
        t = base.permute(inv)
    elif layout == "sliced" and nd >= 1:
        big = tuple(2 * s + 1 for s in shape)
        t = cast(_values(big, gen, mode, spread))[tuple(slice(1, None, 2) for _ in shape)]
    elif layout == "expanded" and nd >= 1:
        small = tuple(1 if draw(st.booleans()) else s for s in shape)
        t = cast(_values(small, gen, mode, spread)).expand(shape)
    elif layout == "offset":
        flat = cast(_values((math.prod(shape) + 1,), gen, mode, spread))
        t = flat[1:].view(shape)
    elif layout == "channels_last" and nd == 4:
        t = cast(_values(shape, gen, mode, spread)).contiguous(memory_format=torch.channels_last)
    else:
        t = cast(_values(shape, gen, mode, spread))
    assert t.shape == shape
    return t.to(device)


def is_dense(t):
    """Non-overlapping and dense: some permutation of t is contiguous."""
    dims = sorted((d for d in range(t.dim()) if t.shape[d] != 1), key=t.stride)
    expected = 1
    for d in dims:
        if t.stride(d) != expected:
            return False
        expected *= t.shape[d]
    return True


def check_layout(y, x):
    if x.numel() > 1 and is_dense(x):
        big = [d for d in range(x.dim()) if x.shape[d] != 1]
        assert [y.stride(d) for d in big] == [x.stride(d) for d in big], "a dense input keeps its layout"


def expect_error(call, names):
    """``call()`` raises ValueError/TypeError/IndexError naming one of ``names``."""
    with pytest.raises(CLEAN) as info:
        call()
    message = str(info.value)
    assert any(n in message for n in names), f"{message!r} names none of {sorted(names)}"


# CUDA checks parameter values only with FAKEQUANT_CHECK_VALUES=1 (a device sync);
# otherwise an invalid value gives NaN outputs (README, CUDA).
CUDA_VALUE_CHECKS = os.environ.get("FAKEQUANT_CHECK_VALUES", "").lower() in ("1", "true", "on", "yes")


def expect_rejected(call, bad, device):
    """The arguments break the rules ``bad`` names ("value:..." for parameter values)."""
    if device.type == "cuda" and not CUDA_VALUE_CHECKS and all(n.startswith("value:") for n in bad):
        call()  # no exception, NaN where the parameter is invalid
        return
    expect_error(call, {n.split(":")[-1] for n in bad})


def grad_check(fn, x, expected_mask, pass_through=False):
    """The backward of ``fn`` at ``x``: the incoming gradient where the mask is set, else 0."""
    xr = x.detach().clone().requires_grad_()
    y = fn(xr)
    g = torch.randn(y.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(3)).to(y.device, y.dtype)
    (gx,) = torch.autograd.grad(y, xr, g)
    expected = g if pass_through else torch.where(expected_mask.to(g.device), g, torch.zeros_like(g))
    assert_same(gx, expected)


# --- the operators: their rules (which arguments are invalid, and their names) and references --------

AFFINE, AMAX, QUANTIZE_AMAX, MIN_MAX, MASK, FP8, BLOCKWISE, LSQ, LSQ_BACKWARD = (op_table.OPS[name] for name in (
    "fake_quantize_affine", "fake_quantize_amax", "quantize_amax", "fake_quantize_min_max", "mask_backward",
    "fake_quantize_fp8", "fake_quantize_blockwise", "fake_quantize_lsq", "fake_quantize_lsq_backward"))


# --- parameters -------------------------------------------------------------------------


RANGES = [(-128, 127), (0, 255), (-127, 127), (-8, 7), (0, 15), (-2, 1), (0, 1), (5, 5), (-32768, 32767),
          (0, 65535), (INT32_MIN, INT32_MAX), (-(2**24), 2**24)]


@st.composite
def quant_range(draw):
    if draw(st.booleans()):
        return draw(st.sampled_from(RANGES))
    lo = draw(st.integers(-(2**20), 2**20))
    return lo, lo + draw(st.integers(0, 2**12))


def param_tensor(values, dtype, device, shape=None):
    t = torch.tensor(values, dtype=torch.float64)
    if shape is not None:
        t = t.reshape(shape)
    return t.to(device, dtype)


@st.composite
def affine_case(draw):
    x = draw(tensors())
    device = x.device
    axis = None if x.dim() == 0 or draw(st.booleans()) else draw(st.integers(-x.dim(), x.dim() - 1))
    channels = 1 if axis is None else x.shape[axis]
    qmin, qmax = draw(quant_range())
    scale_dtype = draw(st.sampled_from([torch.float32, torch.float32, torch.float64, torch.float16, torch.bfloat16]))
    # Scales that make ties exact (powers of two) and any others.
    scales = [draw(st.one_of(st.sampled_from([2.0**-8, 2.0**-4, 0.5, 1.0, 4.0]),
                             st.floats(1e-3, 10.0), st.floats(1e-30, 1e30)))
              for _ in range(channels)]
    # Zero points: integers in the range, exact in float32 (the reference adds in float32).
    zlo, zhi = max(qmin, -(2**24)), min(qmax, 2**24)
    zps = [draw(st.integers(zlo, zhi)) if zlo <= zhi else 0 for _ in range(channels)]
    zp_dtype = draw(st.sampled_from([torch.int32, torch.int64, torch.float32, torch.float64, torch.int16]))
    if zp_dtype == torch.int16:
        zps = [min(max(z, -32768), 32767) for z in zps]
    per_tensor_shape = draw(st.sampled_from([(), (1,)])) if axis is None else None
    scale = param_tensor(scales, scale_dtype, device, per_tensor_shape)
    zp = param_tensor(zps, zp_dtype, device, per_tensor_shape)

    mutation = draw(st.sampled_from([None] * 6 + [
        "scale_zero", "scale_negative", "scale_nan", "scale_inf", "scale_tiny_double", "scale_int", "scale_size",
        "zp_fraction", "zp_out_of_range", "zp_bool", "zp_size", "range_inverted", "range_too_wide",
        "axis_out_of_range", "input_dtype", "scale_meta", "zp_meta"]))
    if channels == 0 and mutation in ("scale_zero", "scale_negative", "scale_nan", "scale_inf", "scale_tiny_double",
                                      "zp_fraction", "zp_out_of_range"):
        mutation = None  # no value to break
    if mutation and mutation.startswith("scale_") and mutation not in ("scale_int", "scale_size", "scale_meta"):
        value = {"scale_zero": 0.0, "scale_negative": -0.5, "scale_nan": math.nan, "scale_inf": math.inf,
                 "scale_tiny_double": 1e-50}[mutation]
        scale = scale.double() if mutation == "scale_tiny_double" else scale.clone()
        scale.view(-1)[draw(st.integers(0, scale.numel() - 1))] = value
    elif mutation == "scale_int":
        scale = scale.to(torch.int32)
    elif mutation == "scale_size":
        scale = torch.ones(channels + draw(st.integers(1, 3)), device=device)
    elif mutation == "zp_fraction":
        zp = zp.double()
        zp.view(-1)[0] += 0.5
    elif mutation == "zp_out_of_range":
        zp = zp.to(torch.int64)
        zp.view(-1)[0] = qmax + 1 if draw(st.booleans()) else qmin - 1
    elif mutation == "zp_bool":
        zp = zp != 0
    elif mutation == "zp_size":
        zp = torch.zeros(channels + draw(st.integers(1, 3)), dtype=torch.int32, device=device)
    elif mutation == "range_inverted":
        qmin, qmax = qmax + 1, qmin
    elif mutation == "range_too_wide":
        qmin, qmax = (INT32_MIN - 1, qmax) if draw(st.booleans()) else (qmin, INT32_MAX + 1)
    elif mutation == "axis_out_of_range":
        axis = draw(st.sampled_from([x.dim(), x.dim() + 2, -x.dim() - 1]))
        scale = torch.ones(1, device=device)
        zp = torch.zeros(1, dtype=torch.int32, device=device)
    elif mutation == "input_dtype":
        x = draw(tensors(dtype=draw(st.sampled_from(NOT_FLOATS)), shape=tuple(x.shape), device=device))
    elif mutation == "scale_meta":
        scale = scale.to("meta")
    elif mutation == "zp_meta":
        zp = zp.to("meta")
    return x, scale, zp, axis, qmin, qmax, mutation


@given(case=affine_case(), pack=st.booleans(), wrapper=st.sampled_from(["op", "affine", "per_tensor_or_channel",
                                                                     "numbers"]))
@FUZZ
def test_fuzz_affine(case, pack, wrapper):
    x, scale, zp, axis, qmin, qmax, mutation = case
    numbers = None
    if wrapper == "numbers" and axis is None and scale.numel() == 1 and zp.numel() == 1 \
            and "meta" not in (scale.device.type, zp.device.type) and not zp.dtype.is_floating_point \
            and zp.dtype != torch.bool and INT32_MIN <= int(zp.reshape(())) <= INT32_MAX:
        # Python numbers for the per-tensor parameters; the wrapper makes them a
        # float32 and an int32 tensor. (Fractional or huge Python zero points: see
        # test_wrapper_gap_*.)
        numbers = float(scale.reshape(())), int(zp.reshape(()))
        scale = torch.tensor(numbers[0], dtype=torch.float32, device=x.device)
        zp = torch.tensor(numbers[1], dtype=torch.int32, device=x.device)
        mutation = None
    bad = AFFINE.rules(x, scale, zp, axis, qmin, qmax)
    assert bad or mutation is None, f"the mutation {mutation} left the arguments valid"
    count("affine", not bad)

    if wrapper == "op" or not pack:
        def call():
            return ops.fake_quantize_affine(x, scale, zp, axis, qmin, qmax, pack)
    elif wrapper == "affine":
        def call():
            return fakequant.fake_quantize_affine(x, scale, zp, axis, qmin, qmax), None
    elif wrapper == "per_tensor_or_channel":
        def call():
            if axis is None:
                return fakequant.fake_quantize_per_tensor_affine(x, scale, zp, qmin, qmax), None
            if zp.dtype.is_floating_point or scale.dtype not in (torch.float32, torch.bfloat16):
                # (torch's per-channel function takes a floating-point zero point by torch's
                # rule for it, and refuses the scale dtypes torch refuses:
                # tests/test_torch_contract.py; the contract's rule here)
                return fakequant.fake_quantize_affine(x, scale, zp, axis, qmin, qmax), None
            return fakequant.fake_quantize_per_channel_affine(x, scale, zp, axis, qmin, qmax), None
    else:
        def call():
            if numbers is not None:
                return fakequant.fake_quantize_affine(x, *numbers, None, qmin, qmax), None
            return fakequant.fake_quantize_affine(x, scale, zp, axis, qmin, qmax), None

    if bad:
        expect_rejected(call, bad, x.device)
        return
    y, mask = call()
    ey, emask = AFFINE.reference((x, scale, zp, axis, qmin, qmax))
    assert_same(y, ey)
    check_layout(y, x)
    if mask is not None:
        if pack:
            assert mask.dtype == torch.uint8 and mask.shape == ((x.numel() + 7) // 8,)
            assert bits_equal(fakequant.unpack_mask(mask, y).cpu(), emask.cpu())
        else:
            assert mask.dtype == torch.bool and bits_equal(mask.cpu(), emask.cpu())
    if wrapper == "affine" and x.numel() < 2000:
        grad_check(lambda t: fakequant.fake_quantize_affine(t, scale, zp, axis, qmin, qmax), x, emask)


@st.composite
def amax_case(draw):
    x = draw(tensors())
    device = x.device
    # amax: one value, or a shape that broadcasts to x (size 1 or x's size per trailing axis)
    nd = draw(st.integers(0, x.dim()))
    shape = tuple(1 if draw(st.booleans()) else s for s in x.shape[x.dim() - nd:])
    kind = draw(st.sampled_from(["normal", "normal", "zero", "tiny", "huge"]))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    a = torch.rand(shape, generator=gen, dtype=torch.float64) * draw(st.sampled_from([0.01, 1.0, 3.0, 1e4]))
    if kind == "zero":
        a = torch.where(torch.rand(shape, generator=gen) < 0.5, 0.0, a)
    elif kind == "tiny":
        a = torch.where(torch.rand(shape, generator=gen) < 0.5, draw(st.sampled_from([2.0**-25, 2.0**-24, 1e-45])), a)
    elif kind == "huge":
        a = a * 1e30
    if draw(st.booleans()) and a.numel() > 0:
        a.view(-1)[0] = draw(st.sampled_from([127 * 2.0**-4, 7 * 2.0**-3, 1.0, 2.0]))  # exact ties
    amax = a.to(device, draw(st.sampled_from([torch.float32, torch.float32, torch.float64, torch.float16,
                                               torch.bfloat16])))
    num_bits = draw(st.integers(2, 16))
    unsigned, narrow = draw(st.booleans()), draw(st.booleans())
    mutation = draw(st.sampled_from([None] * 6 + ["amax_negative", "amax_nan", "amax_inf", "amax_huge_double",
                                                  "amax_int", "amax_shape", "amax_too_many_dims", "num_bits_low",
                                                  "num_bits_high", "input_dtype", "amax_meta"]))
    if mutation in ("amax_negative", "amax_nan", "amax_inf", "amax_huge_double"):
        amax = amax.double() if mutation == "amax_huge_double" else amax.clone()
        value = {"amax_negative": -1.0, "amax_nan": math.nan, "amax_inf": math.inf, "amax_huge_double": 1e300}[mutation]
        if amax.numel() == 0:
            amax = torch.tensor(value, device=device)
        else:
            amax.view(-1)[draw(st.integers(0, amax.numel() - 1))] = value
    elif mutation == "amax_int":
        amax = amax.to(torch.int64)
    elif mutation == "amax_shape":
        if x.dim() == 0:
            amax = torch.ones(2, device=device)
        else:
            d = draw(st.integers(0, x.dim() - 1))
            s = list(x.shape)
            s[d] = 2 if s[d] in (0, 1) else s[d] + 1
            amax = torch.ones(s, device=device)
    elif mutation == "amax_too_many_dims":
        amax = torch.ones((1,) * (x.dim() + 1) if draw(st.booleans()) else (2,) + tuple(x.shape), device=device)
    elif mutation == "num_bits_low":
        num_bits = draw(st.sampled_from([1, 0, -3, -(2**40)]))
    elif mutation == "num_bits_high":
        num_bits = draw(st.sampled_from([17, 31, 64, 2**40]))
    elif mutation == "input_dtype":
        x = draw(tensors(dtype=draw(st.sampled_from(NOT_FLOATS)), shape=tuple(x.shape), device=device))
    elif mutation == "amax_meta":
        amax = amax.to("meta")
    return x, amax, num_bits, unsigned, narrow, mutation


@given(case=amax_case(), wrapper=st.sampled_from(["op", "quantize_op", "fake_quantize_amax", "pass_through",
                                                   "quantize_amax", "fake_tensor_quant", "tensor_quant", "number",
                                                   "legacy_fake_tensor_quant", "FakeTensorQuantFunction"]))
@FUZZ
def test_fuzz_amax(case, wrapper):
    x, amax, num_bits, unsigned, narrow, mutation = case
    a_arg = amax
    if wrapper == "number" and amax.dim() == 0 and amax.device.type != "meta" and amax.dtype.is_floating_point:
        a_arg = float(amax)  # the wrapper makes it a float32 tensor
        amax = torch.tensor(a_arg, dtype=torch.float32, device=x.device)
    bad = AMAX.rules(x, amax, num_bits)
    assert bad or mutation is None or a_arg is not amax, f"the mutation {mutation} left the arguments valid"
    count("amax", not bad)
    args = (num_bits, unsigned, narrow)
    quantize = wrapper in ("quantize_op", "quantize_amax", "tensor_quant")

    def call():
        if wrapper == "op":
            return ops.fake_quantize_amax(x, amax, *args)
        if wrapper == "quantize_op":
            return ops.quantize_amax(x, amax, *args)
        if wrapper in ("fake_quantize_amax", "number"):
            return fakequant.fake_quantize_amax(x, a_arg, *args), None
        if wrapper == "pass_through":
            return fakequant.fake_quantize_amax(x, amax, *args, pass_through=True), None
        if wrapper == "quantize_amax":
            return fakequant.quantize_amax(x, amax, *args)
        if wrapper == "fake_tensor_quant":
            return tensor_quant.fake_tensor_quant(x, amax, *args), None
        if wrapper == "legacy_fake_tensor_quant":
            return tensor_quant.legacy_fake_tensor_quant(x, amax, *args), None
        if wrapper == "FakeTensorQuantFunction":
            return tensor_quant.FakeTensorQuantFunction.apply(x, amax, *args), None
        return tensor_quant.tensor_quant(x, amax, *args)

    if bad:
        expect_rejected(call, bad, x.device)
        return
    a32 = amax.float()
    bound = float(2 ** (num_bits - 1 + unsigned) - 1)
    # pytorch-quantization's scale, max_bound / amax with max_bound a tensor: rounded once
    escale = torch.where(a32 <= 2.0**-24, torch.ones_like(a32), torch.full_like(a32, bound) / a32)
    if wrapper == "tensor_quant" and x.dtype == torch.float16 and x.device.type == "cpu" \
            and bool((escale > 65504).any()):
        expect_error(call, {"scale"})  # bound / amax overflows float16: tensor_quant says so
        return
    y, second = call()
    assert fakequant.amax_bound(num_bits, unsigned) == bound
    ey, emask = (QUANTIZE_AMAX if quantize else AMAX).reference((x, amax, num_bits, unsigned, narrow))
    assert_same(y, ey)
    check_layout(y, x)
    if wrapper in ("op", "quantize_op"):
        assert bits_equal(fakequant.unpack_mask(second, y).cpu(), emask.cpu())
    elif wrapper in ("quantize_amax", "tensor_quant"):
        assert_same(second, escale.to(x.dtype) if wrapper == "tensor_quant" else escale)
    if wrapper in ("fake_quantize_amax", "pass_through") and x.numel() < 2000:
        grad_check(lambda t: fakequant.fake_quantize_amax(t, amax, *args, pass_through=wrapper == "pass_through"),
                   x, emask, pass_through=wrapper == "pass_through")


@st.composite
def min_max_case(draw):
    x = draw(tensors())
    device = x.device
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    shapes = []
    for _ in range(2):
        nd = draw(st.integers(0, x.dim()))
        shapes.append(tuple(1 if draw(st.booleans()) else s for s in x.shape[x.dim() - nd:]))
    spread = draw(st.sampled_from([0.01, 1.0, 10.0, 1e4]))
    lo = -torch.rand(shapes[0], generator=gen, dtype=torch.float64) * spread
    if draw(st.booleans()):
        lo = lo + spread * draw(st.sampled_from([-1.0, 0.5, 2.0]))  # ranges that do not hold 0
    width = torch.rand(shapes[1], generator=gen, dtype=torch.float64) * spread + spread * 1e-3
    hi = torch.broadcast_to(lo.amax() if lo.numel() else torch.tensor(0.0, dtype=torch.float64), shapes[1]) + width
    dtype = draw(st.sampled_from([torch.float32, torch.float32, torch.float64, torch.float16]))
    lo, hi = lo.to(device, dtype), hi.to(device, dtype)
    num_bits = draw(st.integers(2, 16))
    mutation = draw(st.sampled_from([None] * 6 + ["empty_range", "inverted", "inf", "nan", "int_range",
                                                  "shape", "num_bits", "input_dtype", "meta"]))
    if mutation in ("empty_range", "inverted", "inf", "nan") and (lo.numel() == 0 or hi.numel() == 0):
        # (an empty range tensor broadcasts to an empty shape: no value to break)
        lo, hi = torch.tensor(-1.0, device=device), torch.tensor(1.0, device=device)
    if mutation == "empty_range":
        lo = hi.clone()
    elif mutation == "inverted":
        lo, hi = hi, lo  # every max_range below every min_range
    elif mutation in ("inf", "nan"):
        hi = hi.clone()
        hi.view(-1)[draw(st.integers(0, hi.numel() - 1))] = math.inf if mutation == "inf" else math.nan
    elif mutation == "int_range":
        lo = lo.to(torch.int32)
    elif mutation == "shape":
        hi = torch.ones((2,) * (x.dim() + 1), device=device)
    elif mutation == "num_bits":
        num_bits = draw(st.sampled_from([0, 1, 17, 100]))
    elif mutation == "input_dtype":
        x = draw(tensors(dtype=draw(st.sampled_from(NOT_FLOATS)), shape=tuple(x.shape), device=device))
    elif mutation == "meta":
        lo = lo.to("meta")
    return x, lo, hi, num_bits, mutation


@given(case=min_max_case(), wrapper=st.sampled_from(["op", "fake_quantize_min_max", "fake_affine_tensor_quant"]))
@FUZZ
def test_fuzz_min_max(case, wrapper):
    x, lo, hi, num_bits, mutation = case
    bad = MIN_MAX.rules(x, lo, hi, num_bits)
    assert bad or mutation is None, f"the mutation {mutation} left the arguments valid"
    count("min_max", not bad)

    def call():
        if wrapper == "op":
            return ops.fake_quantize_min_max(x, lo, hi, num_bits)
        if wrapper == "fake_quantize_min_max":
            return fakequant.fake_quantize_min_max(x, lo, hi, num_bits), None
        return tensor_quant.fake_affine_tensor_quant(x, lo, hi, num_bits), None

    if bad:
        expect_rejected(call, bad, x.device)
        return
    y, mask = call()
    ey, emask = MIN_MAX.reference((x, lo, hi, num_bits))
    assert_same(y, ey)
    check_layout(y, x)
    if mask is not None:
        assert bits_equal(fakequant.unpack_mask(mask, y).cpu(), emask.cpu())
    elif x.numel() < 2000:
        grad_check(lambda t: fakequant.fake_quantize_min_max(t, lo, hi, num_bits), x, emask)


@st.composite
def mask_case(draw):
    grad = draw(tensors())
    device = grad.device
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    n = grad.numel()
    if draw(st.booleans()):
        mask = (torch.rand(tuple(grad.shape), generator=gen) > 0.4)
        if draw(st.booleans()) and mask.dim() >= 2:
            mask = mask.transpose(0, -1).contiguous().transpose(0, -1)  # another layout
        mask = mask.to(device)
    else:
        mask = torch.randint(0, 256, ((n + 7) // 8,), generator=gen, dtype=torch.uint8).to(device)
    mutation = draw(st.sampled_from([None] * 4 + ["bool_shape", "packed_size", "packed_2d", "mask_dtype",
                                                  "grad_dtype", "meta"]))
    if mutation == "bool_shape":
        mask = torch.ones(tuple(grad.shape) + (2,), dtype=torch.bool, device=device)
    elif mutation == "packed_size":
        mask = torch.zeros((n + 7) // 8 + draw(st.sampled_from([1, 2, 9])), dtype=torch.uint8, device=device)
    elif mutation == "packed_2d":
        mask = torch.zeros(1, (n + 7) // 8, dtype=torch.uint8, device=device)
    elif mutation == "mask_dtype":
        mask = torch.zeros((n + 7) // 8, dtype=draw(st.sampled_from([torch.int32, torch.float32, torch.int8])),
                           device=device)
    elif mutation == "grad_dtype":
        grad = draw(tensors(dtype=draw(st.sampled_from(NOT_FLOATS)), shape=tuple(grad.shape), device=device))
    elif mutation == "meta":
        mask = mask.to("meta")
    return grad, mask, mutation


@given(case=mask_case(), wrapper=st.sampled_from(["op", "mask_backward", "fake_quant_grad"]))
@FUZZ
def test_fuzz_mask_backward(case, wrapper):
    grad, mask, mutation = case
    bad = MASK.rules(grad, mask)
    assert bad or mutation is None, f"the mutation {mutation} left the arguments valid"
    count("mask_backward", not bad)
    fn = {"op": ops.mask_backward, "mask_backward": fakequant.mask_backward,
          "fake_quant_grad": fakequant.fake_quant_grad}[wrapper]
    if bad:
        expect_rejected(lambda: fn(grad, mask), bad, grad.device)
        return
    out = fn(grad, mask)
    # Bit i of a packed mask belongs to element i, in memory order, of the output.
    assert_same(out, MASK.reference((grad, mask))[0])


@given(x=tensors(), data=st.data())
@FUZZ
def test_fuzz_fake_quant_onnxruntime_contract(x, data):
    qmin, qmax = data.draw(st.sampled_from(RANGES[:8]))
    scale = data.draw(st.one_of(st.floats(1e-3, 10.0), st.sampled_from([2.0**-4, 0.5])))
    zp = data.draw(st.integers(qmin, qmax))
    count("fake_quant", True)
    y, mask = fakequant.fake_quant(x, scale, zp, qmin, qmax)
    ey, emask = AFFINE.reference((x, torch.tensor(scale, dtype=torch.float32), torch.tensor(zp), None, qmin, qmax))
    assert_same(y, ey)
    assert mask.dtype == torch.bool and bits_equal(mask.cpu(), emask.cpu())
    dy = torch.randn(x.shape, dtype=torch.float64).to(x.device, x.dtype)
    assert_same(fakequant.fake_quant_grad(dy, mask), torch.where(emask, dy, torch.zeros_like(dy)))


# --- descriptors, quantizers, helpers ---------------------------------------------------


ANY_VALUE = st.one_of(st.none(), st.booleans(), st.integers(-20, 20), st.floats(allow_nan=True),
                      st.text(max_size=5), st.lists(st.integers(-3, 3), max_size=3),
                      st.tuples(st.integers(-3, 5), st.integers(-3, 5)))
DESC_KEYS = {
    "num_bits": st.one_of(st.integers(1, 17), st.sampled_from([(4, 3), (5, 2), [4, 3]]), ANY_VALUE),
    "axis": st.one_of(st.none(), st.integers(-3, 2), st.tuples(st.integers(-2, 1)), ANY_VALUE),
    "amax": st.one_of(st.floats(0, 10), st.lists(st.floats(-1, 5), min_size=1, max_size=3), ANY_VALUE),
    "unsigned": st.one_of(st.booleans(), ANY_VALUE),
    "narrow_range": st.one_of(st.booleans(), ANY_VALUE),
    "learn_amax": st.one_of(st.booleans(), ANY_VALUE),
    "scale_amax": st.one_of(st.floats(-1, 4), ANY_VALUE),
    "calib_method": st.one_of(st.sampled_from(["max", "histogram", "entropy"]), ANY_VALUE),
    "dynamic": st.one_of(st.booleans(), ANY_VALUE),
    "fake_quant": st.one_of(st.booleans(), ANY_VALUE),
    "block_sizes": st.one_of(st.none(), st.dictionaries(st.one_of(st.integers(-2, 1), st.sampled_from(["type"])),
                                                        st.one_of(st.integers(-1, 4), st.none(),
                                                                  st.sampled_from(["static", "dynamic"])),
                                                        max_size=2)),
    "name": st.one_of(st.none(), st.text(max_size=5), st.integers()),
    "bogus": st.integers(),
}


@given(kwargs=st.fixed_dictionaries({}, optional=DESC_KEYS),
       x=tensors(dtype=torch.float32, device="cpu", modes=("normal", "grid")))
@FUZZ
def test_fuzz_descriptor_and_quantizer(kwargs, x):
    """A descriptor from random keyword arguments either builds (and round-trips
    through YAML) or raises TypeError/ValueError/NotImplementedError; a quantizer
    built from it quantizes as the operator does, or raises one of them."""
    try:
        desc = QuantDescriptor(**kwargs)
    except (TypeError, ValueError) as e:
        count("descriptor", False)
        assert str(e)
        return
    count("descriptor", True)
    assert QuantDescriptor.from_yaml(desc.to_yaml()) == desc
    try:
        q = fakequant.nn.TensorQuantizer(desc)
        y = q(x)
    except (TypeError, ValueError, NotImplementedError, IndexError) as e:
        assert str(e)
        return
    assert y.shape == x.shape and y.dtype == x.dtype
    if desc.fake_quant and desc.block_sizes is None and not desc.learn_amax and q.amax is not None \
            and not desc.dynamic and isinstance(desc.num_bits, int):
        amax = q.amax if desc.scale_amax is None else q.amax * desc.scale_amax
        amax = _input_amax.broadcastable(q.spec, amax, x)
        assert_same(y, AMAX.reference((x, amax, desc.num_bits, desc.unsigned, desc.narrow_range))[0])


@given(x=tensors(device="cpu", modes=("normal", "special")),
       axis=st.one_of(st.none(), st.integers(-5, 5), st.lists(st.integers(-5, 5), max_size=3), ANY_VALUE),
       keepdims=st.booleans())
@FUZZ
def test_fuzz_reduce_amax(x, axis, keepdims):
    try:
        out = reduce_amax(x, axis=axis, keepdims=keepdims)
    except (TypeError, ValueError) as e:
        count("reduce_amax", False)
        assert str(e)
        return
    count("reduce_amax", True)
    # reduce_amax is Python (not an operator); it may return -0.0 for a slice of -0.0,
    # which is compared as a value here (+ 0.0), everything else bit for bit.
    if x.dim() == 0:
        assert_same(out + 0.0, x.abs() + 0.0)
        return
    dims = list(range(x.dim())) if axis is None else ([axis] if isinstance(axis, int) else list(axis))
    expected = x.abs().amax(dim=[d % x.dim() for d in dims], keepdim=True)
    if expected.numel() == 1:
        expected = expected.reshape(())
    elif not keepdims:
        expected = expected.squeeze([d % x.dim() for d in dims])
    # NaN-propagation of amax/aminmax: NaN where the reduced slice holds a NaN
    assert_same(out + 0.0, expected + 0.0)


# --- FP8, block-wise, LSQ: random tensors and parameters against the reference ----------------


@given(x=tensors(dtype=None, modes=("normal", "grid", "special")), fmt=st.sampled_from([(4, 3), (5, 2), (3, 2), (2, 3)]),
       amax=st.sampled_from([0.0, 2.0**-25, 1e-3, 0.7, 3.0, 500.0]), per_channel=st.booleans())
@FUZZ
def test_fuzz_fp8(x, fmt, amax, per_channel):
    count("fp8", True)
    if per_channel and x.dim() >= 1 and x.shape[0] > 0:
        a = (torch.rand(x.shape[0], generator=torch.Generator().manual_seed(1)) * amax).reshape(
            (-1,) + (1,) * (x.dim() - 1)).to(x.device)
    else:
        a = torch.tensor(amax, device=x.device)
    y, mask = ops.fake_quantize_fp8(x, a, *fmt)
    ey, emask = FP8.reference((x, a, *fmt))
    assert_same(y, ey)
    check_layout(y, x)
    assert bits_equal(fakequant.unpack_mask(mask, y), emask)


@given(x=tensors(modes=("normal", "grid", "special")), block_size=st.sampled_from([1, 3, 16, 32, 100]),
       elements=st.sampled_from([(8, 0, False, True), (4, 0, True, False), (8, 4, False, True), (8, 5, False, True),
                                 (4, 2, False, True), (6, 3, False, True), (6, 2, False, True), (8, 0, False, False)]),
       scale_amax=st.sampled_from([None, 0.0, 1.0, 37.5]), e8m0=st.booleans(), centered=st.booleans())
@FUZZ
def test_fuzz_blockwise(x, block_size, elements, scale_amax, e8m0, centered):
    count("blockwise", True)
    num_bits, exponent_bits, unsigned, narrow = elements
    if e8m0:  # the MX scales take no scale_amax and signed elements
        scale_amax, unsigned = None, False
    sa = None if scale_amax is None else torch.tensor(scale_amax, device=x.device)
    y, mask = ops.fake_quantize_blockwise(x, block_size, num_bits, unsigned, narrow, exponent_bits, sa, True, e8m0,
                                          centered)
    ey, emask = BLOCKWISE.reference((x, block_size, num_bits, unsigned, narrow, exponent_bits, sa, True, e8m0,
                                     centered))
    assert_same(y, ey)
    assert bits_equal(fakequant.unpack_mask(mask, y), emask)


@given(x=tensors(modes=("normal", "grid")), data=st.data())
@FUZZ
def test_fuzz_lsq_forward_and_gradients(x, data):
    """The LSQ forward is the affine op's, bit for bit; grad_input is grad where the value
    was not clamped."""
    count("lsq", True)
    qmin, qmax = data.draw(st.sampled_from([(-128, 127), (0, 255), (-7, 7), (-8, 7)]))
    axis = None
    if x.dim() >= 1 and data.draw(st.booleans()):
        axis = data.draw(st.integers(-x.dim(), x.dim() - 1))
    n = 1 if axis is None else x.shape[axis]
    scale = torch.rand(n, generator=torch.Generator().manual_seed(2)).to(x.device) * 0.1 + 1e-3
    zp = torch.randint(qmin, qmax + 1, (n,), generator=torch.Generator().manual_seed(3),
                       dtype=torch.int32).to(x.device)
    y = ops.fake_quantize_lsq(x, scale, zp, axis, qmin, qmax, 1.0)
    assert_same(y, LSQ.reference((x, scale, zp, axis, qmin, qmax, 1.0))[0])
    g = torch.randn(x.shape, generator=torch.Generator().manual_seed(4)).to(x.device, x.dtype)
    gx, gs, gz = ops.fake_quantize_lsq_backward(g, x, scale, zp, axis, qmin, qmax, 1.0)
    assert_same(gx, LSQ_BACKWARD.reference((g, x, scale, zp, axis, qmin, qmax, 1.0))[0])
    assert gs.shape == scale.shape and gz.shape == zp.shape


# --- argument checks of the Python wrappers (fakequant/ops/) ----------------------------------


def test_wrapper_rejects_fractional_python_zero_point():
    with pytest.raises(ValueError, match="zero_point"):
        fakequant.fake_quantize_affine(torch.randn(5), 0.1, 0.5)


def test_wrapper_rejects_huge_python_zero_point():
    with pytest.raises(ValueError, match="zero_point"):
        fakequant.fake_quantize_affine(torch.randn(5), 0.1, 2**40, None, -128, 127)


def test_wrapper_rejects_non_int_num_bits():
    with pytest.raises(TypeError, match="num_bits"):
        fakequant.fake_quantize_amax(torch.randn(5), 1.0, num_bits=8.0)


def test_wrapper_rejects_non_tensor_input():
    with pytest.raises(TypeError, match="input"):
        fakequant.fake_quantize_amax([1.0, 2.0], 1.0)


def test_wrapper_bad_arguments_raise_python_exceptions():
    # Every one ends in a Python exception, never a crash.
    for call in (lambda: fakequant.fake_quantize_affine(torch.randn(5), 0.1, 2**40),
                 lambda: fakequant.fake_quantize_amax(torch.randn(5), 1.0, num_bits=8.0),
                 lambda: fakequant.fake_quantize_amax(torch.randn(5), 1.0, num_bits=2**70),
                 lambda: fakequant.fake_quantize_amax([1.0, 2.0], 1.0),
                 lambda: fakequant.fake_quantize_amax(torch.randn(5), "1.0")):
        with pytest.raises((RuntimeError, TypeError, AttributeError, ValueError)):
            call()
