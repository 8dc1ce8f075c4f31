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
Optimizer computes off its CUDA extension). The block-wise rows (``fakequant.ops.fake_quantize_blockwise`` on rows of 4096:
int8 with blocks of 32 and 128, NVFP4 = E2M1 in blocks of 16 with E4M3 block
scales) have no peer; their target is the time of a clone (1.3x or less on CPU).

    python benchmarks/bench_ops.py [--numel 16777216] [--device cpu] [--json PATH] [--thp]
    python benchmarks/bench_ops.py --sizes 2^10..2^26:2 --dtype float32,bfloat16
    python benchmarks/bench_ops.py --overhead            # microseconds per call, 2^10..2^14
    python benchmarks/bench_ops.py --device cuda        # or --device cpu,cuda

``--sizes`` takes element counts: integers, ``2^k``, and ranges ``2^a..2^b``
(every power of two) or ``2^a..2^b:s`` (every s-th). ``--rounds`` defaults to
15 up to 2^22 elements, 7 up to 2^24 and 3 above (forward+backward of
pytorch-quantization's path at 2^26 float32 takes about a second).

Fast calls are repeated within a sample so that each sample lasts at least
``--min-sample-ms``; on CUDA each sample is at least ``--cuda-reps``
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

OPS = ("affine per-tensor", "affine per-channel", "amax per-tensor", "amax per-channel",
       "min/max affine", "quantize (integer)", "fp8 e4m3 per-tensor",
       "block-wise int8 b32", "block-wise int8 b128", "block-wise NVFP4 b16",
       "block-wise MXFP8 b32", "block-wise MXFP4 b32", "block-wise MXINT8 b32",
       "per-token int8", "per-token fp8")
# Block-wise dynamic quantization (fakequant.ops.fake_quantize_blockwise): the scales
# come from the data, block by block, in the same pass; no peer computes it. The MX
# formats (E8M0 power-of-two block scales) and per-token (per-row) dynamic quantization
# (one block per row of 4096) are the same kernel.
BLOCKWISE_OPS = OPS[7:]


def cases(x, ops=OPS):
    """(name, input, fakequant function, {peer name: peer function}) for each operator."""
    dev = x.device
    channels = 256
    xc = x.view(channels, -1)  # per-channel along axis 0, as conv/linear weights
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
        ("block-wise int8 b32", xb, lambda t: blockwise(t, 32), {}),
        ("block-wise int8 b128", xb, lambda t: blockwise(t, 128), {}),
        # NVFP4: E2M1 elements, blocks of 16, E4M3 block scales under the tensor's amax
        ("block-wise NVFP4 b16", xb, lambda t: blockwise(t, 16, num_bits=4, exponent_bits=2, scale_amax=amax_x), {}),
        # OCP microscaling: blocks of 32 with E8M0 (power-of-two) scales
        ("block-wise MXFP8 b32", xb, lambda t: blockwise(t, 32, num_bits=8, exponent_bits=4, e8m0_scale=True), {}),
        ("block-wise MXFP4 b32", xb, lambda t: blockwise(t, 32, num_bits=4, exponent_bits=2, e8m0_scale=True), {}),
        ("block-wise MXINT8 b32", xb, lambda t: blockwise(t, 32, num_bits=8, narrow_range=False, e8m0_scale=True), {}),
        # per-token dynamic activations: one amax per row of 4096, found in the same pass
        ("per-token int8", xb, lambda t: blockwise(t, xb.shape[-1], narrow_range=False), {}),
        ("per-token fp8", xb, lambda t: blockwise(t, xb.shape[-1], num_bits=8, exponent_bits=4), {}),
    ]
    return [c for c in table if c[0] in ops]


def run(numel, device, rounds=None, reps=1, dtype=torch.float32, ops=OPS, modes=(FWD, FWD_BWD),
        min_sample_s=0.002, progress=None):
    """Rows of one size and dtype: every operator and pass, each implementation's
    median time, bandwidth and ratios to clone (the limit) and to fakequant."""
    torch.manual_seed(0)
    x = torch.randn(numel, device=device).to(dtype)
    grad = torch.randn(numel, device=device).to(dtype)
    rounds = rounds or default_rounds(numel)
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
            times = time_interleaved(fns, device, rounds, warmup=warmup,
                                     reps=reps if device.type == "cuda" else 1, min_sample_s=min_sample_s)
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
                        gbps=bytes_moved / t / 1e9,
                        vs_limit=t / limit,
                        fakequant_speedup=(t / times["fakequant"]),
                        rounds=rounds,
                    )
                )
            if progress is not None:
                progress.update(1)
    return rows


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


def main():
    parser = argument_parser(__doc__)
    parser.add_argument("--numel", type=int, default=1 << 24)
    parser.add_argument("--sizes", help="element counts: 1000,2^20,2^10..2^26:2 (default: --numel)")
    parser.add_argument("--dtype", default="float32", help="float32, bfloat16, float16, float64, or several: float32,bfloat16")
    parser.add_argument("--ops", help="a subset of the operators, comma-separated: " + ", ".join(OPS))
    parser.add_argument("--modes", default=f"{FWD},{FWD_BWD}", help="fwd, fwd+bwd or both")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, or several: cpu,cuda")
    parser.add_argument("--cuda-reps", type=int, default=10, help="calls per CUDA timing sample, at least")
    parser.add_argument("--rounds", type=int, help="timing rounds (default: by size, 15 to 3; 25 with --overhead)")
    parser.add_argument("--min-sample-ms", type=float, default=2.0, help="repeat fast calls to fill a sample")
    parser.add_argument("--overhead", action="store_true", help="per-call overhead instead, in microseconds")
    parser.add_argument("--overhead-sizes", default="2^10..2^14:2")
    parser.add_argument("--thp", action="store_true", help="rerun with THP_MEM_ALLOC_ENABLE=1")
    add_output_options(parser, json_help="also save the rows to this JSON file", progress=True)
    args = parser.parse_args()
    if args.thp and os.environ.get("THP_MEM_ALLOC_ENABLE") != "1":
        # torch reads the variable once, at start-up.
        os.environ["THP_MEM_ALLOC_ENABLE"] = "1"
        os.execv(sys.executable, [sys.executable] + sys.argv)
    devices = [torch.device(d) for d in args.device.split(",")]
    sizes = parse_sizes(args.sizes) if args.sizes else [args.numel]
    dtypes = [DTYPES[d.strip()] for d in args.dtype.split(",")]
    ops = [o.strip() for o in args.ops.split(",")] if args.ops else list(OPS)
    unknown = set(ops) - set(OPS)
    if unknown:
        parser.error(f"unknown operators {sorted(unknown)}; choose from {', '.join(OPS)}")
    modes = tuple(m.strip() for m in args.modes.split(","))
    rows, overhead_rows = [], []
    for device in devices:
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
        total = len(sizes) * len(dtypes) * len(ops) * len(modes)
        with progress_bar(total, f"ops {device}", not args.no_progress) as bar:
            for dtype in dtypes:
                for numel in sizes:
                    device_rows += run(numel, device, args.rounds, args.cuda_reps, dtype, ops, modes,
                                       args.min_sample_ms / 1e3, progress=bar)
        if len(sizes) == 1:
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
    if args.json:
        meta = dict(
            machine_info(),
            sizes=sizes,
            dtypes=args.dtype,
            device=args.device,
            gpu=torch.cuda.get_device_name() if "cuda" in args.device else None,
            date=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            pages=pages(),
        )
        write_json(args.json, dict(meta=meta, rows=rows, overhead=overhead_rows))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
