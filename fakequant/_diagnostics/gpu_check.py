"""``python -m fakequant gpu-check``: what this install does on the GPU it finds.

With a CUDA GPU (and a fakequant built with CUDA), within a time budget it prints as it goes:

1. **correctness**: every operator of the self-check (``python -m fakequant info``) on the GPU
   against the plain-PyTorch rule, and against the CPU kernels bit for bit (values, sign of
   zero, and the backward's mask), in every dtype; the first mismatch fails the check;
2. **sanitizer**: NVIDIA's ``compute-sanitizer`` (memcheck, racecheck, synccheck) over one
   small case of every operator, forward and backward, where the tool is on the PATH;
3. **bandwidth**: each operator's forward and forward+backward (``torch.autograd.grad``:
   nothing accumulates into ``.grad``) at 2^20 to 2^28 elements (as the budget allows),
   float32 and bfloat16, timed with CUDA events beside ``torch.clone`` of the same tensor
   (what the memory bandwidth allows): GB/s and the fraction of clone's. The parameters are
   made once, not in the timed call; ``benchmarks/bench_ops.py`` in a checkout times every
   format.

It writes ``report.md`` and ``report.json`` into ``--out`` and exits 1 on any correctness or
sanitizer failure. Without a GPU it says so in one line and exits 0. ``make gpu-check``
(tools/gpu_check.py) runs this after building the extension for the GPU, plus the test suite
and the benchmarks of a checkout (docs/cuda.md).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

import fakequant

from .self_check import DTYPES, _cases, self_check

SANITIZER_TOOLS = ("memcheck", "racecheck", "synccheck")


class Budget:
    """Seconds left of ``total``; each step says what it skipped for time."""

    def __init__(self, total: float) -> None:
        self.end = time.monotonic() + total

    def left(self) -> float:
        return self.end - time.monotonic()


def no_gpu_reason() -> Optional[str]:
    """Why there is nothing to check here (None when there is a GPU and a CUDA build)."""
    if not torch.cuda.is_available():
        return f"no CUDA GPU here (torch {torch.__version__}, CUDA {torch.version.cuda or 'none'}): nothing to check"
    if not fakequant.BUILT_FOR_CUDA:
        return "this fakequant was built without CUDA kernels: rebuild it with the CUDA toolkit (docs/cuda.md)"
    return None


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().cpu()
    view = {2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.masked_fill(t.isnan(), float("nan")).contiguous().view(view)


def cpu_vs_cuda() -> Tuple[List[str], int]:
    """(failures, cases): each self-check case on the GPU against the CPU kernels, bit for bit
    (NaN compared as NaN), output and input gradient."""
    failures, checked = [], 0
    gen_cpu, gen_cuda = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
    for dtype in DTYPES:
        for (name, op_c, _, x_c), (_, op_g, _, x_g) in zip(_cases("cpu", dtype, gen_cpu), _cases("cuda", dtype, gen_cuda)):
            outs = []
            for op, x in ((op_c, x_c), (op_g, x_g)):
                xr = x.detach().requires_grad_()
                y = op(xr)
                (g,) = torch.autograd.grad(y.sum(), xr)
                outs.append((y.detach(), g))
            checked += 1
            (yc, gc), (yg, gg) = outs
            if not (torch.equal(_bits(yc), _bits(yg)) and torch.equal(_bits(gc), _bits(gg))):
                failures.append(f"{name} {dtype}: CUDA differs from the CPU")
    return failures, checked


def sanitize(budget: Budget) -> List[Dict[str, Any]]:
    """compute-sanitizer's tools over one small case of every operator (``--cases-only``)."""
    tool = shutil.which("compute-sanitizer")
    if tool is None:
        return [{"tool": t, "result": "skipped: compute-sanitizer is not on the PATH"} for t in SANITIZER_TOOLS]
    rows: List[Dict[str, Any]] = []
    for name in SANITIZER_TOOLS:
        if budget.left() < 60:
            rows.append({"tool": name, "result": "skipped: out of time"})
            continue
        cmd = [tool, "--tool", name, "--error-exitcode", "3", sys.executable, "-m", "fakequant", "gpu-check",
               "--cases-only"]
        start = time.monotonic()
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=max(60.0, budget.left() - 30))
            ok = done.returncode == 0
            tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
            rows.append({"tool": name, "result": "ok" if ok else "FAILED", "seconds": time.monotonic() - start,
                         "output": tail})
        except subprocess.TimeoutExpired:
            rows.append({"tool": name, "result": "skipped: out of time", "seconds": time.monotonic() - start})
    return rows


def run_cases() -> None:
    """One small case of every operator on the GPU, forward and backward (what the sanitizer watches)."""
    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        for _, op, _, x in _cases("cuda", dtype, gen):
            xr = x.detach().requires_grad_()
            op(xr).sum().backward()
    torch.cuda.synchronize()


def _time(fn: Callable[[], Any], reps: int) -> float:
    """Milliseconds per call, the median of 5 samples of ``reps`` calls (CUDA events)."""
    fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(5):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        stop.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(stop) / reps)
    return sorted(samples)[2]


# Each op's call, its parameters made once beforehand (bandwidth_params), as a QAT module keeps
# them: a parameter computed inside the timed call would add its own kernels and allocations (the
# first GPU run's affine row did: ``amax / 127`` and a new zero point on every call, 50 us a call
# at 2^20 elements where the amax row took 20).
BANDWIDTH_OPS: Dict[str, Callable[[torch.Tensor, Dict[str, torch.Tensor]], torch.Tensor]] = {
    "fake_quantize_amax (per tensor)": lambda x, p: fakequant.fake_quantize_amax(x, p["amax"]),
    "fake_quantize_affine (per tensor)": lambda x, p: fakequant.fake_quantize_affine(
        x, p["scale"], p["zero_point"], None, -128, 127),
    "fake_quantize_fp8 (E4M3)": lambda x, p: fakequant.fake_quantize_fp8(x, p["amax"]),
    "fake_quantize_blockwise (NVFP4)": lambda x, p: fakequant.fake_quantize_blockwise(x, 16, 4, exponent_bits=2,
                                                                                         scale_amax=p["amax"]),
    "torch.fake_quantize_per_tensor_affine": lambda x, p: torch.fake_quantize_per_tensor_affine(
        x, 0.02, 0, -128, 127),
}


def bandwidth_params(x: torch.Tensor) -> Dict[str, torch.Tensor]:
    """The parameters of BANDWIDTH_OPS for ``x``, on its device: amax, and the affine scale
    ``amax / 127`` (a division on every device: docs/design.md, "One value on every device") and
    zero point 0."""
    amax = x.abs().amax().float()
    return {"amax": amax, "scale": fakequant._core.divide(amax, 127),
            "zero_point": torch.zeros((), dtype=torch.int32, device=x.device)}


def bandwidth_calls(name: str, x: torch.Tensor, params: Dict[str, torch.Tensor],
                    grad: torch.Tensor) -> Tuple[Callable[[], Any], Callable[[], Any]]:
    """(forward, forward+backward) of BANDWIDTH_OPS[name] on ``x``: the backward is
    ``torch.autograd.grad`` of the input, so that no repetition accumulates into ``.grad`` (an
    addition of its own, which the first GPU run's forward+backward column included)."""
    op = BANDWIDTH_OPS[name]
    xr = x.detach().requires_grad_()

    def forward() -> torch.Tensor:
        return op(x, params)

    def forward_backward() -> Any:
        return torch.autograd.grad(op(xr, params), xr, grad)

    return forward, forward_backward


def bandwidth(budget: Budget, max_log2: int = 28) -> List[Dict[str, Any]]:
    """Forward and forward+backward of each operator in BANDWIDTH_OPS beside torch.clone."""
    rows = []
    free = torch.cuda.mem_get_info()[0]
    for dtype in (torch.float32, torch.bfloat16):
        for log2 in range(20, max_log2 + 1, 2):
            numel = 1 << log2
            if numel * 4 * 6 > free:  # input, output, gradients, mask: room to spare
                continue
            if budget.left() < 30:
                rows.append({"dtype": str(dtype), "numel": numel, "result": "skipped: out of time"})
                continue
            x = torch.randn(numel, device="cuda", dtype=dtype)
            params = bandwidth_params(x)
            grad = torch.randn_like(x)
            reps = max(3, min(200, (1 << 30) // (numel * x.element_size())))
            clone_ms = _time(lambda: x.clone(), reps)
            moved = 2 * numel * x.element_size()  # read x, write y
            for name in BANDWIDTH_OPS:
                forward, forward_backward = bandwidth_calls(name, x, params, grad)
                try:
                    fwd = _time(forward, reps)
                    fwd_bwd = _time(forward_backward, reps)
                except RuntimeError as e:  # (a torch without torch's op for this dtype)
                    rows.append({"dtype": str(dtype).replace("torch.", ""), "numel": numel,
                                 "result": f"{name}: {str(e).splitlines()[0][:100]}"})
                    continue
                rows.append({"op": name, "dtype": str(dtype).replace("torch.", ""), "numel": numel,
                             "clone_ms": clone_ms, "fwd_ms": fwd, "fwd_bwd_ms": fwd_bwd,
                             "fwd_gbs": moved / fwd / 1e6, "clone_gbs": moved / clone_ms / 1e6,
                             "fwd_of_clone": clone_ms / fwd})
            del x, grad
            torch.cuda.empty_cache()
    return rows


def device_info() -> Dict[str, Any]:
    props = torch.cuda.get_device_properties(0)
    driver = ""
    if shutil.which("nvidia-smi"):
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True)
        driver = out.stdout.strip()
    return {"device": torch.cuda.get_device_name(), "capability": f"{props.major}.{props.minor}",
            "memory_gib": props.total_memory / 2**30, "driver": driver, "torch": torch.__version__,
            "cuda": torch.version.cuda, "fakequant": fakequant.__version__,
            "built_for_arch": fakequant.CUDA_ARCH_LIST, "python": platform.python_version()}


def markdown(result: Dict[str, Any]) -> str:
    lines = ["# fakequant gpu-check", ""]
    lines += [f"- {k}: {v}" for k, v in result["device"].items()]
    lines += ["", "## Correctness", ""]
    for step in result["correctness"]:
        lines.append(f"- {step['name']}: {step['checked']} cases, "
                     + ("ok" if not step["failures"] else "FAILED: " + "; ".join(step["failures"])))
    lines += ["", "## compute-sanitizer", "", "| tool | result |", "|---|---|"]
    lines += [f"| {r['tool']} | {r['result']} |" for r in result["sanitizer"]]
    lines += ["", "## Bandwidth (CUDA events; bytes moved = read + write of the tensor; fwd+bwd: "
              "torch.autograd.grad of the input)", "",
              "| op | dtype | elements | fwd (ms) | fwd+bwd (ms) | fwd GB/s | clone GB/s | fwd / clone |",
              "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in result["bandwidth"]:
        if "op" not in r:
            lines.append(f"| (not measured) | {r['dtype']} | 2^{r['numel'].bit_length() - 1} | {r['result']} "
                         "| | | | |")
            continue
        lines.append(f"| {r['op']} | {r['dtype']} | 2^{r['numel'].bit_length() - 1} | {r['fwd_ms']:.4f} | "
                     f"{r['fwd_bwd_ms']:.4f} | {r['fwd_gbs']:.0f} | {r['clone_gbs']:.0f} | {r['fwd_of_clone']:.2f} |")
    lines += ["", f"Verdict: {'FAILED' if result['failed'] else 'ok'} ({result['seconds']:.0f} s)", ""]
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fakequant gpu-check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="gpu-check-report", help="folder for report.md and report.json")
    parser.add_argument("--budget", type=float, default=600.0, help="seconds for the whole check")
    parser.add_argument("--max-log2", type=int, default=28, help="largest benchmark size, 2^N elements")
    parser.add_argument("--cases-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    reason = no_gpu_reason()
    if args.cases_only:
        if reason is None:
            run_cases()
        return 0
    if reason is not None:
        print(f"fakequant gpu-check: {reason}")
        return 0 if not torch.cuda.is_available() else 1
    start, budget = time.monotonic(), Budget(args.budget)
    result: Dict[str, Any] = {"device": device_info(), "correctness": [], "sanitizer": [], "bandwidth": []}
    print(f"fakequant gpu-check on {result['device']['device']} (budget {args.budget:.0f} s)", flush=True)
    failures, checked, seconds = self_check(["cuda"])
    result["correctness"].append({"name": "operators against the plain-PyTorch rule", "checked": checked,
                                  "failures": failures})
    print(f"  rule: {checked} cases in {seconds:.1f} s: {'ok' if not failures else failures}", flush=True)
    failures2, checked2 = cpu_vs_cuda()
    result["correctness"].append({"name": "CUDA against the CPU kernels, bit for bit", "checked": checked2,
                                  "failures": failures2})
    print(f"  CPU vs CUDA: {checked2} cases: {'ok' if not failures2 else failures2}", flush=True)
    result["sanitizer"] = sanitize(budget)
    for r in result["sanitizer"]:
        print(f"  compute-sanitizer {r['tool']}: {r['result']}", flush=True)
    result["bandwidth"] = bandwidth(budget, args.max_log2)
    print(f"  bandwidth: {sum('op' in r for r in result['bandwidth'])} rows", flush=True)
    result["failed"] = bool(failures or failures2 or any(r["result"] == "FAILED" for r in result["sanitizer"]))
    result["seconds"] = time.monotonic() - start
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "report.json"), "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(args.out, "report.md"), "w") as f:
        f.write(markdown(result))
    print(f"  report: {os.path.join(args.out, 'report.md')}; {'FAILED' if result['failed'] else 'ok'}")
    return 1 if result["failed"] else 0
