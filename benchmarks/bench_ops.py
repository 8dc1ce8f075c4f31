"""Operator benchmark: fakequant against the memory-bandwidth limit and the peers.

For each operator, forward and forward+backward on the same tensor, timed in
one process with the candidates interleaved round by round, so that machine
noise hits all of them alike:

- ``clone``: ``torch.clone`` of the input, the memory-bandwidth limit of an op
  that reads one tensor and writes a fresh one (forward+backward moves twice
  that, so its limit is two clones);
- ``torch``: ``torch.fake_quantize_per_tensor_affine`` / ``_per_channel_affine``
  (both run their cachemask variants: the forward computes the byte mask the
  backward uses, with or without grad);
- ``pq-python``: pytorch-quantization's ``fake_tensor_quant`` as its CPU path
  computes it, in plain PyTorch (saves the input for backward).

The FP8 row's peer ``torch`` is the plain-PyTorch float8 cast (what Model
Optimizer computes off its CUDA extension). The formats: per tensor (affine,
amax int8, min/max, FP8 E4M3, the integer ``quantize_amax``), per channel (affine
along axis 0 and along the last axis, amax), static blocks (``fake_quantize_amax``
with an amax per block of 32, as a calibrated block quantizer keeps it; peer
pq-python), the block-wise dynamic kernel (``fakequant.ops.fake_quantize_blockwise``
on rows of 4096: int8 in blocks of 32 and 128, int4 in blocks of 32, NVFP4 = E2M1 in
blocks of 16 with E4M3 block scales, MXFP8/MXFP6/MXFP4/MXINT8 in blocks of 32 with
E8M0 scales, per-token int8 and FP8: one block per row), and llama.cpp's Q8_0 and Q4_0
blocks (``fakequant.ops.fake_quantize_ggml``, a plain-PyTorch rule, no kernel). The
block-wise rows have no peer; their target is the time of a clone (1.3x or less on CPU).
Forward+backward is ``torch.autograd.grad`` of the input: nothing accumulates into
``.grad``.

    python benchmarks/bench_ops.py [--numel 16777216] [--device cpu] [--json PATH] [--thp]
    python benchmarks/bench_ops.py --sizes 2^10..2^26:2 --dtype float32,bfloat16
    python benchmarks/bench_ops.py --overhead            # microseconds per call, 2^10..2^14
    python benchmarks/bench_ops.py --device cuda        # or --device cpu,cuda
    python benchmarks/bench_ops.py --device cuda --budget 60

On CUDA, without ``--sizes`` and ``--dtype``: 2^28 elements (where the GPU's free
memory holds about 16 tensors of that size), 2^24, then 2^10 to 2^20 (every other
power of two), each in float32 and bfloat16, every format, forward and
forward+backward: about a minute. Each (size, dtype) group's table is printed as
it completes (microseconds per call; fakequant over clone, over each peer and over
``torch.fake_quantize_per_tensor_affine`` in the same pass), with two CUDA-only
columns: the host's time to issue one call (where it is about the call's time, the
host sets the pace, not the GPU) and whether fakequant's call synchronises the host
with the GPU (torch's sync debug mode: "none", or what synchronised).
``--budget SECONDS`` leaves out the groups not started by then, and names them.

``--sizes`` takes element counts: integers, ``2^k``, and ranges ``2^a..2^b``
(every power of two) or ``2^a..2^b:s`` (every s-th). ``--rounds`` defaults to
15 up to 2^22 elements, 7 up to 2^24 and 3 above on CPU (forward+backward of
pytorch-quantization's path at 2^26 float32 takes about a second), 5 up to 2^24
and 3 above on CUDA.

Fast calls are repeated within a sample so that each sample lasts at least
``--min-sample-ms`` (2 ms; 1 ms on CUDA); on CUDA each sample is at least ``--cuda-reps``
back-to-back calls between two CUDA events on the current stream, divided by
their number, so that the host's launch overhead overlaps the kernels as it
does in training.

On CPU, at 2^23 float32 elements and more, most of ``clone``'s time is the
kernel zeroing the fresh 4 KiB pages of its output (glibc maps allocations
over 32 MiB afresh each time). ``--thp`` reruns with PyTorch's
``THP_MEM_ALLOC_ENABLE=1`` (2 MiB transparent huge pages for large tensors),
which removes most of that cost for every op.

``--overhead`` times what a call costs where the dispatcher, not memory,
dominates (2^10 to 2^14 elements): forward with an input that does not require
grad, under ``torch.inference_mode()``, with an input that requires grad, and
forward+backward, for fakequant's affine (per tensor with Python numbers and
with tensors, per channel) and amax calls (tensor amax and Python number)
against torch's op with the same kind of parameters, and ``clone``.
"""
import os
import sys
import time

import torch

import fakequant
from _common import (PQFakeTensorQuant, add_output_options, argument_parser, forward_backward, machine_info,
                     parse_sizes, progress_bar, settle, size_label, time_interleaved, write_json)

FWD, FWD_BWD = "fwd", "fwd+bwd"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}
IMPLS = ("clone", "fakequant", "torch", "pq-python")


# --- the FP8 peer (pytorch-quantization's: _common.PQFakeTensorQuant) -------------


class _CastFp8(torch.autograd.Function):
    # FP8 fake quantization as plain PyTorch writes it (and Model Optimizer's
    # non-CUDA path computes it): scale, clamp, a float8 cast and back; saves the
    # input for the backward's clipping window.
    @staticmethod
    def forward(ctx, inputs, amax):
        ctx.save_for_backward(inputs, amax)
        scale = amax / 448.0
        return ((inputs / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).to(inputs.dtype) * scale)

    @staticmethod
    def backward(ctx, grad):
        inputs, amax = ctx.saved_tensors
        return torch.where(inputs.abs() <= amax, grad, grad.new_zeros(1)), None


# --- rounds, pages ----------------------------------------------------------------


def default_rounds(numel):
    return 15 if numel <= 1 << 22 else 7 if numel <= 1 << 24 else 3


def pages():
    if os.environ.get("THP_MEM_ALLOC_ENABLE") == "1":
        return "2 MiB pages (THP_MEM_ALLOC_ENABLE=1)"
    return "4 KiB pages"


# --- the cases -------------------------------------------------------------------

OPS = ("affine per-tensor", "affine per-channel", "affine per-channel, last axis", "amax per-tensor",
       "amax per-channel", "min/max affine", "quantize (integer)", "fp8 e4m3 per-tensor",
       "static blocks int8 b32",
       "block-wise int8 b32", "block-wise int8 b128", "block-wise int4 b32", "block-wise NVFP4 b16",
       "block-wise MXFP8 b32", "block-wise MXFP6 b32", "block-wise MXFP4 b32", "block-wise MXINT8 b32",
       "per-token int8", "per-token fp8",
       "GGML Q8_0 b32", "GGML Q4_0 b32")
# Block-wise dynamic quantization (fakequant.ops.fake_quantize_blockwise): the scales
# come from the data, block by block, in the same pass; no peer computes it. The MX
# formats (E8M0 power-of-two block scales) and per-token (per-row) dynamic quantization
# (one block per row of 4096) are the same kernel. Static blocks (an amax per block
# given, as a calibrated block quantizer keeps it) are fake_quantize_amax with the amax
# broadcast over each block; llama.cpp's Q8_0/Q4_0 blocks (fakequant.ops.fake_quantize_ggml)
# are a plain-PyTorch rule, not a kernel.
BLOCKWISE_OPS = tuple(o for o in OPS if o.startswith(("block-wise", "per-token")))
# torch's per-tensor op, the reference of every per-call time (issue 36, item 2)
PER_TENSOR_TORCH = ("affine per-tensor", "torch")


def cases(x, ops=OPS):
    """(name, input, fakequant function, {peer name: peer function}) for each operator."""
    dev = x.device
    channels = 256
    xc = x.view(channels, -1)  # per-channel along axis 0, as conv/linear weights
    xl = x.view(-1, channels)  # per-channel along the last axis (columns)
    scale = torch.full((channels,), 0.02, device=dev)
    zp = torch.zeros(channels, dtype=torch.int32, device=dev)
    amax_c = torch.full((channels, 1), 2.5, device=dev)
    amax = torch.tensor(2.5, device=dev)
    scale_c = amax_c.flatten() / 127
    lo, hi = torch.tensor(-2.0, device=dev), torch.tensor(3.0, device=dev)
    # pytorch-quantization keeps amax in a buffer, which model.to(dtype) casts
    # along with the weights; fakequant keeps it in float32.
    amax_pq, amax_c_pq = amax.to(x.dtype), amax_c.to(x.dtype)
    # rows of 4096 (a weight's input dimension, say), blocks along them
    xb = x.view(-1, 4096) if x.numel() % 4096 == 0 else x.view(1, -1)
    blockwise = fakequant.ops.fake_quantize_blockwise
    amax_x = x.abs().amax().float() if "block-wise NVFP4 b16" in ops else None  # NVFP4's per-tensor amax
    # static blocks of 32: an amax per block, kept in float32 (a calibrated block quantizer's)
    xs = x.view(-1, 32) if x.numel() % 32 == 0 else x.view(1, -1)
    amax_b = torch.full((xs.shape[0], 1), 2.5, device=dev)
    amax_b_pq = amax_b.to(x.dtype)
    ggml = fakequant.ops.fake_quantize_ggml
    # On CUDA, parameters given as Python numbers would cost a host-to-device
    # copy per call; a QAT module keeps them on the device.
    if dev.type == "cuda":
        s1, z1 = torch.tensor(0.02, device=dev), torch.tensor(0, dtype=torch.int32, device=dev)
    else:
        s1, z1 = 0.02, 0
    table = [
        (
            "affine per-tensor",
            x,
            lambda t: fakequant.fake_quantize_per_tensor_affine(t, s1, z1, -128, 127),
            {"torch": lambda t: torch.fake_quantize_per_tensor_affine(t, 0.02, 0, -128, 127)},
        ),
        (
            "affine per-channel",
            xc,
            lambda t: fakequant.fake_quantize_per_channel_affine(t, scale, zp, 0, -128, 127),
            {"torch": lambda t: torch.fake_quantize_per_channel_affine(t, scale, zp, 0, -128, 127)},
        ),
        (
            "affine per-channel, last axis",
            xl,
            lambda t: fakequant.fake_quantize_per_channel_affine(t, scale, zp, 1, -128, 127),
            {"torch": lambda t: torch.fake_quantize_per_channel_affine(t, scale, zp, 1, -128, 127)},
        ),
        (
            "amax per-tensor",
            x,
            lambda t: fakequant.fake_quantize_amax(t, amax),
            {
                "torch": lambda t: torch.fake_quantize_per_tensor_affine(t, 2.5 / 127, 0, -127, 127),
                "pq-python": lambda t: PQFakeTensorQuant.apply(t, amax_pq),
            },
        ),
        (
            "amax per-channel",
            xc,
            lambda t: fakequant.fake_quantize_amax(t, amax_c),
            {
                "torch": lambda t: torch.fake_quantize_per_channel_affine(t, scale_c, zp, 0, -127, 127),
                "pq-python": lambda t: PQFakeTensorQuant.apply(t, amax_c_pq),
            },
        ),
        (
            "min/max affine",
            x,
            lambda t: fakequant.fake_quantize_min_max(t, lo, hi),
            # The same asymmetric 8-bit grid: scale (max - min) / 255, zero point 102.
            {"torch": lambda t: torch.fake_quantize_per_tensor_affine(t, 5.0 / 255, 102, 0, 255)},
        ),
        ("quantize (integer)", x, lambda t: fakequant.quantize_amax(t, amax)[0], {}),
        ("fp8 e4m3 per-tensor", x, lambda t: fakequant.fake_quantize_fp8(t, amax),
         {"torch": lambda t: _CastFp8.apply(t, amax)}),
        ("static blocks int8 b32", xs, lambda t: fakequant.fake_quantize_amax(t, amax_b),
         {"pq-python": lambda t: PQFakeTensorQuant.apply(t, amax_b_pq)}),
        ("block-wise int8 b32", xb, lambda t: blockwise(t, 32), {}),
        ("block-wise int8 b128", xb, lambda t: blockwise(t, 128), {}),
        ("block-wise int4 b32", xb, lambda t: blockwise(t, 32, num_bits=4), {}),
        # NVFP4: E2M1 elements, blocks of 16, E4M3 block scales under the tensor's amax
        ("block-wise NVFP4 b16", xb, lambda t: blockwise(t, 16, num_bits=4, exponent_bits=2, scale_amax=amax_x), {}),
        # OCP microscaling: blocks of 32 with E8M0 (power-of-two) scales
        ("block-wise MXFP8 b32", xb, lambda t: blockwise(t, 32, num_bits=8, exponent_bits=4, e8m0_scale=True), {}),
        ("block-wise MXFP6 b32", xb, lambda t: blockwise(t, 32, num_bits=6, exponent_bits=3, e8m0_scale=True), {}),
        ("block-wise MXFP4 b32", xb, lambda t: blockwise(t, 32, num_bits=4, exponent_bits=2, e8m0_scale=True), {}),
        ("block-wise MXINT8 b32", xb, lambda t: blockwise(t, 32, num_bits=8, narrow_range=False, e8m0_scale=True), {}),
        # per-token dynamic activations: one amax per row of 4096, found in the same pass
        ("per-token int8", xb, lambda t: blockwise(t, xb.shape[-1], narrow_range=False), {}),
        ("per-token fp8", xb, lambda t: blockwise(t, xb.shape[-1], num_bits=8, exponent_bits=4), {}),
        # llama.cpp's blocks: the plain-PyTorch rule (several passes), no kernel
        ("GGML Q8_0 b32", xb, lambda t: ggml(t, 32, 8), {}),
        ("GGML Q4_0 b32", xb, lambda t: ggml(t, 32, 4), {}),
    ]
    return [c for c in table if c[0] in ops]


def cuda_rounds(numel):
    """Rounds on CUDA, where samples are many calls each: few, so that every format, both dtypes
    and both passes at 2^10..2^20, 2^24 and 2^28 take about a minute."""
    return 5 if numel <= 1 << 24 else 3


def host_syncs(fn, device):
    """Whether ``fn`` synchronises the host with the GPU (torch's sync debug mode, which raises at
    a synchronising CUDA call: a device value read on the host, a blocking copy): "none", or the
    first line of what it said. None off CUDA (not measured)."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    torch.cuda.set_sync_debug_mode("error")
    try:
        fn()
    except RuntimeError as e:
        return str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return "none"


# CUDA runtime calls of one call, by kind: what a profiler's runtime events are named contains
# the key (cudaLaunchKernel, cudaLaunchKernelExC, cuLaunchKernel; cudaMemcpyAsync;
# cudaMemsetAsync; cudaStreamSynchronize, cudaDeviceSynchronize, cudaEventSynchronize;
# cudaMalloc, cudaMallocAsync: the caching allocator asking the driver for memory).
RUNTIME_CALLS = (("launches", "LaunchKernel"), ("copies", "Memcpy"), ("memsets", "Memset"),
                 ("syncs", "Synchronize"), ("mallocs", "Malloc"))


def count_runtime_calls(names):
    """{kind: count} of CUDA runtime calls among profiler event names (RUNTIME_CALLS)."""
    counts = {kind: 0 for kind, _ in RUNTIME_CALLS}
    for name in names:
        for kind, key in RUNTIME_CALLS:
            if key in name:
                counts[kind] += 1
                break
    return counts


def cuda_calls(fn, device):
    """The CUDA runtime calls one call of ``fn`` makes (torch.profiler, CPU and CUDA activity):
    kernel launches, copies, memsets, synchronisations and driver allocations. None off CUDA."""
    if device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    def calls(f):
        torch.cuda.synchronize(device)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            f()
        return count_runtime_calls(e.name for e in prof.events())

    counts = calls(fn)
    # every call here launches a kernel: none seen means the profiler saw no runtime calls
    # (no CUPTI), not a call without kernels
    if not counts["launches"]:
        return None
    # less the profiler's own (it synchronises the device as it stops: the first H100 table
    # showed that as "1 syncs" on every row)
    return subtract_calls(counts, calls(lambda: None))


def subtract_calls(counts, baseline):
    """counts less baseline, kind by kind (never below 0)."""
    return {kind: max(0, counts[kind] - baseline.get(kind, 0)) for kind in counts}


def run(numel, device, rounds=None, reps=1, dtype=torch.float32, ops=OPS, modes=(FWD, FWD_BWD),
        min_sample_s=0.002, progress=None, profile_calls=False):
    """Rows of one size and dtype: every operator and pass, each implementation's
    median time, bandwidth and ratios to clone (the limit) and to fakequant. On CUDA also
    the host's time to issue a call (host_ms) and whether fakequant's call synchronises
    (syncs) and, with ``profile_calls``, the CUDA runtime calls of one call of fakequant's and of
    each peer's (cuda_calls). Forward+backward is torch.autograd.grad of the input, nothing
    accumulated."""
    torch.manual_seed(0)
    x = torch.randn(numel, device=device).to(dtype)
    grad = torch.randn(numel, device=device).to(dtype)
    rounds = rounds or (cuda_rounds(numel) if device.type == "cuda" else default_rounds(numel))
    warmup = 3 if numel * x.element_size() < 1 << 24 else 1
    rows = []
    for name, xin, ours, peers in cases(x, ops):
        g = grad.view_as(xin)
        fwd = {"clone": lambda t=xin: t.clone(), "fakequant": lambda t=xin, f=ours: f(t)}
        fwd.update({p: (lambda t=xin, f=f: f(t)) for p, f in peers.items()})
        both = {"clone": fwd["clone"], "fakequant": forward_backward(ours, xin, g)}
        both.update({p: forward_backward(f, xin, g) for p, f in peers.items()})
        for mode, fns in ((FWD, fwd), (FWD_BWD, both)):
            if mode not in modes:
                continue
            host = {}
            times = time_interleaved(fns, device, rounds, warmup=warmup,
                                     reps=reps if device.type == "cuda" else 1, min_sample_s=min_sample_s, host=host)
            syncs = host_syncs(fns["fakequant"], device)
            calls = {impl: cuda_calls(f, device) for impl, f in fns.items()} if profile_calls else {}
            clone_time = times["clone"]
            limit = clone_time * (1 if mode == FWD else 2)
            bytes_moved = 2 * xin.numel() * xin.element_size() * (1 if mode == FWD else 2)
            for impl, t in times.items():
                rows.append(
                    dict(
                        device=str(device),
                        pages="cuda" if device.type == "cuda" else pages(),
                        dtype=str(dtype).replace("torch.", ""),
                        numel=numel,
                        op=name,
                        mode=mode,
                        impl=impl,
                        ms=t * 1e3,
                        host_ms=host[impl] * 1e3 if device.type == "cuda" else None,
                        gbps=bytes_moved / t / 1e9,
                        vs_limit=t / limit,
                        fakequant_speedup=(t / times["fakequant"]),
                        syncs=syncs if impl == "fakequant" else None,
                        cuda_calls=calls.get(impl),
                        rounds=rounds,
                    )
                )
            if progress is not None:
                progress.update(1)
    return rows


def fits(numel, dtype, device):
    """Whether 2^28-sized work fits the device: the input, its gradient, outputs, masks and the
    plain-PyTorch peers' temporaries, about 16 tensors of the input's size (always on CPU)."""
    if device.type != "cuda":
        return True
    free, _ = torch.cuda.mem_get_info(device)
    return numel * torch.empty((), dtype=dtype).element_size() * 16 < free


# --- per-call overhead at small sizes -----------------------------------------

# Passes timed per call: an input without grad, under inference_mode (no autograd
# kernel at all), an input requiring grad, and forward+backward.
PER_CALL_PASSES = ("fwd, input without grad", "fwd, inference_mode", "fwd, input requires grad", "fwd+bwd")
# The passes whose target is fakequant at or below torch's op (inference_mode is shown only).
PER_CALL_TARGET_PASSES = ("fwd, input without grad", "fwd, input requires grad", "fwd+bwd")
PER_CALL_CHANNELS = 16  # the input is (16, numel / 16): per-channel ops quantize along dim 0


def per_call_pairs(device):
    """{comparison: (fakequant's call, torch's call)}, each taking the input. torch has no
    amax op: fakequant's amax rows compare with torch's per-tensor op with the same kind of
    parameters (amax 2.54 is scale 0.02 on int8's 127 steps)."""
    c = PER_CALL_CHANNELS
    s, z = torch.tensor(0.02, device=device), torch.tensor(0, dtype=torch.int32, device=device)
    sc = torch.full((c,), 0.02, device=device)
    zc = torch.zeros(c, dtype=torch.int32, device=device)
    amax = torch.tensor(2.54, device=device)
    return {
        "affine per-tensor, Python numbers": (
            lambda t: fakequant.fake_quantize_per_tensor_affine(t, 0.02, 0, -128, 127),
            lambda t: torch.fake_quantize_per_tensor_affine(t, 0.02, 0, -128, 127)),
        "affine per-tensor, tensors": (
            lambda t: fakequant.fake_quantize_per_tensor_affine(t, s, z, -128, 127),
            lambda t: torch.fake_quantize_per_tensor_affine(t, s, z, -128, 127)),
        "affine per-channel, tensors": (
            lambda t: fakequant.fake_quantize_per_channel_affine(t, sc, zc, 0, -128, 127),
            lambda t: torch.fake_quantize_per_channel_affine(t, sc, zc, 0, -128, 127)),
        "amax per-tensor, tensor amax": (
            lambda t: fakequant.fake_quantize_amax(t, amax),
            lambda t: torch.fake_quantize_per_tensor_affine(t, s, z, -127, 127)),
        "amax per-tensor, Python number": (
            lambda t: fakequant.fake_quantize_amax(t, 2.54),
            lambda t: torch.fake_quantize_per_tensor_affine(t, 0.02, 0, -127, 127)),
    }


def overhead(device, sizes, rounds=15, min_sample_s=0.005, progress=None):
    """Microseconds per call at sizes where the dispatcher, not memory, dominates:
    fakequant's calls against torch's op (per_call_pairs) and clone, in each of
    PER_CALL_PASSES. Within a pass every candidate is interleaved with the others."""
    rows = []
    pairs = per_call_pairs(device)
    for numel in sizes:
        torch.manual_seed(0)
        x = torch.randn(PER_CALL_CHANNELS, numel // PER_CALL_CHANNELS, device=device)
        g = torch.randn_like(x)
        xr = x.detach().requires_grad_()
        fns = {("clone", "clone"): lambda t: t.clone()}
        for name, (fq, th) in pairs.items():
            fns[(name, "fakequant")], fns[(name, "torch")] = fq, th
        for group in PER_CALL_PASSES:
            if group == "fwd+bwd":
                calls = {k: forward_backward(f, x, g) for k, f in fns.items()}
            else:
                t = xr if group == "fwd, input requires grad" else x
                calls = {k: (lambda f=f, t=t: f(t)) for k, f in fns.items()}
            if group == "fwd, inference_mode":
                with torch.inference_mode():
                    times = time_interleaved(calls, device, rounds, warmup=20, min_sample_s=min_sample_s)
            else:
                times = time_interleaved(calls, device, rounds, warmup=20, min_sample_s=min_sample_s)
            for (name, impl), t in times.items():
                rows.append(dict(device=str(device), numel=numel, group=group, comparison=name, impl=impl,
                                 us=t * 1e6, vs_clone=t / times[("clone", "clone")],
                                 vs_torch=None if impl != "fakequant" else t / times[(name, "torch")]))
            if progress is not None:
                progress.update(1)
    return rows


def per_call_worst(rows, device="cpu"):
    """{comparison: (worst fakequant / torch over the sizes and PER_CALL_TARGET_PASSES,
    where it was)}."""
    worst = {}
    for r in rows:
        if r["device"] == device and r["impl"] == "fakequant" and r["group"] in PER_CALL_TARGET_PASSES:
            if r["comparison"] not in worst or r["vs_torch"] > worst[r["comparison"]][0]:
                worst[r["comparison"]] = (r["vs_torch"], f"{r['group']}, {size_label(r['numel'])}")
    return worst


# --- tables ------------------------------------------------------------------------


def _fmt_ms(ms):
    return f"{ms:.3f}" if ms < 1 else f"{ms:.2f}" if ms < 100 else f"{ms:.0f}"


def format_table(rows, numel, device):
    """One size, one dtype: every implementation in its own row."""
    where = f"{torch.get_num_threads()} threads, {pages()}"
    if device.type == "cuda":
        where = f"{torch.cuda.get_device_name(device)}, CUDA events"
    dtype = rows[0]["dtype"] if rows else "float32"
    head = (
        f"{numel} {dtype} elements on {device} ({where}); "
        "times are medians; 'x limit' is the time over "
        "clone's (two clones for fwd+bwd); 'fq faster' is this row's time over fakequant's\n"
    )
    lines = [
        "| op | pass | impl | ms | GB/s | x limit | fq faster |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        speed = "" if r["impl"] == "fakequant" else f"{r['fakequant_speedup']:.2f}x"
        lines.append(
            f"| {r['op']} | {r['mode']} | {r['impl']} | {_fmt_ms(r['ms'])} | {r['gbps']:.1f} | "
            f"{r['vs_limit']:.2f} | {speed} |"
        )
    return head + "\n".join(lines)


def _fmt_us(ms):
    us = ms * 1e3
    return f"{us:.2f}" if us < 10 else f"{us:.1f}" if us < 10000 else f"{us:.0f}"


def _fmt_calls(ours, torchs):
    """'1 / 1', with fakequant's other runtime calls ('1 / 1; 2 mallocs'); '' where not profiled."""
    if not ours:
        return ""
    text = f"{ours['launches']}" + (f" / {torchs['launches']}" if torchs else "")
    others = [f"{ours[k]} {k}" for k, _ in RUNTIME_CALLS if k != "launches" and ours.get(k)]
    return text + ("; " + ", ".join(others) if others else "")


def format_group(rows, numel, dtype, device):
    """One size and dtype, every operator and pass in a row (what bench_ops prints as each
    group completes): times in microseconds; fakequant over the limit (clone, two clones for
    fwd+bwd), over each peer and over torch.fake_quantize_per_tensor_affine in the same pass;
    on CUDA the host's time to issue one call and whether the call synchronises."""
    sel = [r for r in rows if r["numel"] == numel and r["dtype"] == dtype and r["device"] == str(device)]
    by = {}
    for r in sel:
        by.setdefault((r["op"], r["mode"]), {})[r["impl"]] = r
    where = (f"{torch.cuda.get_device_name(device)}, CUDA events" if device.type == "cuda"
             else f"{torch.get_num_threads()} threads, {pages()}")
    rounds = sel[0]["rounds"] if sel else ""
    lines = [f"{size_label(numel)} {dtype} elements on {device} ({where}), medians of {rounds} rounds, "
             "microseconds per call; 'x torch pt': fakequant's time over torch.fake_quantize_per_tensor_affine's "
             "in the same pass; 'host': the host's time to issue one call (CUDA); 'launches': kernel launches "
             "of one call, fakequant's / torch's, with other CUDA runtime calls (CUDA, where profiled)",
             "| op | pass | limit us | fakequant us | GB/s | x limit | host us | torch us | torch / fq "
             "| pq-python us | pq / fq | x torch pt | host syncs | launches |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for op in OPS:
        for mode in (FWD, FWD_BWD):
            c = by.get((op, mode))
            if not c:
                continue
            fq, cl = c["fakequant"], c["clone"]
            ref = by.get((PER_TENSOR_TORCH[0], mode), {}).get(PER_TENSOR_TORCH[1])
            cells = [op, mode, _fmt_us(cl["ms"] * (1 if mode == FWD else 2)), _fmt_us(fq["ms"]), f"{fq['gbps']:.1f}",
                     f"{fq['vs_limit']:.2f}", "" if fq.get("host_ms") is None else _fmt_us(fq["host_ms"])]
            for peer in ("torch", "pq-python"):
                cells += ([_fmt_us(c[peer]["ms"]), f"{c[peer]['fakequant_speedup']:.2f}x"] if peer in c else ["", ""])
            cells.append(f"{fq['ms'] / ref['ms']:.2f}" if ref else "")
            cells.append(fq.get("syncs") or "")
            cells.append(_fmt_calls(fq.get("cuda_calls"), c.get("torch", {}).get("cuda_calls")))
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def format_sweep(rows, mode, dtype, device="cpu"):
    """One pass and dtype, every operator and size in a row: clone, fakequant, and
    each peer's time over fakequant's."""
    sel = [r for r in rows if r["mode"] == mode and r["dtype"] == dtype and r["device"] == device]
    by = {}
    for r in sel:
        by.setdefault((r["op"], r["numel"]), {})[r["impl"]] = r
    limit = "clone" if mode == FWD else "2 clones"
    lines = [
        f"| op | elements | {limit} ms | fakequant ms | fakequant GB/s | x {limit} | torch ms | torch / fq "
        "| pq-python ms | pq / fq |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for op in OPS:
        for numel in sorted({n for o, n in by if o == op}):
            c = by[(op, numel)]
            fq, cl = c["fakequant"], c["clone"]
            cells = [op, size_label(numel), _fmt_ms(cl["ms"] * (1 if mode == FWD else 2)), _fmt_ms(fq["ms"]),
                     f"{fq['gbps']:.1f}", f"{fq['vs_limit']:.2f}"]
            for peer in ("torch", "pq-python"):
                if peer in c:
                    cells += [_fmt_ms(c[peer]["ms"]), f"{c[peer]['fakequant_speedup']:.2f}x"]
                else:
                    cells += ["", ""]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def format_overhead(rows, device="cpu"):
    """Microseconds per call: a row per comparison and pass, for each size fakequant's
    time, torch's, and fakequant's over torch's."""
    rows = [r for r in rows if r["device"] == device]
    sizes = sorted({r["numel"] for r in rows})
    cell = {(r["comparison"], r["group"], r["impl"], r["numel"]): r for r in rows}
    head = "| call | pass | " + " | ".join(f"{size_label(n)}: fq us | torch us | fq / torch" for n in sizes) + " |"
    lines = [head, "|---|---|" + "---:|---:|---:|" * len(sizes)]
    for group in PER_CALL_PASSES:
        clone = [cell.get(("clone", group, "clone", n)) for n in sizes]
        if any(c is None for c in clone):
            continue
        lines.append(f"| clone | {group} | " + " | ".join(f"{c['us']:.1f} | | " for c in clone) + " |")
    comparisons = list(dict.fromkeys(r["comparison"] for r in rows if r["impl"] == "fakequant"))
    for name in comparisons:
        for group in PER_CALL_PASSES:
            cells = []
            for n in sizes:
                fq, th = cell.get((name, group, "fakequant", n)), cell.get((name, group, "torch", n))
                if fq is None or th is None:
                    cells.append(" | | ")
                    continue
                ratio = f"{fq['vs_torch']:.2f}"
                if group in PER_CALL_TARGET_PASSES and fq["vs_torch"] > 1:
                    ratio = f"**{ratio}**"
                cells.append(f"{fq['us']:.1f} | {th['us']:.1f} | {ratio}")
            lines.append(f"| {name} | {group} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# On CUDA without --sizes: the bandwidth sizes first (2^28 where memory allows, 2^24), then the
# small ones, where a call's fixed costs decide (issue 36, items 2 and 5); both dtypes at each.
CUDA_SIZES = "2^28,2^24,2^10..2^20:2"
CUDA_DTYPES = "float32,bfloat16"


def groups(sizes, dtypes):
    """(numel, dtype) in the order measured: each size in both dtypes before the next size."""
    return [(numel, dtype) for numel in sizes for dtype in dtypes]


def main():
    parser = argument_parser(__doc__)
    parser.add_argument("--numel", type=int, default=1 << 24)
    parser.add_argument("--sizes", help="element counts: 1000,2^20,2^10..2^26:2 (default: --numel; on CUDA "
                                        f"{CUDA_SIZES})")
    parser.add_argument("--dtype", help="float32, bfloat16, float16, float64, or several: float32,bfloat16 "
                                        f"(default: float32; on CUDA {CUDA_DTYPES})")
    parser.add_argument("--ops", help="a subset of the operators, comma-separated: " + ", ".join(OPS))
    parser.add_argument("--modes", default=f"{FWD},{FWD_BWD}", help="fwd, fwd+bwd or both")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, or several: cpu,cuda")
    parser.add_argument("--cuda-reps", type=int, default=10, help="calls per CUDA timing sample, at least")
    parser.add_argument("--rounds", type=int, help="timing rounds (default: by size, 15 to 3 on CPU, 5 and 3 "
                                                   "on CUDA; 25 with --overhead)")
    parser.add_argument("--min-sample-ms", type=float, help="repeat fast calls to fill a sample (default: 2; "
                                                            "1 on CUDA)")
    parser.add_argument("--budget", type=float, help="seconds: the (size, dtype) groups not started by then are "
                                                     "left out and named (default: no limit)")
    parser.add_argument("--overhead", action="store_true", help="per-call overhead instead, in microseconds")
    parser.add_argument("--overhead-sizes", default="2^10..2^14:2")
    parser.add_argument("--thp", action="store_true", help="rerun with THP_MEM_ALLOC_ENABLE=1")
    add_output_options(parser, json_help="also save the rows to this JSON file", progress=True)
    args = parser.parse_args()
    if args.thp and os.environ.get("THP_MEM_ALLOC_ENABLE") != "1":
        # torch reads the variable once, at start-up.
        os.environ["THP_MEM_ALLOC_ENABLE"] = "1"
        os.execv(sys.executable, [sys.executable] + sys.argv)
    start = time.monotonic()
    devices = [torch.device(d) for d in args.device.split(",")]
    ops = [o.strip() for o in args.ops.split(",")] if args.ops else list(OPS)
    unknown = set(ops) - set(OPS)
    if unknown:
        parser.error(f"unknown operators {sorted(unknown)}; choose from {', '.join(OPS)}")
    modes = tuple(m.strip() for m in args.modes.split(","))
    rows, overhead_rows, left_out = [], [], []
    all_sizes, all_dtypes = [], []
    for device in devices:
        cuda = device.type == "cuda"
        sizes = parse_sizes(args.sizes) if args.sizes else parse_sizes(CUDA_SIZES) if cuda else [args.numel]
        dtypes = [DTYPES[d.strip()] for d in (args.dtype or (CUDA_DTYPES if cuda else "float32")).split(",")]
        min_sample_s = (args.min_sample_ms if args.min_sample_ms is not None else 1.0 if cuda else 2.0) / 1e3
        all_sizes += [n for n in sizes if n not in all_sizes]
        all_dtypes += [str(d).replace("torch.", "") for d in dtypes if str(d).replace("torch.", "") not in all_dtypes]
        settle(device)
        if args.overhead:
            osizes = parse_sizes(args.overhead_sizes)
            with progress_bar(len(PER_CALL_PASSES) * len(osizes), f"overhead {device}", not args.no_progress) as bar:
                device_rows = overhead(device, osizes, rounds=args.rounds or 25, progress=bar)
            print(f"Microseconds per call on {device} ({torch.get_num_threads()} threads)")
            print(format_overhead(device_rows, str(device)))
            overhead_rows += device_rows
            continue
        device_rows = []
        # each group's table as it completes, where the run may be cut short (a budget, a GPU's
        # time): what was measured is printed already
        stream = cuda or args.budget is not None
        todo = groups(sizes, dtypes)
        profiled = set()
        with progress_bar(len(todo) * len(ops) * len(modes), f"ops {device}", not args.no_progress) as bar:
            for numel, dtype in todo:
                d = str(dtype).replace("torch.", "")
                if args.budget is not None and time.monotonic() - start > args.budget:
                    left_out.append(dict(device=str(device), numel=numel, dtype=d, reason="out of time"))
                elif not fits(numel, dtype, device):
                    left_out.append(dict(device=str(device), numel=numel, dtype=d, reason="out of memory"))
                else:
                    t0 = time.monotonic()
                    # the runtime calls of each call, once per dtype, at the first size of 2^20 or less
                    profile_calls = cuda and numel <= 1 << 20 and d not in profiled
                    if profile_calls:
                        profiled.add(d)
                    group = run(numel, device, args.rounds, args.cuda_reps, dtype, ops, modes, min_sample_s,
                                progress=bar, profile_calls=profile_calls)
                    device_rows += group
                    if stream:
                        print(f"\n{format_group(group, numel, d, device)}\n({time.monotonic() - t0:.1f} s)", flush=True)
                    continue
                if stream:
                    print(f"\n{size_label(numel)} {d} on {device}: not measured: {left_out[-1]['reason']}", flush=True)
                bar.update(len(ops) * len(modes))
        if stream:
            pass  # (printed as each group completed)
        elif len(sizes) == 1:
            for dtype in dtypes:
                sel = [r for r in device_rows if r["dtype"] == str(dtype).replace("torch.", "")]
                print(format_table(sel, sizes[0], device))
        else:
            for dtype in dtypes:
                for mode in modes:
                    d = str(dtype).replace("torch.", "")
                    print(f"\n{d}, {mode}, {device} ({pages() if device.type == 'cpu' else 'CUDA events'}), medians")
                    print(format_sweep(device_rows, mode, d, str(device)))
        rows += device_rows
    if not args.overhead:
        measured = len({(r["device"], r["numel"], r["dtype"]) for r in rows})
        print(f"\n{measured} (size, dtype) groups measured in {time.monotonic() - start:.0f} s"
              + (f"; not measured: " + ", ".join(f"{size_label(g['numel'])} {g['dtype']} on {g['device']} "
                                                  f"({g['reason']})" for g in left_out) if left_out else ""),
              flush=True)
    if args.json:
        meta = dict(
            machine_info(),
            sizes=all_sizes,
            dtypes=",".join(all_dtypes),
            device=args.device,
            gpu=torch.cuda.get_device_name() if "cuda" in args.device else None,
            date=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            pages=pages(),
            seconds=time.monotonic() - start,
        )
        write_json(args.json, dict(meta=meta, rows=rows, overhead=overhead_rows, left_out=left_out))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
