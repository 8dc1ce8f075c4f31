"""``make gpu-check [PY=python3]``: a lent GPU turned into verified results, with the Python given.

No virtualenv is made and nothing is downloaded (a device machine reaches no package index).
On a machine with a CUDA GPU:

0. builds the extension in place for that GPU (``TORCH_CUDA_ARCH_LIST`` from its capability,
   ``MAX_JOBS`` from the cores), unless it is already built for this torch with CUDA;
1. ``python -m fakequant gpu-check``: the operators against the rule and against the CPU bit for
   bit, compute-sanitizer (memcheck, racecheck, synccheck), and a bandwidth table;
2. ``tests/test_cuda.py`` (bit for bit against the CPU, CUDA graphs, > 2^31 elements,
   misaligned inputs), stopping at the first failure, then the operator suite's CUDA cases;
3. ``tools/op_fingerprint.py`` on the CPU and on the GPU: every operator configuration's outputs
   and gradients, compared;
4. the CUDA benchmarks: ``benchmarks/bench_ops.py`` (each op's forward and forward+backward at
   2^20..2^28 elements beside ``torch.clone`` and torch's own fake-quant ops, float32 and
   bfloat16) and ``benchmarks/bench_compiled_qat.py`` (a compiled QAT step of the ResNet-18 and
   the small Llama against compiled float);

each under what is left of ``--budget`` (printed as it goes), into one ``report.md`` and the raw
JSON in ``--out``. It exits 1 on any correctness failure. Without a GPU it says so in one line and
runs ``make cuda-build`` where nvcc exists (so that CI runs it), exiting with its status.

Sized for an H200 (16 cores) in 20 minutes, build included (docs/cuda.md: how it was estimated).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OPERATOR_SUITE = ["tests/test_ops.py", "tests/test_blockwise.py", "tests/test_fp8.py", "tests/test_mx.py",
                  "tests/test_lsq.py", "tests/test_per_token.py", "tests/test_op_registration.py"]


def log(message):
    print(f"[gpu-check {time.strftime('%H:%M:%S')}] {message}", flush=True)


def probe(py):
    """What the Python ``py`` sees: torch, CUDA, the GPU, and the fakequant built in place."""
    code = ("import json, torch; d = {'torch': torch.__version__, 'cuda': torch.version.cuda, "
            "'gpu': torch.cuda.is_available()}\n"
            "if d['gpu']:\n"
            "    p = torch.cuda.get_device_properties(0); d.update(name=p.name, capability=f'{p.major}.{p.minor}')\n"
            "try:\n"
            "    import fakequant; d.update(built_for=fakequant.BUILT_FOR_TORCH, built_cuda=fakequant.BUILT_FOR_CUDA)\n"
            "except Exception as e:\n"
            "    d['import_error'] = f'{type(e).__name__}: {e}'\n"
            "print(json.dumps(d))")
    out = subprocess.run([py, "-c", code], capture_output=True, text=True, cwd=ROOT)
    if out.returncode != 0:
        raise SystemExit(f"gpu-check: {py} cannot import torch: {out.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def nvcc():
    home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    return shutil.which("nvcc") or (os.path.join(home, "bin", "nvcc") if os.path.exists(os.path.join(home, "bin", "nvcc")) else None)


def build(py, info, out):
    """Builds fakequant in place for this GPU, unless it is built for this torch with CUDA."""
    if info.get("built_for") and info.get("built_cuda") and "import_error" not in info:
        log(f"extension already built for torch {info['built_for']} with CUDA {info['built_cuda']}")
        return 0.0
    env = dict(os.environ, FORCE_CUDA="1", TORCH_CUDA_ARCH_LIST=info["capability"],
               MAX_JOBS=str(os.cpu_count() or 1))
    log(f"building for compute capability {info['capability']} with {env['MAX_JOBS']} jobs")
    start = time.monotonic()
    with open(os.path.join(out, "build.log"), "w") as f:
        done = subprocess.run([py, "setup.py", "-q", "build_ext", "--inplace", "--build-temp",
                               os.path.join("build", "gpu-check", "temp")], cwd=ROOT, env=env, stdout=f,
                              stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise SystemExit(f"gpu-check: the build failed (see {os.path.join(out, 'build.log')})")
    return time.monotonic() - start


class Steps:
    def __init__(self, py, out, budget):
        self.py, self.out, self.end = py, out, time.monotonic() + budget
        self.rows, self.failed = [], False

    def left(self):
        return self.end - time.monotonic()

    def run(self, name, args, correctness, min_seconds=30, log_name=None):
        """Runs ``args`` with what is left of the budget; its output goes to a log file."""
        if self.left() < min_seconds:
            self.rows.append({"step": name, "result": "skipped: out of time"})
            log(f"{name}: skipped (out of time)")
            return
        log(f"{name} ({self.left():.0f} s left)")
        path = os.path.join(self.out, log_name or name.split()[0] + ".log")
        start = time.monotonic()
        try:
            with open(path, "w") as f:
                done = subprocess.run([self.py, *args], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                                      timeout=max(self.left(), 1))
            result = "ok" if done.returncode == 0 else f"FAILED (exit {done.returncode})"
        except subprocess.TimeoutExpired:
            result = "FAILED (out of time)" if correctness else "stopped: out of time"
        seconds = time.monotonic() - start
        with open(path) as f:
            tail = f.read().strip().splitlines()[-3:]
        self.failed |= correctness and result != "ok"
        self.rows.append({"step": name, "result": result, "seconds": seconds, "log": os.path.basename(path),
                          "tail": tail})
        log(f"{name}: {result} in {seconds:.0f} s")


def report(out, info, build_s, steps, budget):
    lines = ["# make gpu-check", "", f"- GPU: {info.get('name')} (compute capability {info.get('capability')})",
             f"- torch {info['torch']}, CUDA {info['cuda']}", f"- build: {build_s:.0f} s",
             f"- budget: {budget:.0f} s", "", "| step | result | seconds | log |", "|---|---|---:|---|"]
    for r in steps.rows:
        lines.append(f"| {r['step']} | {r['result']} | {r.get('seconds', 0):.0f} | {r.get('log', '')} |")
    for title, path in (("python -m fakequant gpu-check", os.path.join(out, "fakequant", "report.md")),
                        ("benchmarks/bench_ops.py", os.path.join(out, "bench_ops.md")),
                        ("benchmarks/bench_compiled_qat.py", os.path.join(out, "compiled_qat.md"))):
        if os.path.exists(path):
            with open(path) as f:
                lines += ["", f"## {title}", "", f.read()]
    lines += ["", f"Verdict: {'FAILED' if steps.failed else 'ok'}", ""]
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write("\n".join(lines))
    with open(os.path.join(out, "report.json"), "w") as f:
        json.dump({"info": info, "build_s": build_s, "steps": steps.rows, "failed": steps.failed}, f, indent=1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--py", default=sys.executable, help="the Python to check (default: this one)")
    parser.add_argument("--out", default=os.path.join("build", "gpu-check"))
    parser.add_argument("--budget", type=float, default=18 * 60, help="seconds, build excluded")
    parser.add_argument("--no-cuda-build", action="store_true", help="without a GPU, do not run make cuda-build")
    args = parser.parse_args()
    info = probe(args.py)
    if not info["gpu"]:
        print(f"gpu-check: no CUDA GPU here (torch {info['torch']}, CUDA {info['cuda'] or 'none'}); "
              + ("checking that the CUDA build compiles (make cuda-build)" if nvcc() and not args.no_cuda_build
                 else "nothing to check"), flush=True)
        if nvcc() and not args.no_cuda_build:
            return subprocess.run(["make", "cuda-build"], cwd=ROOT).returncode
        return 0
    out = os.path.join(ROOT, args.out)
    os.makedirs(out, exist_ok=True)
    build_s = build(args.py, info, out)
    info = probe(args.py)
    if "import_error" in info:
        raise SystemExit(f"gpu-check: fakequant does not import after the build: {info['import_error']}")
    steps = Steps(args.py, out, args.budget)
    steps.run("fakequant gpu-check (rule, CPU vs CUDA, compute-sanitizer, bandwidth)",
              ["-m", "fakequant", "gpu-check", "--out", os.path.join(out, "fakequant"),
               "--budget", str(min(420.0, steps.left() * 0.4))], correctness=True, log_name="fakequant.log")
    steps.run("tests/test_cuda.py", ["-m", "pytest", "-x", "-q", "-p", "no:randomly", "tests/test_cuda.py"],
              correctness=True, log_name="test_cuda.log")
    steps.run("operator suite, CUDA cases", ["-m", "pytest", "-x", "-q", "-p", "no:randomly", "-k", "cuda",
                                             *OPERATOR_SUITE], correctness=True, log_name="operator_suite.log")
    cpu_json, cuda_json = os.path.join(out, "fingerprints_cpu.json"), os.path.join(out, "fingerprints_cuda.json")
    steps.run("fingerprints on the CPU", ["tools/op_fingerprint.py", "--out", cpu_json], correctness=True,
              log_name="fingerprints_cpu.log")
    steps.run("fingerprints on CUDA, compared", ["tools/op_fingerprint.py", "--device", "cuda", "--out", cuda_json,
                                                 "--compare", cpu_json], correctness=True,
              log_name="fingerprints_cuda.log")
    steps.run("benchmarks/bench_ops.py", ["benchmarks/bench_ops.py", "--device", "cuda", "--sizes", "2^20..2^28:2",
                                          "--dtype", "float32,bfloat16", "--json", os.path.join(out, "ops.json")],
              correctness=False, log_name="bench_ops.md")
    steps.run("benchmarks/bench_compiled_qat.py", [
        "benchmarks/bench_compiled_qat.py", "--device", "cuda", "--models", "resnet,llama", "--rounds", "5",
        "--no-progress", "--configs", "float eager,float compiled,fakequant eager,fakequant compiled",
        "--json", os.path.join(out, "compiled_qat.json")], correctness=False, log_name="compiled_qat.md")
    report(out, info, build_s, steps, args.budget)
    log(f"report: {os.path.join(out, 'report.md')}; {'FAILED' if steps.failed else 'ok'}")
    return 1 if steps.failed else 0


if __name__ == "__main__":
    sys.exit(main())
