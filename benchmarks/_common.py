"""What the benchmark scripts share: the command line's common parts and the JSON
they write, element counts, timing, memory, the machine, and the models and peers
more than one script measures.

A script run as ``python benchmarks/<script>.py`` has benchmarks/ first on
sys.path, so it imports this module as ``import _common``; the scripts do not
import one another.
"""
import argparse
import importlib.util
import json
import math
import os
import pathlib
import platform
import re
import resource
import statistics
import time

import torch
from torch import nn

# --- the command line and the output ----------------------------------------------


def argument_parser(doc, summary=False):
    """A script's parser: its docstring, as written, is the description (only its
    first line with `summary`)."""
    if summary:
        return argparse.ArgumentParser(description=doc.splitlines()[0])
    return argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)


def add_output_options(parser, json_help=None, progress=False):
    """--json PATH (the results as JSON too) and, with `progress`, --no-progress."""
    parser.add_argument("--json", help=json_help)
    if progress:
        parser.add_argument("--no-progress", action="store_true")


def progress_bar(total, desc, enabled=True):
    """A tqdm bar that clears itself when done; off when not `enabled` or not on a terminal."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, disable=not enabled or None, leave=False)


def write_json(path, result):
    """Saves `result` to `path` (nothing when `path` is empty: --json not given)."""
    if path:
        with open(path, "w") as f:
            json.dump(result, f, indent=1)


# --- element counts -------------------------------------------------------------


def _count(token):
    token = token.strip()
    m = re.fullmatch(r"2\^(\d+)", token)
    return 1 << int(m.group(1)) if m else int(token)


def parse_sizes(spec):
    """'2^10..2^26:2,1000' -> [1024, 4096, ..., 67108864, 1000]."""
    sizes = []
    for part in spec.split(","):
        m = re.fullmatch(r"\s*2\^(\d+)\s*\.\.\s*2\^(\d+)\s*(?::\s*(\d+))?\s*", part)
        if m:
            lo, hi, step = int(m.group(1)), int(m.group(2)), int(m.group(3) or 1)
            sizes += [1 << k for k in range(lo, hi + 1, step)]
        else:
            sizes.append(_count(part))
    return sizes


def size_label(numel):
    k = numel.bit_length() - 1
    return f"2^{k}" if numel == 1 << k else str(numel)


# --- timing -------------------------------------------------------------------


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_interleaved(fns, device, rounds, warmup=3, reps=1, min_sample_s=0.0, host=None):
    """Median seconds per call of each function, calling them in turn every round.

    A sample is `reps` calls or more: as many as make it last `min_sample_s`
    (estimated from the last warm-up call). On CUDA a sample is timed with CUDA
    events on the current stream; with a dict `host`, host[name] is set to the
    median host seconds per call of the same samples (the time to issue the calls,
    before waiting for the GPU: where it is about the events' time, the host, not
    the GPU, sets the pace)."""
    calls = {}
    for name, f in fns.items():
        for i in range(max(warmup, 1)):
            sync(device)
            t0 = time.perf_counter()
            f()
            sync(device)
            single = time.perf_counter() - t0
        calls[name] = max(reps, min(10000, math.ceil(min_sample_s / max(single, 1e-9))))
    samples = {name: [] for name in fns}
    issued = {name: [] for name in fns}
    for _ in range(rounds):
        for name, f in fns.items():
            n = calls[name]
            if device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                t0 = time.perf_counter()
                for _ in range(n):
                    f()
                issued[name].append((time.perf_counter() - t0) / n)
                end.record()
                end.synchronize()
                samples[name].append(start.elapsed_time(end) / 1e3 / n)
            else:
                t0 = time.perf_counter()
                for _ in range(n):
                    f()
                samples[name].append((time.perf_counter() - t0) / n)
                issued[name].append(samples[name][-1])
    if host is not None:
        host.update({name: statistics.median(v) for name, v in issued.items()})
    return {name: statistics.median(v) for name, v in samples.items()}


def forward_backward(fn, x, grad):
    """A callable running fn forward and its gradient w.r.t. x (no accumulation into x.grad)."""
    xr = x.detach().requires_grad_()

    def run():
        y = fn(xr)
        return torch.autograd.grad(y, xr, grad)

    return run


def settle(device, seconds=1.0):
    """Runs parallel work and small calls for a while first: on a small VM the first
    parallel regions of a fresh process can stall for milliseconds, and the first
    thousands of small calls run slower than the later ones."""
    big, small = torch.randn(1 << 20, device=device), torch.randn(1 << 10, device=device)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        big.clone().mul_(2)
        for _ in range(100):
            small.clone().mul_(2)
    sync(device)


# --- memory ---------------------------------------------------------------------


def status_mb(field):
    """A field of /proc/self/status (VmRSS, VmHWM) in MB."""
    # VmHWM, unlike ru_maxrss, starts afresh at exec (ru_maxrss keeps the parent's peak).
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 if field == "VmHWM" else float("nan")


def new_storage_bytes(seen, t):
    """The bytes of the storage under `t` the first time it is seen (added to `seen`),
    0 after: what a saved_tensors_hooks pack hook counts, each storage once."""
    key = (t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
    if key in seen:
        return 0
    seen.add(key)
    return key[1]


# --- the machine ------------------------------------------------------------------


def machine_info():
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return dict(
        cpu=model,
        cpu_count=os.cpu_count(),
        cpu_capability=torch.backends.cpu.get_cpu_capability(),
        torch=torch.__version__,
        python=platform.python_version(),
        threads=torch.get_num_threads(),
        thp=os.environ.get("THP_MEM_ALLOC_ENABLE") == "1",
    )


# --- pytorch-quantization's fake_tensor_quant, as plain PyTorch --------------


class PQFakeTensorQuant(torch.autograd.Function):
    # The arithmetic of pytorch_quantization.tensor_quant.FakeTensorQuantFunction
    # (scale = bound / amax, multiply, round, clamp, divide), written here from
    # its documented behaviour; it saves the whole input for backward.
    @staticmethod
    def forward(ctx, inputs, amax, num_bits=8, unsigned=False, narrow_range=True):
        ctx.save_for_backward(inputs, amax)
        bound = 2.0 ** (num_bits - 1 + int(unsigned)) - 1.0
        min_bound = 0 if unsigned else (-bound if narrow_range else -bound - 1)
        scale = bound / amax
        out = torch.clamp((inputs * scale).round_(), min_bound, bound)
        return out / scale

    @staticmethod
    def backward(ctx, grad):
        inputs, amax = ctx.saved_tensors
        return torch.where(inputs.abs() <= amax, grad, grad.new_zeros(1)), None, None, None, None


# --- ResNet-18 (bench_qat_step.py, bench_compiled_qat.py) -------------------------


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.relu2 = nn.ReLU()
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
        self.add = torch.ao.nn.quantized.FloatFunctional()  # a plain add outside torch.ao QAT

    def forward(self, x):
        out = self.relu1(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu2(self.add.add(out, x if self.down is None else self.down(x)))


class ResNet18(nn.Module):
    """torchvision's resnet18 layer structure (which takes 64x64 inputs as they are)."""

    def __init__(self, classes=100):
        super().__init__()
        self.quant = torch.ao.quantization.QuantStub()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU()
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        blocks, cin = [], 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            blocks += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, classes)
        self.dequant = torch.ao.quantization.DeQuantStub()

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(self.quant(x)))))
        x = self.blocks(x)
        return self.dequant(self.fc(torch.flatten(self.pool(x), 1)))

    def fusion_groups(self):
        groups = [["conv1", "bn1", "relu"]]
        for i, b in enumerate(self.blocks):
            groups += [[f"blocks.{i}.conv1", f"blocks.{i}.bn1", f"blocks.{i}.relu1"],
                       [f"blocks.{i}.conv2", f"blocks.{i}.bn2"]]
            if b.down is not None:
                groups.append([f"blocks.{i}.down.0", f"blocks.{i}.down.1"])
        return groups


def test_oracles():
    """tests/reference.py, the tests' plain-PyTorch oracles (loaded from its path: the
    benchmarks time the library beside them, and tests/ is not a package)."""
    path = pathlib.Path(__file__).resolve().parent.parent / "tests" / "reference.py"
    spec = importlib.util.spec_from_file_location("fakequant_test_oracles", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
