"""fakequant._C's function per operator (csrc/python_calls.cpp), which fakequant.ops calls in
eager code in place of torch.ops' overload: the same outputs, errors, autograd and dispatch
as the overload, from the op table (tests/op_table.py); the overload itself wherever the
arguments are not plain (keywords, defaults left out, tensor subclasses, a torch function
mode, a TorchScript trace), and in the graph torch.compile makes."""
import sys

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import fakequant
import op_table
from conftest import DEVICES, bits_equal
from fakequant import _extension
from fakequant.ops._common import _ops

_C = _extension._C
VARIANTS = op_table.variants()


def _fresh(entry, variant, x):
    """A variant's arguments on x, new ones for an operator that updates its buffers."""
    return variant.args(x.detach().clone().requires_grad_(x.requires_grad))


def _call(name, args):
    """fakequant._C's function `name` on args: its outputs, and whether it passed the call to
    the overload (whose __call__ is Python, as the profiler sees)."""
    overload_calls = []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_name == "__call__" and frame.f_code.co_filename.endswith("_ops.py"):
            overload_calls.append(frame)

    sys.setprofile(profile)
    try:
        out = getattr(_C, name)(*args)
    finally:
        sys.setprofile(None)
    return out, bool(overload_calls)


def _outputs(out):
    return (out,) if isinstance(out, torch.Tensor) else tuple(out)


def _assert_bits_equal(a, b, what):
    assert len(a) == len(b), what
    for i, (u, v) in enumerate(zip(a, b)):
        assert (u is None) == (v is None), (what, i)
        if u is not None:
            assert u.dtype == v.dtype and u.shape == v.shape and u.stride() == v.stride(), (what, i)
            assert bits_equal(u.detach(), v.detach()), (what, i)


def test_one_function_per_operator():
    """OPERATORS names every registered operator once, each a function of fakequant._C, and
    fakequant.ops' _ops holds exactly those functions."""
    registered = {s.name.split("::")[1] for s in torch._C._jit_get_all_schemas() if s.name.startswith("fakequant::")}
    assert sorted(_C.OPERATORS) == sorted(registered)
    for name in _C.OPERATORS:
        assert getattr(_ops, name) is getattr(_C, name)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("entry,variant", VARIANTS, ids=op_table.variant_ids(VARIANTS))
def test_same_as_the_overload(device, entry, variant):
    """Each sample call through fakequant._C gives the overload's outputs bit for bit (layout
    included), the same autograd node, and the same input gradient; the buffers an operator
    updates in place are updated alike."""
    for dtype in (torch.float32, torch.bfloat16):
        for layout in ("contiguous", "transposed"):
            x = op_table.sample_input(layout, dtype, device).requires_grad_()
            args_fast, args_op = _fresh(entry, variant, x), _fresh(entry, variant, x)
            fast, fell_back = _call(entry.name, args_fast)
            fast = _outputs(fast)
            slow = _outputs(entry.op.default(*args_op))
            what = f"{entry.name} {variant.name} {layout} {dtype}"
            assert fell_back == (len(args_fast) < len(entry.op.default._schema.arguments)), what
            _assert_bits_equal(fast, slow, what)
            _assert_bits_equal([a for a in args_fast if isinstance(a, torch.Tensor)],
                               [a for a in args_op if isinstance(a, torch.Tensor)], what + " (arguments after)")
            y_fast, y_slow = fast[0], slow[0]
            assert type(y_fast.grad_fn) is type(y_slow.grad_fn), what
            if y_fast.grad_fn is not None:
                g = torch.ones_like(y_fast)
                (gx_fast,) = torch.autograd.grad(y_fast, args_fast[0], g)
                (gx_slow,) = torch.autograd.grad(y_slow, args_op[0], g)
                assert bits_equal(gx_fast, gx_slow), what


INVALID = op_table.invalid_cases()


@pytest.mark.parametrize("entry,case", INVALID, ids=op_table.invalid_ids(INVALID))
def test_same_errors_as_the_overload(entry, case):
    """Every invalid case of the table raises through fakequant._C what it raises through the
    overload: the same exception class and message."""
    with pytest.raises(Exception) as through_op:
        entry.op.default(*case.arguments(entry.invalid_base()))
    with pytest.raises(Exception) as through_c:
        getattr(_C, entry.name)(*case.arguments(entry.invalid_base()))
    assert type(through_c.value) is type(through_op.value)
    assert str(through_c.value) == str(through_op.value)


def test_arguments_the_fast_path_leaves_to_the_overload():
    """Keywords, defaults left out, an int for a float and a tuple of ints for a list give
    the overload's results; an argument of another type its error."""
    x = torch.randn(4, 6)
    amax = torch.tensor(1.5)
    want = torch.ops.fakequant.fake_quantize_amax.default(x, amax, 8, False, True, True)
    got, fell_back = _call("fake_quantize_amax", (x, amax, 8, False, True, True))
    _assert_bits_equal(got, want, "all arguments")
    assert not fell_back
    for got in (_C.fake_quantize_amax(x, amax), _C.fake_quantize_amax(x, amax, num_bits=8),
                _C.fake_quantize_amax(x, amax, 8, False, True, check_values=True)):
        _assert_bits_equal(got, want, "defaults and keywords")
    assert _call("fake_quantize_amax", (x, amax))[1]
    scale = torch.tensor(0.1)
    zp = torch.tensor(0, dtype=torch.int32)
    _assert_bits_equal([_C.fake_quantize_lsq(x, scale, zp, None, -8, 7, 1)],
                       [torch.ops.fakequant.fake_quantize_lsq.default(x, scale, zp, None, -8, 7, 1.0)], "int for float")
    y, mask = _C.fake_quantize_amax(x.t(), amax, 8, False, True, True)
    assert y.stride() == (1, 6)
    for strides in ([1, 6], (1, 6)):
        _assert_bits_equal([_C.mask_backward(torch.ones_like(y), mask, strides)],
                           [torch.ops.fakequant.mask_backward.default(torch.ones_like(y), mask, [1, 6])], "strides")
    with pytest.raises(RuntimeError, match="num_bits"):
        _C.fake_quantize_amax(x, amax, "8", False, True, True)
    with pytest.raises(RuntimeError, match="num_bits"):
        torch.ops.fakequant.fake_quantize_amax.default(x, amax, "8", False, True, True)


class _Logged(torch.Tensor):
    """A tensor subclass whose __torch_function__ logs what it is called with."""
    calls = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.calls.append(func)
        return super().__torch_function__(func, types, args, kwargs or {})


class _FunctionLog(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls.append(func)
        return func(*args, **(kwargs or {}))


class _DispatchLog(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls.append(func)
        return func(*args, **(kwargs or {}))


def test_torch_function_and_dispatch_see_the_operator():
    """A tensor subclass's __torch_function__ and a torch function mode see the overload (the
    call falls back to it); a dispatch mode sees it from the fast path too (the dispatcher's
    Python key)."""
    x = torch.randn(3, 5)
    amax = torch.tensor(2.0)
    op = torch.ops.fakequant.fake_quantize_amax.default
    _Logged.calls.clear()
    fakequant.fake_quantize_amax(x.as_subclass(_Logged), amax)
    assert op in _Logged.calls
    with _FunctionLog() as mode:
        fakequant.fake_quantize_amax(x, amax)
    assert op in mode.calls
    with _DispatchLog() as mode:
        fakequant.fake_quantize_amax(x, amax)
    assert mode.calls == [op]


def test_a_torchscript_trace_records_the_operator():
    def f(x):
        return fakequant.fake_quantize_amax(x, torch.tensor(2.0))

    traced = torch.jit.trace(f, torch.randn(3, 4))
    assert "fakequant::fake_quantize_amax" in str(traced.graph)


def test_compiled_graphs_hold_the_overload():
    """Dynamo traces the overload in place of fakequant._C's function (its polyfill): one
    graph, which calls the operator."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def f(x, amax):
        return fakequant.fake_quantize_amax(x, amax) * 2

    x, amax = torch.randn(6), torch.tensor(1.0)
    compiled = torch.compile(f, backend=backend, fullgraph=True)
    assert bits_equal(compiled(x, amax), f(x, amax))
    assert len(graphs) == 1
    targets = [n.target for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert torch.ops.fakequant.fake_quantize_amax.default in targets
