"""benchmarks/bench_ops.py on the CPU, at a tiny size: what its tables name (every format, both
dtypes, both passes), that forward+backward leaves no gradient behind, and its CUDA-only parts
(CUDA events, the host's time per call, the synchronisation check, the memory check) run against
a stand-in for torch.cuda. No time is asserted: only what is measured and named."""
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from conftest import benchmark_module

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"


@pytest.fixture(scope="module")
def bench_ops():
    return benchmark_module("bench_ops")


# What issue 36 asks the table to cover (item 5), each a word its name must hold.
FORMATS = ("affine per-tensor", "affine per-channel", "last axis", "amax per-tensor", "amax per-channel",
           "fp8 e4m3", "static blocks", "NVFP4 b16", "MXFP8 b32", "MXFP6 b32", "MXFP4 b32", "MXINT8 b32",
           "int8 b32", "int8 b128", "int4 b32", "per-token int8", "per-token fp8", "Q8_0", "Q4_0")


def test_the_operator_list_names_every_format(bench_ops):
    for name in FORMATS:
        assert any(name in op for op in bench_ops.OPS), name
    # the block-wise target (run_all.py) is the dynamic kernel's only
    assert all(o.startswith(("block-wise", "per-token")) for o in bench_ops.BLOCKWISE_OPS)
    assert "static blocks int8 b32" not in bench_ops.BLOCKWISE_OPS and "GGML Q8_0 b32" not in bench_ops.BLOCKWISE_OPS


def _run(tmp_path, *args):
    out = tmp_path / "ops.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT)] + os.environ.get("PYTHONPATH", "").split(os.pathsep)))
    done = subprocess.run([sys.executable, str(BENCH / "bench_ops.py"), "--no-progress", "--rounds", "1",
                           "--min-sample-ms", "0", "--json", str(out), *args],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout, json.loads(out.read_text())


def test_the_table_names_every_format_dtype_and_pass(tmp_path, bench_ops):
    # --budget: the path a GPU run takes (each group's table printed as it completes)
    stdout, result = _run(tmp_path, "--device", "cpu", "--sizes", "2^12", "--dtype", "float32,bfloat16",
                          "--budget", "600")
    for dtype in ("float32", "bfloat16"):
        assert f"2^12 {dtype} elements on cpu" in stdout
        for op in bench_ops.OPS:
            for mode in ("fwd", "fwd+bwd"):
                rows = [r for r in result["rows"] if (r["op"], r["mode"], r["dtype"]) == (op, mode, dtype)]
                assert {r["impl"] for r in rows} >= {"clone", "fakequant"}, (op, mode, dtype)
                assert f"| {op} | {mode} |" in stdout
    # every row of fakequant says how it compares with torch's per-tensor op in the same pass
    head = next(ln for ln in stdout.splitlines() if ln.startswith("| op | pass |")).split("|")
    line = next(ln for ln in stdout.splitlines() if ln.startswith("| amax per-channel | fwd+bwd |")).split("|")
    assert float(line[head.index(" x torch pt ")])
    assert "2 (size, dtype) groups measured" in stdout and result["left_out"] == []


def test_a_budget_leaves_groups_out_and_names_them(tmp_path):
    stdout, result = _run(tmp_path, "--device", "cpu", "--sizes", "2^10,2^12", "--ops", "amax per-tensor",
                          "--budget", "0")
    assert result["rows"] == []
    assert [(g["numel"], g["reason"]) for g in result["left_out"]] == [(1024, "out of time"), (4096, "out of time")]
    assert "2^10 float32 on cpu: not measured: out of time" in stdout


def test_forward_backward_takes_the_gradient_without_accumulating(bench_ops):
    import _common

    x, g = torch.randn(64), torch.randn(64)
    step = _common.forward_backward(lambda t: t * 2, x, g)
    (grad,) = step()
    step()
    assert torch.equal(grad, 2 * g) and x.grad is None


class _Event:
    """torch.cuda.Event on the host clock."""

    def __init__(self, enable_timing=False):
        self.t = None

    def record(self):
        import time
        self.t = time.perf_counter()

    def synchronize(self):
        pass

    def elapsed_time(self, end):
        return (end.t - self.t) * 1e3


def _fake_cuda(monkeypatch, free=1 << 40, sync_error=False):
    """torch.cuda's calls the benchmark makes, on the host; the sync debug mode raises as torch's
    does at a synchronising call when `sync_error`."""
    modes = []

    def set_sync_debug_mode(mode):
        modes.append(mode)

    monkeypatch.setattr(torch.cuda, "Event", _Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", set_sync_debug_mode)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, free))
    return modes


def test_the_cuda_timing_path_gives_event_and_host_times(monkeypatch, bench_ops):
    import _common

    _fake_cuda(monkeypatch)
    cuda = types.SimpleNamespace(type="cuda")
    x = torch.randn(256)
    host = {}
    times = _common.time_interleaved({"clone": lambda: x.clone(), "mul": lambda: x * 2}, cuda, rounds=2, warmup=1,
                                     reps=3, host=host)
    assert set(times) == set(host) == {"clone", "mul"}
    assert all(t > 0 for t in times.values()) and all(h > 0 for h in host.values())


def test_the_sync_check_reports_a_synchronising_call(monkeypatch, bench_ops):
    modes = _fake_cuda(monkeypatch)
    cuda = types.SimpleNamespace(type="cuda")
    assert bench_ops.host_syncs(lambda: None, cuda) == "none"
    assert modes == ["error", "default"]  # the mode is restored

    def reads_a_device_value():
        raise RuntimeError("called a synchronizing CUDA operation")

    assert bench_ops.host_syncs(reads_a_device_value, cuda) == "called a synchronizing CUDA operation"
    assert modes[-1] == "default"
    assert bench_ops.host_syncs(lambda: None, torch.device("cpu")) is None  # not measured off CUDA


def test_2_to_28_is_left_out_where_the_gpu_lacks_memory(monkeypatch, bench_ops):
    cuda = types.SimpleNamespace(type="cuda")
    _fake_cuda(monkeypatch, free=8 << 30)
    assert not bench_ops.fits(1 << 28, torch.float32, cuda)  # 1 GiB a tensor, 16 of them
    assert bench_ops.fits(1 << 24, torch.float32, cuda)
    _fake_cuda(monkeypatch, free=70 << 30)  # an H100's 80 GB, mostly free
    assert bench_ops.fits(1 << 28, torch.float32, cuda) and bench_ops.fits(1 << 28, torch.bfloat16, cuda)


def test_the_cuda_defaults_cover_the_bandwidth_and_the_small_sizes(bench_ops):
    import _common

    sizes = _common.parse_sizes(bench_ops.CUDA_SIZES)
    assert sizes[:2] == [1 << 28, 1 << 24]  # the bandwidth sizes first
    assert {1 << 10, 1 << 20} <= set(sizes)
    groups = bench_ops.groups(sizes, [torch.float32, torch.bfloat16])
    assert groups[:2] == [(1 << 28, torch.float32), (1 << 28, torch.bfloat16)]
    assert bench_ops.CUDA_DTYPES == "float32,bfloat16"


class _Dispatched:
    """The operators a call dispatches (each a kernel launch on a GPU)."""

    def __enter__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        seen = self.ops = []

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                seen.append(str(func))
                return func(*args, **(kwargs or {}))

        self.mode = Mode()
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        self.mode.__exit__(*exc)


def test_the_gpu_checks_bandwidth_calls_run_the_op_alone():
    """python -m fakequant gpu-check's table: the parameters are made before the timed call (the
    first GPU run's affine call made its scale and zero point in it: three kernels, not one), and
    forward+backward is the op and its backward, with no addition into .grad."""
    from fakequant._diagnostics import gpu_check as _gpu_check

    x = torch.randn(1 << 12)
    params, grad = _gpu_check.bandwidth_params(x), torch.randn(1 << 12)
    for name in _gpu_check.BANDWIDTH_OPS:
        forward, forward_backward = _gpu_check.bandwidth_calls(name, x, params, grad)
        with _Dispatched() as fwd:
            forward()
        with _Dispatched() as both:
            forward_backward()
        assert len(fwd.ops) == 1 and "quantize" in fwd.ops[0], (name, fwd.ops)
        assert both.ops[0] == fwd.ops[0] and len(both.ops) == 2, (name, both.ops)  # the op, its backward


def test_runtime_calls_are_counted_by_kind(bench_ops):
    names = ["aten::clone", "cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC_v11060", "cudaMemcpyAsync",
             "cudaStreamSynchronize", "cudaMemsetAsync", "cudaMalloc", "cudaGetDevice"]
    assert bench_ops.count_runtime_calls(names) == {"launches": 3, "copies": 1, "memsets": 1, "syncs": 1,
                                                    "mallocs": 1}
    assert bench_ops._fmt_calls({"launches": 1, "copies": 0, "memsets": 0, "syncs": 0, "mallocs": 0},
                                {"launches": 1}) == "1 / 1"
    assert bench_ops._fmt_calls({"launches": 3, "copies": 1, "memsets": 0, "syncs": 0, "mallocs": 0},
                                None) == "3; 1 copies"
    assert bench_ops.cuda_calls(lambda: None, torch.device("cpu")) is None  # not measured off CUDA
    # the profiler's own synchronisation as it stops is not the call's
    profiler_only = bench_ops.count_runtime_calls(["cudaDeviceSynchronize"])
    assert bench_ops.subtract_calls(bench_ops.count_runtime_calls(names), profiler_only)["syncs"] == 0
