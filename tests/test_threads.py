"""Thread safety: the operators (and the modules built on them) called concurrently
from several Python threads give the results they give when called alone.

The operators hold no state between calls (the kernel variant for the CPU is picked
by the loader, value checks read their switch once); each call allocates its own
outputs. Calibrators, which accumulate state, are not meant to be shared between
threads and are not tested here.
"""
import os
import random
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import fakequant
import op_table
from conftest import DEVICES, bits_equal
from fakequant import nn as quant_nn
from fakequant.tensor_quant import QuantDescriptor

ops = torch.ops.fakequant
THREADS = 8
ROUNDS = 4


def _cases(device):
    g = torch.Generator().manual_seed(0)

    def rand(*shape, dtype=torch.float32, scale=3.0):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(device, dtype)

    x = rand(64, 1024)  # large enough for the kernels' own thread pool
    x[0, :4] = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.5])
    xcl = rand(8, 16, 16, 16, dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last)
    xh = rand(32, 33, 17, dtype=torch.float16)
    xd = rand(64, 64, dtype=torch.float64).t()
    scale16 = (torch.rand(16, generator=g) * 0.05 + 0.01).to(device)
    zp16 = torch.randint(-5, 5, (16,), generator=g, dtype=torch.int32).to(device)
    grad = rand(64, 1024)

    conv = quant_nn.Conv2d(16, 8, 3, padding=1).to(device)
    fakequant.calibrate(conv, [rand(2, 16, 16, 16)], progress=False)
    quantizer = quant_nn.TensorQuantizer(QuantDescriptor(axis=1, amax=torch.rand(1, 33, 1).add(0.5).tolist()))
    quantizer.to(device)

    def backward():
        leaf = x.detach().clone().requires_grad_()
        y = fakequant.fake_quantize_amax(leaf, 2.0, num_bits=4)
        (g_,) = torch.autograd.grad(y, leaf, grad)
        return y.detach(), g_

    def conv_step():
        leaf = xcl[:2].float().detach().clone().requires_grad_()
        out = conv(leaf)
        (g_,) = torch.autograd.grad(out.sum(), leaf)
        return out.detach(), g_

    def bad_argument():  # (a metadata check: CUDA skips value checks by default)
        with pytest.raises(ValueError, match="quant_min"):
            ops.fake_quantize_affine(x, scale16[:1], zp16[:1], None, 127, -128)
        return (torch.zeros(()),)

    cases = {
        "backward": backward,
        "quantizer": lambda: (quantizer(xh),),
        "conv": conv_step,
        "bad_argument": bad_argument,
    }
    # every sample call of the op table (tests/op_table.py) but the stateful ones, on large
    # inputs of four dtypes and layouts in turn
    inputs = [x, xcl, xh, xd]
    for k, (entry, variant) in enumerate(op_table.variants(lambda e, v: not e.stateful)):
        args = variant.args(inputs[k % len(inputs)])
        cases[variant.name] = lambda op=entry.op, args=args: _outputs(op(*args))
    return cases


def _outputs(out):
    return (out,) if isinstance(out, torch.Tensor) else tuple(out)


def _same(a, b):
    return a.dtype == b.dtype and bits_equal(a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_concurrent_calls_give_the_serial_results(device):
    cases = _cases(device)
    expected = {name: [t.clone() for t in fn()] for name, fn in cases.items()}
    start = threading.Barrier(THREADS)

    def worker(seed):
        order = list(cases) * ROUNDS
        random.Random(seed).shuffle(order)
        start.wait()  # all threads call at once
        wrong = []
        for name in order:
            got = cases[name]()
            if not all(_same(a, b) for a, b in zip(got, expected[name])):
                wrong.append(name)
        if device == "cuda":
            torch.cuda.synchronize()
        return wrong

    with ThreadPoolExecutor(THREADS) as pool:
        results = list(pool.map(worker, range(THREADS)))
    assert results == [[]] * THREADS, results


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_concurrent_calls_on_separate_cuda_streams():
    cases = _cases("cuda")
    expected = {name: [t.clone() for t in fn()] for name, fn in cases.items()}

    def worker(seed):
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            got = {name: fn() for name, fn in cases.items()}
        stream.synchronize()
        return [name for name in cases if not all(_same(a, b) for a, b in zip(got[name], expected[name]))]

    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(worker, range(4))) == [[]] * 4


FIRST_CALLS = r"""
import threading, torch, fakequant
ops = torch.ops.fakequant
x = torch.randn(32, 4096) * 3
amax = torch.tensor(2.0)
n = 8
barrier = threading.Barrier(n)
out = [None] * n
def first(i):
    barrier.wait()  # the very first calls of the process, all at once
    out[i] = ops.fake_quantize_amax(x, amax, 8, False, True)
threads = [threading.Thread(target=first, args=(i,)) for i in range(n)]
[t.start() for t in threads]
[t.join() for t in threads]
y, m = ops.fake_quantize_amax(x, amax, 8, False, True)
assert all(torch.equal(o[0], y) and torch.equal(o[1], m) for o in out)
print("ok")
"""


def test_first_calls_of_a_process_from_many_threads():
    env = dict(os.environ, OMP_NUM_THREADS="2")
    run = subprocess.run([sys.executable, "-c", FIRST_CALLS], capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-3000:]


def test_export_state_is_per_thread():
    """enable_onnx_export on one thread changes nothing on another: an uncalibrated
    quantizer still runs there, and the export options stay the defaults."""
    q = quant_nn.TensorQuantizer(QuantDescriptor())  # no amax: the export mode refuses it
    x = torch.randn(4, 8)
    inside, done = threading.Event(), threading.Event()
    seen = {}

    def exporting():
        with fakequant.enable_onnx_export(clip_narrow_range=False):
            seen["inside"] = (quant_nn.TensorQuantizer._enable_onnx_export,
                              fakequant.onnx.export_options is not None and
                              fakequant.onnx._options.current().clip_narrow_range)
            inside.set()
            done.wait(30)

    t = threading.Thread(target=exporting)
    t.start()
    try:
        assert inside.wait(30)
        assert seen["inside"] == (True, False)
        # this thread: not exporting
        assert not quant_nn.TensorQuantizer._enable_onnx_export
        assert not quant_nn.TensorQuantizer.use_fb_fake_quant
        assert fakequant.onnx._options.current().clip_narrow_range is True
        assert torch.equal(q(x), fakequant.fake_quantize_amax(x, x.abs().amax(), narrow_range=False))
    finally:
        done.set()
        t.join()
    with fakequant.enable_onnx_export(), pytest.raises(RuntimeError, match="calibrated"):
        q(x)
