"""``make gpu-check [PY=python3]``: a lent GPU turned into verified results, with the Python given.

No virtualenv is made and nothing is downloaded (a device machine reaches no package index): a
copied checkout, a Python with CUDA torch, pytest and nvcc are enough. Every step runs with the
checkout first on ``PYTHONPATH``, so what is checked is this checkout's fakequant, whatever is
installed. On a machine with a CUDA GPU, within ``--budget`` seconds in all (8 minutes, the
build included), printing as it goes:

0. the extension built in place for that GPU (``TORCH_CUDA_ARCH_LIST`` from its capability,
   ``MAX_JOBS`` from the cores; ninja recompiles only what changed, so a second run costs seconds);
1. correctness, in the order of what it answers: ``python -m fakequant gpu-check`` (every
   operator of the self-check against the rule and against the CPU bit for bit, compute-sanitizer's
   memcheck, racecheck and synccheck, and its bandwidth table); ``tests/test_cuda.py``; the operator
   suite's CUDA cases; ``tools/op_fingerprint.py`` on the CPU and on CUDA, compared;
2. the bandwidth table of ``benchmarks/bench_ops.py`` (every format at 2^28 elements where memory
   allows and 2^24, and per call at 2^10..2^20, beside ``torch.clone`` and torch's own fake-quant
   ops, float32 and bfloat16, forward and forward+backward; within a one-minute budget), then
   ``benchmarks/loop_shapes.py`` (the kernels' loop shapes and variants against
   ``cudaMemcpyAsync``, each variant bit for bit against the library's kernel);
3. the compiled QAT step of ``benchmarks/bench_compiled_qat.py`` (the ResNet-18, the small Llama and
   the MoE, float and fakequant, eager and compiled; within what is left of the run, at most four
   minutes, compiles included).

No step stops at its first failure: pytest runs without ``-x`` (at most ``--max-failures``
failures a step), and a test process that dies (a segmentation fault) is resumed after the test
that killed it (tools/pytest/gpu_check_progress.py records each test as it ends), so one run
tells everything: each step's counts, which targets it checked (test files, operators), and the
failing cases. It writes ``report.md`` and ``report.json`` (and each step's log) into ``--out``,
prints a one-screen summary, and exits 1 on any correctness failure. Without a GPU it says so
in one line and runs ``make cuda-build`` where nvcc exists (so that CI runs it), exiting with
its status.
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLUGIN_DIR = os.path.join(ROOT, "tools", "pytest")  # gpu_check_progress, the pytest plugin
OPERATOR_SUITE = ["tests/test_ops.py", "tests/test_blockwise.py", "tests/test_fp8.py", "tests/test_mx.py",
                  "tests/test_lsq.py", "tests/test_per_token.py", "tests/test_op_registration.py"]
DEFAULT_BUDGET = 8 * 60  # seconds, the build included: a lent GPU gives 15 minutes, its start included
MAX_FAILURES = 50  # a step's pytest failures (and crashes) before it stops
MAX_CRASHES = 5  # test processes that die, a step, before it stops resuming
BUILD_DIR = os.path.join("build", "gpu-check", "temp")
# The benchmarks' own budgets (seconds; they leave out, and name, what does not fit) and the caps
# gpu-check kills them at (the budget, the group or build in flight when it ran out, start-up).
# The compiled step is last and takes what is left, up to its budget: on the H100 each compiled
# configuration took 24-31 s to build, six of them (three models, float and fakequant).
BENCH_OPS_BUDGET, BENCH_OPS_CAP = 60, 90
LOOP_SHAPES_CAP = 90  # its nvcc (15 s here) and 15 rounds of about 40 variants at 2^28 (20 s on the H200)
COMPILED_BUDGET, COMPILED_CAP = 240, 290


def log(message):
    print(f"[gpu-check {time.strftime('%H:%M:%S')}] {message}", flush=True)


def step_env(*paths, **variables):
    """The environment of every process gpu-check starts: the checkout first on PYTHONPATH (an
    in-place build is importable only from there: ``python tools/<script>.py`` puts tools/ on the path,
    not the working directory), then ``paths``, then what was there."""
    env = dict(os.environ, **variables)
    env["PYTHONPATH"] = os.pathsep.join([ROOT, *paths] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def probe(py):
    """What the Python ``py`` sees: torch, CUDA, the GPU, and the checkout's fakequant."""
    code = ("import json, torch; d = {'torch': torch.__version__, 'cuda': torch.version.cuda, "
            "'gpu': torch.cuda.is_available()}\n"
            "if d['gpu']:\n"
            "    p = torch.cuda.get_device_properties(0); d.update(name=p.name, capability=f'{p.major}.{p.minor}')\n"
            "try:\n"
            "    import fakequant; d.update(built_for=fakequant.BUILT_FOR_TORCH, built_cuda=fakequant.BUILT_FOR_CUDA, "
            "arch=fakequant.CUDA_ARCH_LIST, file=fakequant.__file__)\n"
            "except Exception as e:\n"
            "    d['import_error'] = f'{type(e).__name__}: {e}'\n"
            "print(json.dumps(d))")
    out = subprocess.run([py, "-c", code], capture_output=True, text=True, cwd=ROOT, env=step_env())
    if out.returncode != 0:
        raise SystemExit(f"gpu-check: {py} cannot import torch: {out.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def nvcc():
    home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    return shutil.which("nvcc") or (os.path.join(home, "bin", "nvcc") if os.path.exists(os.path.join(home, "bin", "nvcc")) else None)


def source_state():
    """The checkout's commit and whether it has changes (None where git or .git is absent)."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True)
    except OSError:
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + (" with uncommitted changes" if dirty.stdout.strip() else "")


def ninja_times(build_temp):
    """[(seconds, object)] of the objects ninja compiled last, slowest first (from its .ninja_log)."""
    path = os.path.join(build_temp, ".ninja_log")
    if not os.path.exists(path):
        return []
    last = {}
    with open(path) as f:
        for line in f:
            parts = line.split("\t")
            if len(parts) >= 4 and parts[0].isdigit():
                last[parts[3]] = (int(parts[1]) - int(parts[0])) / 1000
    return sorted(((s, os.path.relpath(p, build_temp) if os.path.isabs(p) else p) for p, s in last.items()),
                  reverse=True)


# What setup.py says when it refuses a compiler that links libstdc++ statically, and the compilers
# gpu-check then builds with.
STATIC_LIBSTDCXX = "links libstdc++ statically"
SYSTEM_CXX = ("/usr/bin/gcc", "/usr/bin/g++")


def _read(path):
    with open(path, errors="replace") as f:
        return f.read()


def _build(py, env, log_path, mode="w"):
    with open(log_path, mode) as f:
        return subprocess.run([py, "setup.py", "-q", "build_ext", "--inplace", "--build-temp", BUILD_DIR],
                              cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT)


def build(py, info, out):
    """Builds fakequant in place for this GPU (ninja: only what changed since the last build).
    Returns (seconds, the slowest objects it compiled)."""
    jobs = os.cpu_count() or 1
    env = step_env(FORCE_CUDA="1", TORCH_CUDA_ARCH_LIST=info["capability"], MAX_JOBS=str(jobs))
    if not shutil.which("ninja") and not os.path.exists(os.path.join(os.path.dirname(py), "ninja")):
        log("warning: no ninja here; torch's builder then compiles one file at a time")
    log(f"building for compute capability {info['capability']} with {jobs} jobs (log: {out}/build.log)")
    start = time.monotonic()
    done = _build(py, env, os.path.join(out, "build.log"))
    if done.returncode != 0 and STATIC_LIBSTDCXX in _read(os.path.join(out, "build.log")) and \
            os.path.exists(SYSTEM_CXX[1]):
        # setup.py refused the machine's CXX (it links libstdc++ statically: the first GPU machine's
        # did, and the library crashed at its first exception); the system's compilers do not
        log(f"the machine's C++ compiler ({env.get('CXX')}) links libstdc++ statically; building with {SYSTEM_CXX[1]}")
        env.update(CC=SYSTEM_CXX[0], CXX=SYSTEM_CXX[1])
        done = _build(py, env, os.path.join(out, "build.log"), mode="a")
    if done.returncode != 0:
        raise SystemExit(f"gpu-check: the build failed (see {os.path.join(out, 'build.log')})")
    seconds = time.monotonic() - start
    slowest = ninja_times(os.path.join(ROOT, BUILD_DIR))[:5]
    log(f"built in {seconds:.0f} s" + (f"; slowest object {slowest[0][1]} {slowest[0][0]:.0f} s" if slowest else ""))
    return seconds, slowest


def _kill_group(proc):
    """Ends the process group gpu-check started for one step (the step's own children included)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _run(cmd, log_path, timeout, env, mode="w"):
    """Runs ``cmd`` in the checkout with its output in ``log_path``; the exit status, or None when
    it ran out of time (then it is killed, with its children)."""
    with open(log_path, mode) as f:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            return proc.wait(timeout=max(timeout, 1))
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            return None


def pytest_counts(prefix):
    """{outcome: count} and {test file: {outcome: count}} of a pytest step's state files."""
    sys.path.insert(0, PLUGIN_DIR)
    try:
        from gpu_check_progress import done_ids
    finally:
        sys.path.remove(PLUGIN_DIR)
    done = done_ids(prefix)
    counts, files = {}, {}
    for nodeid, outcome in done.items():
        counts[outcome] = counts.get(outcome, 0) + 1
        per = files.setdefault(nodeid.split("::")[0], {})
        per[outcome] = per.get(outcome, 0) + 1
    return done, counts, files


BAD = ("failed", "error", "crashed", "timed out")


def fmt_counts(counts):
    order = ["passed", "failed", "error", "crashed", "timed out", "skipped", "xfailed", "xpassed"]
    return ", ".join(f"{counts[k]} {k}" for k in order if counts.get(k)) or "no tests"


class Steps:
    """The steps of one run, each under min(its cap, what is left of the budget)."""

    def __init__(self, py, out, budget, max_failures=MAX_FAILURES, start=None):
        self.py, self.out = py, out
        self.end = (time.monotonic() if start is None else start) + budget
        self.max_failures = max_failures
        self.rows, self.failed = [], False

    def left(self):
        return self.end - time.monotonic()

    def _skip(self, name, min_seconds):
        if self.left() >= min_seconds:
            return False
        self.rows.append({"step": name, "result": "skipped: out of time", "seconds": 0})
        log(f"{name}: skipped (out of time)")
        return True

    def _finish(self, row, correctness, start):
        row["seconds"] = time.monotonic() - start
        self.failed |= correctness and row["result"] != "ok"
        self.rows.append(row)
        log(f"{row['step']}: {row['result']}" + (f" ({row['counts_text']})" if row.get("counts_text") else "")
            + f" in {row['seconds']:.0f} s")
        return row

    def run(self, name, args, correctness, cap, log_name, min_seconds=20, parse=None, budget=None):
        """A script step: ``py *args``; ``parse(log text)`` gives its counts. With ``budget`` (a
        benchmark's own): ``--budget`` of that many seconds, or fewer where less is left (keeping
        the margin ``cap - budget`` for what is in flight when the benchmark's budget runs out)."""
        if self._skip(name, min_seconds):
            return None
        log(f"{name} ({self.left():.0f} s left)")
        if budget is not None:
            margin = cap - budget
            budget = max(min_seconds - margin, min(budget, self.left() - margin))
            args, cap = [*args, "--budget", f"{budget:.0f}"], budget + margin
        path = os.path.join(self.out, log_name)
        start = time.monotonic()
        rc = _run([self.py, *args], path, min(cap, self.left()), step_env())
        if rc is None:
            result = "FAILED (out of time)" if correctness else "stopped: out of time"
        else:
            result = "ok" if rc == 0 else f"FAILED (exit {rc})"
        with open(path, errors="replace") as f:
            text = f.read()
        row = {"step": name, "result": result, "log": log_name, "tail": text.strip().splitlines()[-3:]}
        if parse is not None:
            row.update(parse(text))
        return self._finish(row, correctness, start)

    def pytest(self, name, targets, correctness, cap, log_name, select=None, min_seconds=30):
        """A pytest step over ``targets``: no -x; at most max_failures failures; a process that
        dies is resumed after the test that killed it (at most MAX_CRASHES times)."""
        if self._skip(name, min_seconds):
            return None
        log(f"{name} ({self.left():.0f} s left)")
        path = os.path.join(self.out, log_name)
        prefix = os.path.join(self.out, os.path.splitext(log_name)[0])
        for suffix in (".done", ".current"):
            if os.path.exists(prefix + suffix):
                os.remove(prefix + suffix)
        start, deadline = time.monotonic(), time.monotonic() + min(cap, self.left())
        env = step_env(PLUGIN_DIR, FAKEQUANT_GPU_CHECK_STATE=prefix)
        crashes, stopped, mode = [], None, "w"
        while True:
            done, counts, _ = pytest_counts(prefix)
            room = self.max_failures - sum(counts.get(k, 0) for k in BAD)
            if room <= 0:
                break
            cmd = [self.py, "-m", "pytest", "-q", "-rfE", "--tb=short", "-p", "no:randomly", "-p", "no:cacheprovider",
                   "-p", "gpu_check_progress", f"--maxfail={room}", *(["-k", select] if select else []), *targets]
            rc = _run(cmd, path, deadline - time.monotonic(), env, mode)
            mode = "a"
            current = open(prefix + ".current").read().strip() if os.path.exists(prefix + ".current") else ""
            if rc is None:
                stopped = "out of time"
                if current:
                    self._record(prefix, "timed out", current)
                break
            if rc in (0, 1, 5) or not current:
                if rc not in (0, 1, 5):
                    stopped = f"pytest exit {rc}"
                break
            # the process died inside a test: record it, and resume after it
            self._record(prefix, "crashed", current)
            crashes.append(f"{current} (exit {rc})")
            with open(path, "a") as f:
                f.write(f"\n[gpu-check] the test process died (exit {rc}) in {current}; resuming after it\n")
            log(f"  the test process died (exit {rc}) in {current}")
            if len(crashes) >= MAX_CRASHES:
                stopped = f"stopped after {MAX_CRASHES} crashes"
                break
            if deadline - time.monotonic() < 5:
                stopped = "out of time"
                break
        done, counts, files = pytest_counts(prefix)
        bad = sorted(k for k, v in done.items() if v in BAD)
        if not stopped and len(bad) >= self.max_failures:
            stopped = f"stopped after {self.max_failures} failures"
        ok = not bad and not stopped and counts.get("passed", 0) > 0
        result = "ok" if ok else "FAILED" if correctness else "incomplete"
        if stopped:
            result += f" ({stopped})"
        row = {"step": name, "result": result, "log": log_name, "targets": targets, "select": select,
               "counts": counts, "counts_text": fmt_counts(counts), "files": files,
               "bad": [f"{done[k]}: {k}" for k in bad], "crashes": crashes}
        return self._finish(row, correctness, start)

    @staticmethod
    def _record(prefix, outcome, nodeid):
        with open(prefix + ".done", "a") as f:
            f.write(f"{outcome}\t{nodeid}\n")


def fingerprint_counts(path):
    """A parse function for a fingerprint step: configurations per operator, and differences."""
    def parse(text):
        row = {}
        if os.path.exists(path):
            with open(path) as f:
                prints = json.load(f)
            per_op = {}
            for key in prints:
                op = key.split("/")[0]
                per_op[op] = per_op.get(op, 0) + 1
            row["operators"] = per_op
            row["counts_text"] = f"{len(prints)} configurations of {len(per_op)} operators"
        compared = re.search(r"^(\d+) identical, (\d+) differ, (\d+) in one run only$", text, flags=re.M)
        if compared:
            same, differ, only = map(int, compared.groups())
            row["counts"] = {"identical": same, "differ": differ, "in one run only": only}
            row["counts_text"] = f"{same} identical, {differ} differ, {only} in one run only"
            row["bad"] = [line for line in text.splitlines() if line.startswith(("DIFFERS", "ONLY IN ONE"))]
        return row
    return parse


def fakequant_counts(path):
    """A parse function for ``python -m fakequant gpu-check``: its cases and failures."""
    def parse(text):
        if not os.path.exists(path):
            return {}
        with open(path) as f:
            result = json.load(f)
        checks = [f"{c['name']}: {c['checked']} cases, {len(c['failures'])} failed" for c in result["correctness"]]
        checks += [f"compute-sanitizer {r['tool']}: {r['result']}" for r in result["sanitizer"]]
        bad = [f for c in result["correctness"] for f in c["failures"]]
        bad += [f"compute-sanitizer {r['tool']}: {r['result']}" for r in result["sanitizer"] if r["result"] == "FAILED"]
        cases = sum(c["checked"] for c in result["correctness"])
        return {"checks": checks, "bad": bad,
                "counts_text": f"{cases} cases, {len(bad)} failed; "
                               + ", ".join(f"{r['tool']} {r['result']}" for r in result["sanitizer"])}
    return parse


def bench_ops_counts(path):
    """A parse function for bench_ops.py: the operators it timed."""
    def parse(text):
        if not os.path.exists(path):
            return {}
        with open(path) as f:
            ops = sorted({r["op"] for r in json.load(f)["rows"]})
        return {"operators": ops, "counts_text": f"{len(ops)} operators" if ops else ""}
    return parse


def plan(out):
    """The steps, in the order of what they answer: correctness, then the bandwidth table, then
    the compiled QAT step. Each is (method, keyword arguments); ``run_plan`` runs them."""
    fq = os.path.join(out, "fakequant")
    cpu_json, cuda_json = os.path.join(out, "fingerprints_cpu.json"), os.path.join(out, "fingerprints_cuda.json")
    return [
        ("run", dict(name="fakequant gpu-check (rule, CPU vs CUDA, compute-sanitizer)", correctness=True, cap=100,
                     log_name="fakequant.log", parse=fakequant_counts(os.path.join(fq, "report.json")),
                     args=["-m", "fakequant", "gpu-check", "--out", fq, "--budget", "90", "--max-log2", "26"])),
        ("pytest", dict(name="tests/test_cuda.py", targets=["tests/test_cuda.py"], correctness=True, cap=120,
                        log_name="test_cuda.log")),
        ("pytest", dict(name="operator suite, CUDA cases", targets=OPERATOR_SUITE, select="cuda", correctness=True,
                        cap=120, log_name="operator_suite.log")),
        ("run", dict(name="fingerprints on the CPU", correctness=True, cap=60, log_name="fingerprints_cpu.log",
                     args=["tools/op_fingerprint.py", "--out", cpu_json], parse=fingerprint_counts(cpu_json))),
        ("run", dict(name="fingerprints on CUDA, compared with the CPU's", correctness=True, cap=90,
                     log_name="fingerprints_cuda.log", parse=fingerprint_counts(cuda_json),
                     args=["tools/op_fingerprint.py", "--device", "cuda", "--out", cuda_json, "--compare", cpu_json])),
        # every format, float32 and bfloat16, forward and forward+backward, 2^28 (memory allowing), 2^24
        # and 2^10..2^20, each (size, dtype) printed as it completes; about a minute (issue 36, item 5)
        ("run", dict(name="benchmarks/bench_ops.py (bandwidth, per-call time)", correctness=False, cap=BENCH_OPS_CAP,
                     log_name="bench_ops.md", parse=bench_ops_counts(os.path.join(out, "ops.json")),
                     budget=BENCH_OPS_BUDGET, args=["benchmarks/bench_ops.py", "--device", "cuda", "--no-progress",
                                                    "--json", os.path.join(out, "ops.json")])),
        # the library's streaming kernels beside variants that change one thing each (loads in flight,
        # registers, per token the next row's prefetch), against cudaMemcpyAsync, each variant
        # checked bit for bit against the library's kernel (exit 2 where one differs); about 40 s
        ("run", dict(name="benchmarks/loop_shapes.py (loop shapes, prefetch)", correctness=True, cap=LOOP_SHAPES_CAP,
                     log_name="loop_shapes.md", args=["benchmarks/loop_shapes.py", "--log2", "28", "--rounds", "15"])),
        # float and fakequant, eager, compiled and compiled under CUDA graphs (which take the host's time
        # per launch out of a step), of the three models, each model's table printed as it completes;
        # what is left of the run, up to four minutes, compiles included (issue 36, item 3)
        ("run", dict(name="benchmarks/bench_compiled_qat.py (resnet, llama, moe)", correctness=False,
                     cap=COMPILED_CAP, min_seconds=60, log_name="compiled_qat.md", budget=COMPILED_BUDGET, args=[
                         "benchmarks/bench_compiled_qat.py", "--device", "cuda", "--models", "resnet,llama,moe",
                         "--cudagraphs", "--no-progress", "--json", os.path.join(out, "compiled_qat.json")])),
    ]


def run_plan(steps, planned, only=None):
    for method, kwargs in planned:
        if only is None or any(o in kwargs["name"] for o in only):
            getattr(steps, method)(**kwargs)


def report(out, info, build, steps, budget, total_s):
    build_s, slowest = build
    lines = ["# make gpu-check", "",
             f"- GPU: {info.get('name')} (compute capability {info.get('capability')}), {os.cpu_count()} cores",
             f"- torch {info['torch']}, CUDA {info['cuda']}; Python {sys.version.split()[0]}",
             f"- fakequant: {info.get('file')} (built for {info.get('arch')}); checkout {source_state() or 'unknown'}",
             f"- build: {build_s:.0f} s" + (" (slowest objects: " + ", ".join(f"{o} {s:.0f} s" for s, o in slowest) + ")"
                                            if slowest else ""),
             f"- whole run: {total_s:.0f} s of a {budget:.0f} s budget (build included)", "",
             "| step | result | counts | seconds | log |", "|---|---|---|---:|---|"]
    for r in steps.rows:
        lines.append(f"| {r['step']} | {r['result']} | {r.get('counts_text', '')} | {r.get('seconds', 0):.0f} | "
                     f"{r.get('log', '')} |")
    lines += ["", "## What was checked", ""]
    for r in steps.rows:
        if r.get("files"):
            lines.append(f"- {r['step']}" + (f" (pytest -k {r['select']})" if r.get("select") else "") + ":")
            lines += [f"  - {f}: {fmt_counts(c)}" for f, c in sorted(r["files"].items())]
        elif r.get("operators"):
            ops = r["operators"]
            lines.append(f"- {r['step']}: " + (", ".join(f"{k} ({v})" for k, v in sorted(ops.items()))
                                                if isinstance(ops, dict) else ", ".join(ops)))
        elif r.get("checks"):
            lines.append(f"- {r['step']}: " + "; ".join(r["checks"]))
        elif "result" in r:
            lines.append(f"- {r['step']}: {r['result']}")
    failing = [r for r in steps.rows if r.get("bad") or r.get("crashes")]
    if failing:
        lines += ["", "## Failures", ""]
        for r in failing:
            lines.append(f"### {r['step']}")
            lines += [""] + [f"- {b}" for b in r.get("bad", [])[:200]] + [f"- died in {c}" for c in r.get("crashes", [])]
            lines.append("")
    for title, path in (("python -m fakequant gpu-check", os.path.join(out, "fakequant", "report.md")),
                        ("benchmarks/bench_ops.py", os.path.join(out, "bench_ops.md")),
                        ("benchmarks/bench_compiled_qat.py", os.path.join(out, "compiled_qat.md"))):
        if os.path.exists(path):
            with open(path, errors="replace") as f:
                lines += ["", f"## {title}", "", f.read()]
    lines += ["", f"Verdict: {'FAILED' if steps.failed else 'ok'}", ""]
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write("\n".join(lines))
    with open(os.path.join(out, "report.json"), "w") as f:
        json.dump({"info": info, "build_s": build_s, "slowest_objects": slowest, "steps": steps.rows,
                   "failed": steps.failed, "seconds": total_s, "budget": budget}, f, indent=1)


def summary(out, info, build, steps, total_s, budget):
    """One screen: the device, the build, each step's result and counts, the first failures."""
    rule = "-" * 78
    lines = [rule, f"gpu-check: {info.get('name')} (cc {info.get('capability')}), torch {info['torch']}, "
             f"build {build[0]:.0f} s, whole run {total_s:.0f} s of {budget:.0f} s", rule]
    for r in steps.rows:
        lines.append(f"{r['result'][:34]:<34} {r.get('seconds', 0):>4.0f} s  {r['step']}")
        if r.get("counts_text"):
            lines.append(f"{'':<42}{r['counts_text'][:90]}")
    bad = [(r["step"], b) for r in steps.rows for b in r.get("bad", [])]
    if bad:
        lines += [rule, f"first failures ({len(bad)} in all; report.md lists them):"]
        lines += [f"  {b[:110]}" for _, b in bad[:8]]
    lines += [rule, f"{'FAILED' if steps.failed else 'ok'}: {os.path.join(out, 'report.md')}", rule]
    print("\n".join(lines), flush=True)


def main():
    start = time.monotonic()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--py", default=sys.executable, help="the Python to check (default: this one)")
    parser.add_argument("--out", default=os.path.join("build", "gpu-check"))
    parser.add_argument("--budget", type=float, default=DEFAULT_BUDGET,
                        help="seconds for the whole run, the build included (default: %(default)s)")
    parser.add_argument("--max-failures", type=int, default=MAX_FAILURES,
                        help="a pytest step stops after this many failures (default: %(default)s)")
    parser.add_argument("--only", help="only the steps whose names contain one of these (comma-separated)")
    parser.add_argument("--no-build", action="store_true", help="check the fakequant the checkout has, unbuilt")
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
    built = (0.0, []) if args.no_build else build(args.py, info, out)
    info = probe(args.py)
    if "import_error" in info:
        raise SystemExit(f"gpu-check: fakequant does not import after the build: {info['import_error']}")
    if not os.path.realpath(info["file"]).startswith(os.path.realpath(ROOT) + os.sep):
        raise SystemExit(f"gpu-check: the fakequant imported is {info['file']}, not this checkout's")
    if not info.get("built_cuda"):
        raise SystemExit(f"gpu-check: the fakequant of {ROOT} was built without CUDA (run without --no-build)")
    log(f"fakequant {info['file']}, built for {info['arch']}; {args.budget - (time.monotonic() - start):.0f} s left")
    steps = Steps(args.py, out, args.budget, args.max_failures, start=start)
    run_plan(steps, plan(out), args.only.split(",") if args.only else None)
    total = time.monotonic() - start
    report(out, info, built, steps, args.budget, total)
    summary(out, info, built, steps, total, args.budget)
    return 1 if steps.failed else 0


if __name__ == "__main__":
    sys.exit(main())
