"""One QAT training step (forward, backward, SGD) eager and under torch.compile
(Inductor, CPU), for two models:

- resnet: the ResNet-18-shaped model of bench_qat_step.py (batch 16, 3x64x64);
  fakequant.quantize_model's default recipe (8-bit inputs per tensor, weights per
  channel, max calibration);
- llama: a small Llama-style decoder from transformers (4 layers, hidden 256,
  batch 4 x 128 tokens, causal LM loss); the W8A8 preset (int8 weights per
  channel, int8 activations per token, dynamic).
- host (not in the default set): 40 linear layers of width 32 on 4 rows, quantize_model's
  default recipe as the ResNet's: a step that is the host's time, the calls a configuration makes.
- moe: a small Qwen3-MoE decoder (2 layers, hidden 128, 8 experts of 128, 2 per token,
  batch 4 x 64 tokens), the W8A8 preset, fused experts included (fakequant.models.experts).
  Compiled, fakequant's experts run every expert on every token (no data-dependent
  shapes), transformers' float ones grouped by expert.

Configurations: float; fakequant eager; fakequant compiled with each compiled path
(fakequant.set_compiled_path: "opaque", the C++ operators called from the graph, the
default; "composite", the plain-PyTorch rules Inductor fuses); fakequant compiled with the operators'
backward as the default does not take it on the device (fakequant.composite.compiled's
FUSED_BACKWARD_DEVICE_TYPES): on the CPU fused into Inductor's kernels ("fused backward"), on
CUDA, for the ResNet, a call of mask_backward ("mask_backward op"); a plain-PyTorch fake quantization with the
same rule (round with a straight-through estimator, clamp: torchao's way of writing
it) eager and compiled; torchao's QAT (QATConfig with IntxFakeQuantizeConfig: int8
per-token activations, asymmetric as torchao supports them, int8 per-channel
weights) eager and compiled, for the llama model only (torchao's QAT converts
nn.Linear, not convolutions).

- Step time: the median over rounds, every configuration stepped in turn each round.
- Compile time: the first two steps of a compiled configuration less two steps.
- Graph breaks: those Dynamo counted while the configuration compiled (its first two steps).
- Peak memory: the peak resident set size over two steps less the size before them,
  after glibc's malloc_trim has returned freed memory (VmHWM reset through
  /proc/self/clear_refs): what the step allocates at its peak, roughly.
- Saved for backward: the bytes autograd keeps for backward (saved_tensors_hooks;
  under torch.compile, what the compiled graph's partitioner chose to save).
- Per step, from torch.profiler (a second table): fakequant's operator calls, and on CUDA the
  kernel launches and the GPU's kernel time, also as a share of the step's time (a small share:
  the step is the host's time); the JSON keeps each configuration's top events by host time.

    python benchmarks/bench_compiled_qat.py [--models resnet,llama,moe,host] [--rounds 7] [--json PATH]
    python benchmarks/bench_compiled_qat.py --device cuda --budget 240
    python benchmarks/bench_compiled_qat.py --device cuda --models resnet --cudagraphs

Inductor's caches are turned off, so that compile times are those of a first run. Each
model's table is printed as it completes. On CUDA the defaults are the target's
configurations (float and fakequant, eager and compiled), 5 rounds of 10 steps a
sample; ``--budget`` bounds the whole run, compiles included. ``--cudagraphs`` (CUDA) adds float
and fakequant compiled with Inductor's CUDA graphs (``mode="reduce-overhead"``), each against
the other: where a step is the host's time per launch (the H200's ResNet-18: float eager 7.7 ms,
compiled 7.9), they compare the GPU's work instead.
"""
import os

os.environ.setdefault("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")  # before torch reads its config

import contextlib  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
from torch import nn  # noqa: E402

import fakequant  # noqa: E402
from _common import (ResNet18, add_output_options, argument_parser, new_storage_bytes, progress_bar,  # noqa: E402
                     status_mb, write_json)
from fakequant import ops as fq_ops  # noqa: E402

torch._dynamo.config.cache_size_limit = 64  # every configuration has its own compiled graphs

MODELS = ("resnet", "llama", "moe")


# --- plain-PyTorch fake quantization with fakequant's rule --------------------------------


class _RoundSTE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return torch.round(x)

    @staticmethod
    def backward(ctx, grad):
        return grad


def _plain(x, amax, bound, qmin):
    """clamp(round_ste(x / s), qmin, bound) * s with s = amax / bound: the gradient passes
    where round(x / s) is inside the range (clamp's backward), as fakequant's mask."""
    s = amax.float() / bound
    return (torch.clamp(_RoundSTE.apply(x / s), qmin, bound) * s).to(x.dtype)


def plain_fake_quantize_amax(input, amax, num_bits=8, unsigned=False, narrow_range=True, pass_through=False, *,
                             return_mask=False, check_values=True):
    bound = 2 ** (num_bits - 1 + int(unsigned)) - 1
    qmin = 0 if unsigned else (-bound if narrow_range else -bound - 1)
    return _plain(input, torch.as_tensor(amax, device=input.device), bound, qmin)


def plain_fake_quantize_blockwise(input, block_size, num_bits=8, unsigned=False, narrow_range=True, exponent_bits=0,
                                  scale_amax=None, check_values=True, e8m0_scale=False, centered=False, axis=-1):
    """Per-token (one block per row) integers, the W8A8 preset's activations."""
    assert block_size == input.shape[-1] and exponent_bits == 0 and not centered and axis in (-1, input.dim() - 1)
    bound = 2 ** (num_bits - 1 + int(unsigned)) - 1
    qmin = 0 if unsigned else (-bound if narrow_range else -bound - 1)
    return _plain(input, input.detach().abs().amax(-1, keepdim=True), bound, qmin)


@contextlib.contextmanager
def _plain_ops():
    saved = fq_ops.fake_quantize_amax, fq_ops.fake_quantize_blockwise
    fq_ops.fake_quantize_amax, fq_ops.fake_quantize_blockwise = plain_fake_quantize_amax, plain_fake_quantize_blockwise
    try:
        yield
    finally:
        fq_ops.fake_quantize_amax, fq_ops.fake_quantize_blockwise = saved


@contextlib.contextmanager
def _path(path):
    saved = fakequant.compiled_path()
    fakequant.set_compiled_path(path)
    try:
        yield
    finally:
        fakequant.set_compiled_path(saved)


@contextlib.contextmanager
def _fused_backward(device_types):
    """The opaque path with the operators' backward fused into Inductor's kernels on
    `device_types` (fakequant.composite.compiled.FUSED_BACKWARD_DEVICE_TYPES), elsewhere a call of
    mask_backward: the choice the default does not make on a device, measured against it."""
    from fakequant.composite import compiled

    saved = compiled.FUSED_BACKWARD_DEVICE_TYPES
    compiled.FUSED_BACKWARD_DEVICE_TYPES = device_types
    try:
        with _path("opaque"):
            yield
    finally:
        compiled.FUSED_BACKWARD_DEVICE_TYPES = saved


# --- models ---------------------------------------------------------------------------


def resnet_model_and_data(batch=16):
    torch.manual_seed(0)
    data = (torch.randn(batch, 3, 64, 64), torch.randint(0, 100, (batch,)))
    return ResNet18(), data, lambda model, d: nn.functional.cross_entropy(model(d[0]), d[1])


def llama_model_and_data(batch=4, tokens=128):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=2048, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=tokens)
    config._attn_implementation = "sdpa"
    ids = torch.randint(0, config.vocab_size, (batch, tokens))
    return LlamaForCausalLM(config), (ids,), lambda model, d: model(input_ids=d[0], labels=d[0]).loss


def moe_model_and_data(batch=4, tokens=64):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(0)
    config = Qwen3MoeConfig(vocab_size=2048, hidden_size=128, intermediate_size=256, moe_intermediate_size=128,
                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, head_dim=32,
                            num_experts=8, num_experts_per_tok=2, max_position_embeddings=tokens)
    config._attn_implementation = "sdpa"
    ids = torch.randint(0, config.vocab_size, (batch, tokens))
    return Qwen3MoeForCausalLM(config), (ids,), lambda model, d: model(input_ids=d[0], labels=d[0]).loss


def host_model_and_data(batch=4, width=32, layers=40):
    """A step that is the host's time: `layers` linear layers of width 32 with ReLU on 4 rows
    (with fakequant, two quantizers a layer: its input and its weight), so that a configuration's
    time is what its calls cost the host, as the GPU's steps of the small models are."""
    torch.manual_seed(0)
    model = nn.Sequential(*(m for _ in range(layers) for m in (nn.Linear(width, width), nn.ReLU())))
    data = (torch.randn(batch, width),)
    return model, data, lambda model, d: model(d[0]).square().mean()


MODEL_BUILDERS = {"resnet": resnet_model_and_data, "llama": llama_model_and_data, "moe": moe_model_and_data,
                  "host": host_model_and_data}


DEVICE = torch.device("cpu")  # --device


def build(model_name, quant):
    """(model, data, loss_fn) with the quantization `quant`: None, "fakequant" or "torchao"."""
    model, data, loss_fn = MODEL_BUILDERS[model_name]()
    model, data = model.to(DEVICE), tuple(t.to(DEVICE) for t in data)
    if quant == "fakequant":
        if model_name in ("resnet", "host"):
            fakequant.quantize_model(model)
            fakequant.calibrate(model, [data[0]], num_batches=1, progress=False)
        else:
            fakequant.quantize_model(model, preset="W8A8")
    elif quant == "torchao":
        from torchao.quantization import quantize_
        from torchao.quantization.qat import IntxFakeQuantizeConfig, QATConfig

        config = QATConfig(activation_config=IntxFakeQuantizeConfig(torch.int8, "per_token", is_symmetric=False),
                           weight_config=IntxFakeQuantizeConfig(torch.int8, "per_channel"), step="prepare")
        quantize_(model, config, filter_fn=lambda m, fqn: isinstance(m, nn.Linear) and "lm_head" not in fqn)
    model.train()
    return model, data, loss_fn


# configuration: (quantization, compiled, context)
CONFIGS = {
    "float eager": (None, False, contextlib.nullcontext),
    "float compiled": (None, True, contextlib.nullcontext),
    "fakequant eager": ("fakequant", False, contextlib.nullcontext),
    "fakequant compiled": ("fakequant", True, lambda: _path("opaque")),
    "fakequant compiled (composite)": ("fakequant", True, lambda: _path("composite")),
    # the operators' backward as the default does not take it on the device: fused into
    # Inductor's kernels (the default on CUDA), or a call of mask_backward (the default on the CPU)
    "fakequant compiled (fused backward)": ("fakequant", True, lambda: _fused_backward(("cpu", "cuda"))),
    "fakequant compiled (mask_backward op)": ("fakequant", True, lambda: _fused_backward(())),
    "plain PyTorch eager": ("fakequant", False, _plain_ops),
    "plain PyTorch compiled": ("fakequant", True, _plain_ops),
    "torchao QAT eager": ("torchao", False, contextlib.nullcontext),
    "torchao QAT compiled": ("torchao", True, contextlib.nullcontext),
    # CUDA only: Inductor's CUDA graphs (torch.compile's mode="reduce-overhead"), which replay a
    # graph's kernels without the host's time per launch, for float and fakequant alike
    "float compiled (CUDA graphs)": (None, True, contextlib.nullcontext),
    "fakequant compiled (CUDA graphs)": ("fakequant", True, lambda: _path("opaque")),
}
CUDA_GRAPH_CONFIGS = ("float compiled (CUDA graphs)", "fakequant compiled (CUDA graphs)")


def _mode(name):
    """The float configuration a configuration is compared with: the same mode's."""
    if name in CUDA_GRAPH_CONFIGS:
        return "float compiled (CUDA graphs)"
    return "float compiled" if CONFIGS[name][1] else "float eager"


def _backend(name):
    """Inductor under a name of its own: each configuration compiles its own graphs (Dynamo
    keeps a cache entry per backend), so that configurations interleave without recompiling."""
    from torch._inductor.compile_fx import compile_fx

    patches = {"triton.cudagraphs": True} if name in CUDA_GRAPH_CONFIGS else None

    def backend(gm, example_inputs):
        return compile_fx(gm, example_inputs, config_patches=patches)

    backend.__name__ = "inductor_" + "".join(c if c.isalnum() else "_" for c in name)
    return backend


class Run:
    def __init__(self, model_name, name):
        quant, self.compiled, self.context = CONFIGS[name]
        self.name = name
        self.model, self.data, self.loss_fn = build(model_name, quant)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-4, momentum=0.9)
        self.call = torch.compile(self.model, backend=_backend(name)) if self.compiled else self.model

    def step(self):
        with self.context():
            loss = self.loss_fn(self.call, self.data)
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
        return loss


def _reset_peak():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
        return True
    except OSError:
        return False


def peak_step_mb(run):
    import ctypes
    import gc

    if DEVICE.type == "cuda":  # what the step allocates at its peak, beyond what it holds before
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        run.step()
        run.step()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - before) / 2**20

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        return None
    before = status_mb("VmRSS")
    if not _reset_peak():
        return None
    run.step()
    run.step()
    return status_mb("VmHWM") - before


def saved_mb(run):
    seen, total = set(), [0]

    def pack(t):
        total[0] += new_storage_bytes(seen, t)
        return t

    with run.context():
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = run.loss_fn(run.call, run.data)
        loss.backward()
    run.opt.zero_grad()
    return total[0] / 2**20


# The host's calls that launch a CUDA kernel (the runtime's and the driver's entry points)
LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx")


def profile_steps(run, steps, top=12):
    """Where `steps` steps go, per step, from one torch.profiler run: fakequant's operator calls
    (a call counted once, however many dispatch levels record it), the host's kernel launches and
    the GPU's kernel time (CUDA), and the `top` events by their own host time, for the JSON. On a
    GPU whose step is the host's time, the kernels take a small share of the step: what the step
    costs is then what each call costs the host (issue 36, item 3)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cuda = DEVICE.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    _sync()
    t0 = time.perf_counter()
    with profile(activities=activities) as prof:  # (a step enters its configuration's context)
        for _ in range(steps):
            run.step()
        _sync()
    wall_ms = (time.perf_counter() - t0) * 1e3 / steps
    events = prof.events()
    calls = sum(1 for e in events if e.name.startswith("fakequant::")
                and (e.cpu_parent is None or e.cpu_parent.name != e.name))
    launches = sum(1 for e in events if e.name in LAUNCHES)
    kernel_us = sum(e.device_time_total for e in events if e.device_type == DeviceType.CUDA) if cuda else None
    averages = sorted(prof.key_averages(), key=lambda a: a.self_cpu_time_total, reverse=True)[:top]
    return dict(fakequant_calls=calls / steps, launches=launches / steps if cuda else None,
                gpu_kernel_ms=kernel_us / 1e3 / steps if cuda else None, profiled_step_ms=wall_ms,
                top_host=[dict(name=a.key, calls=a.count / steps, self_host_us=a.self_cpu_time_total / steps)
                          for a in averages])


def graph_break_count():
    """Graph breaks Dynamo has met in this process so far (its counters), and the frames it ran
    eagerly instead of compiling them (its "unimplemented" counter: a backend that failed, as
    Inductor did on the MoE's float experts on an H200, where Dynamo logs "Adding a graph break"
    and counts no graph break): the difference over a configuration's first two steps is the
    breaks of its compile (no second trace, as torch._dynamo.explain would make)."""
    from torch._dynamo.utils import counters

    return sum(counters["graph_break"].values()) + sum(counters["unimplemented"].values())


def _sync():
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def _log(message):
    print(f"[compiled QAT {time.strftime('%H:%M:%S')}] {message}", flush=True)


def measure(model_name, configs, rounds, progress=None, deadline=None, steps=1, compile_s=None,
            compile_deadline=None):
    """Rows of one model: each configuration built and stepped twice (compiling it), then `rounds`
    rounds, every configuration in turn, each sample `steps` steps; then its memory and saved bytes
    (graph breaks are counted while it compiles). Past `deadline` (time.monotonic()), the rounds
    stop (after the first) and the memory figures are left out. The compiled configurations are
    built first (the target compares them with each other), none of them where their builds, at
    the longest build of a compiled configuration so far (`compile_s`, a one-element list kept
    across models), would end past `compile_deadline` (default: `deadline`); the eager ones unless
    that has passed. What is left out is named."""
    def late(need=0.0, until=deadline):
        return until is not None and time.monotonic() + need > until

    compile_deadline = deadline if compile_deadline is None else compile_deadline
    compile_s = [0.0] if compile_s is None else compile_s
    compiled = [c for c in configs if CONFIGS[c][1]]
    runs, rows = {}, {}
    for name in compiled + [c for c in configs if not CONFIGS[c][1]]:
        if CONFIGS[name][1]:
            # all the compiled ones or none: one alone is not the comparison
            todo = [c for c in compiled if c not in rows]
            skip = any(rows.get(c, {}).get("error", "").startswith("not measured") for c in compiled) or \
                late(compile_s[0] * len(todo), compile_deadline)
        else:  # (an eager configuration builds in seconds)
            skip = late(0.0, compile_deadline)
        if skip:
            rows[name] = dict(config=name, error="not measured: out of time" + (
                f" (a compiled configuration took {compile_s[0]:.0f} s to build)"
                if CONFIGS[name][1] and compile_s[0] and not late(0.0, compile_deadline) else ""))
            if progress is not None:
                progress.update(1)
            continue
        t0, breaks = time.perf_counter(), graph_break_count()
        try:
            run = Run(model_name, name)
            run.step()
            run.step()
            _sync()
        except Exception as e:  # a peer that does not run here: reported, not fatal
            rows[name] = dict(config=name, error=f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
            if progress is not None:
                progress.update(1)
            continue
        runs[name] = run
        rows[name] = dict(config=name, first_two_steps_s=time.perf_counter() - t0,
                          graph_breaks=graph_break_count() - breaks if run.compiled else None)
        if run.compiled:
            compile_s[0] = max(compile_s[0], rows[name]["first_two_steps_s"])
        _log(f"{model_name}, {name}: built and stepped twice in {rows[name]['first_two_steps_s']:.1f} s")
        if progress is not None:
            progress.update(1)
    runs = {name: runs[name] for name in configs if name in runs}  # interleaved in the configs' order
    samples = {name: [] for name in runs}
    for i in range(rounds):
        if i and late():
            break
        for name, run in list(runs.items()):
            _sync()
            t0 = time.perf_counter()
            try:
                for _ in range(steps):
                    run.step()
                _sync()
            except Exception as e:  # (CUDA graphs record on a later step than the two of the build)
                rows[name]["error"] = f"{type(e).__name__} in round {i + 1}: {str(e).splitlines()[0][:200]}"
                del runs[name], samples[name]
                continue
            samples[name].append((time.perf_counter() - t0) / steps)
        if progress is not None:
            progress.update(1)
    for name, run in runs.items():
        step = statistics.median(samples[name])
        row = rows[name]
        row["step_ms"] = step * 1e3
        row["rounds"], row["steps_per_sample"] = len(samples[name]), steps
        row["step_ms_quartiles"] = ([q * 1e3 for q in statistics.quantiles(samples[name], n=4)]
                                    if len(samples[name]) > 1 else None)
        row["compile_s"] = max(row["first_two_steps_s"] - 2 * step, 0.0) if run.compiled else None
        if late():
            row.update(peak_step_mb=None, saved_mb=None, extras="not measured: out of time")
            continue
        t0 = time.perf_counter()
        try:
            row["peak_step_mb"] = peak_step_mb(run)
            row["saved_mb"] = saved_mb(run)
        except Exception as e:  # (the step's time stands)
            row.update(peak_step_mb=None, saved_mb=None, extras=f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
        try:
            row["profile"] = profile_steps(run, steps)
        except Exception as e:  # (the rest stands)
            row["profile_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        row["extras_s"] = time.perf_counter() - t0
    for name, row in rows.items():
        if "step_ms" in row:
            ref, eager = (rows.get(c, {}).get("step_ms") for c in (_mode(name), "float eager"))
            row["vs_float_same_mode"] = row["step_ms"] / ref if ref else None
            row["vs_float_eager"] = row["step_ms"] / eager if eager else None
    return [rows[n] for n in configs]


def configs_for(model_name):
    if model_name == "moe":  # (torchao's QAT converts nn.Linear: the experts would stay float)
        return ["float eager", "float compiled", "fakequant eager", "fakequant compiled",
                *(CUDA_GRAPH_CONFIGS if DEVICE.type == "cuda" else ())]
    return [c for c in CONFIGS if not (model_name in ("resnet", "host") and c.startswith("torchao"))
            and (c not in CUDA_GRAPH_CONFIGS or DEVICE.type == "cuda")
            and c != ("fakequant compiled (mask_backward op)" if DEVICE.type == "cpu"
                      else "fakequant compiled (fused backward)")
            # (on CUDA the ResNet alone: each compiled configuration is a build within gpu-check's budget)
            and (c != "fakequant compiled (mask_backward op)" or model_name in ("resnet", "host"))]


def run(models, rounds, progress=True, only=None, budget=None, steps=1, on_model=None):
    """Every model's rows; with `budget` (seconds), each model's rounds and memory figures get an
    equal share of what is left when it starts, and a compile is started only where it would end
    within the budget (measure); `on_model(model, rows)` is called as each model completes."""
    start = time.monotonic()
    result = {"rounds": rounds, "steps_per_sample": steps, "threads": torch.get_num_threads(),
              "torch": torch.__version__, "budget_s": budget, "models": {}}
    total = sum(len([c for c in configs_for(m) if only is None or c in only]) + rounds for m in models)
    compile_s = [0.0]
    with progress_bar(total, "compiled QAT step", progress) as bar:
        for i, m in enumerate(models):
            deadline = None
            if budget is not None:
                left = budget - (time.monotonic() - start)
                deadline = time.monotonic() + left / (len(models) - i)
            torch._dynamo.reset()
            t0 = time.monotonic()
            result["models"][m] = measure(m, [c for c in configs_for(m) if only is None or c in only], rounds, bar,
                                          deadline=deadline, steps=steps, compile_s=compile_s,
                                          compile_deadline=None if budget is None else start + budget)
            result.setdefault("model_s", {})[m] = time.monotonic() - t0
            if on_model is not None:
                on_model(m, result["models"][m])
    result["seconds"] = time.monotonic() - start
    return result


def _fmt(v, spec):
    return "" if v is None else format(v, spec)


def format_tables(result):
    lines = []
    for model, rows in result["models"].items():
        lines += [f"**{model}**", "",
                  "| configuration | step (ms) | x float (same mode) | x float eager | compile (s) | graph breaks "
                  "| peak step memory (MB) | saved for backward (MB) |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for r in rows:
            if "error" in r:
                what = r["error"] if r["error"].startswith("not measured") else f"did not run: {r['error']}"
                lines.append(f"| {r['config']} | {what} | | | | | | |")
                continue
            lines.append(f"| {r['config']} | {r['step_ms']:.1f} | {_fmt(r['vs_float_same_mode'], '.3f')} | "
                         f"{_fmt(r['vs_float_eager'], '.3f')} | {_fmt(r['compile_s'], '.1f')} | "
                         f"{_fmt(r['graph_breaks'], 'd')} | {_fmt(r['peak_step_mb'], '.0f')} | "
                         f"{_fmt(r['saved_mb'], '.1f')} |")
        no_extras = [f"{r['config']} ({r['extras'].removeprefix('not measured: ')})" for r in rows if r.get("extras")]
        if no_extras:
            lines += ["", "Memory and saved bytes not measured: " + ", ".join(no_extras)]
        profiled = [r for r in rows if r.get("profile")]
        if profiled:
            lines += ["", f"Per step, from torch.profiler ({model}):", "",
                      "| configuration | fakequant operator calls | kernel launches | GPU kernel time (ms) "
                      "| of the step's time |", "|---|---:|---:|---:|---:|"]
            for r in profiled:
                p = r["profile"]
                share = p["gpu_kernel_ms"] / r["step_ms"] if p["gpu_kernel_ms"] is not None else None
                lines.append(f"| {r['config']} | {p['fakequant_calls']:.0f} | {_fmt(p['launches'], '.0f')} | "
                             f"{_fmt(p['gpu_kernel_ms'], '.2f')} | {_fmt(share, '.0%')} |")
        unprofiled = [f"{r['config']} ({r['profile_error']})" for r in rows if r.get("profile_error")]
        if unprofiled:
            lines += ["", "Not profiled: " + ", ".join(unprofiled)]
        lines.append("")
    return "\n".join(lines)


# On CUDA: a step takes milliseconds, so each sample is several steps, and the configurations are
# the target's (fakequant compiled against float compiled, eager beside them), so that the three
# models take a few minutes, compiles included (issue 36, item 3; on an H100 each compiled
# configuration took 24-31 s to build; --budget bounds the run whatever the compiles take).
CUDA_CONFIGS = ("float eager", "float compiled", "fakequant eager", "fakequant compiled",
                "fakequant compiled (mask_backward op)")
CUDA_ROUNDS, CUDA_STEPS = 5, 10


def main():
    parser = argument_parser(__doc__)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--rounds", type=int, help=f"timing rounds (default: 7; {CUDA_ROUNDS} on CUDA)")
    parser.add_argument("--steps", type=int, help=f"steps a sample (default: 1; {CUDA_STEPS} on CUDA)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (Inductor's Triton kernels on CUDA)")
    parser.add_argument("--configs", help="a subset of the configurations, comma-separated: " + ", ".join(CONFIGS)
                        + " (default: all; on CUDA " + ", ".join(CUDA_CONFIGS) + ")")
    parser.add_argument("--cudagraphs", action="store_true",
                        help="on CUDA, add " + " and ".join(CUDA_GRAPH_CONFIGS) + " to the configurations")
    parser.add_argument("--budget", type=float, help="seconds for the whole run, compiles included: a model's "
                                                     "compiled configurations are built only where they would "
                                                     "end within it, and each model's rounds and memory figures "
                                                     "get an equal share of what is left; what is left out is "
                                                     "named")
    add_output_options(parser, progress=True)
    args = parser.parse_args()
    models = [m for m in args.models.split(",") if m]
    unknown = sorted(set(models) - set(MODEL_BUILDERS))
    if unknown:
        parser.error(f"unknown models {unknown}; choose from {list(MODEL_BUILDERS)}")
    global DEVICE
    DEVICE = torch.device(args.device)
    cuda = DEVICE.type == "cuda"
    chosen = [c.strip() for c in args.configs.split(",")] if args.configs else (list(CUDA_CONFIGS) if cuda else None)
    if args.cudagraphs:
        if not cuda:
            parser.error("--cudagraphs: CUDA graphs need --device cuda")
        chosen = [*chosen, *(c for c in CUDA_GRAPH_CONFIGS if c not in chosen)]
    if chosen:
        unknown = sorted(set(chosen) - set(CONFIGS))
        if unknown:
            parser.error(f"unknown configurations {unknown}; choose from {list(CONFIGS)}")
    rounds = args.rounds or (CUDA_ROUNDS if cuda else 7)
    steps = args.steps or (CUDA_STEPS if cuda else 1)
    where = torch.cuda.get_device_name() if cuda else f"{torch.get_num_threads()} threads"
    print(f"One SGD step, median of {rounds} rounds of {steps} step(s), configurations interleaved; {where}; "
          f"torch {torch.__version__}; Inductor ({DEVICE.type}) for the compiled rows"
          + (f"; budget {args.budget:.0f} s" if args.budget is not None else ""), flush=True)

    def on_model(model, rows):  # each model's table as it completes
        print(format_tables({"models": {model: rows}}), flush=True)

    result = run(models, rounds, not args.no_progress, only=chosen, budget=args.budget, steps=steps,
                 on_model=on_model)
    result["device"] = str(DEVICE)
    print(f"{len(result['models'])} models in {result['seconds']:.0f} s ("
          + ", ".join(f"{m} {s:.0f} s" for m, s in result["model_s"].items()) + ")", flush=True)
    write_json(args.json, result)


if __name__ == "__main__":
    main()
