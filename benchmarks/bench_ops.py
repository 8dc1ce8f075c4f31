"""Operator benchmark: fakequant against the memory-bandwidth limit and the peers.

For each operator, forward and forward+backward on the same tensor, timed in
one process with the candidates interleaved round by round, so that machine
noise hits all of them alike:

- ``clone``: ``torch.clone`` of the input, the memory-bandwidth limit of an op
  that reads one tensor and writes one (forward+backward moves twice that, so
  its limit is two clones);
- ``torch``: ``torch.fake_quantize_per_tensor_affine`` / ``_per_channel_affine``
  (in training they run their cachemask variants, which is what autograd
  calls here);
- ``pq-python``: pytorch-quantization's ``fake_tensor_quant`` as its CPU path
  computes it, in plain PyTorch (saves the input for backward).

    python benchmarks/bench_ops.py [--numel 16777216] [--device cpu] [--json PATH] [--thp]
    python benchmarks/bench_ops.py --device cuda        # or --device cpu,cuda

On CUDA each sample is the time of ``--cuda-reps`` back-to-back calls between
two CUDA events on the current stream, divided by their number, so that the
host's launch overhead overlaps the kernels as it does in training.

On CPU, most of ``clone``'s time at this size is the kernel zeroing the fresh
4 KiB pages of its output. ``--thp`` reruns with PyTorch's
``THP_MEM_ALLOC_ENABLE=1`` (2 MiB transparent huge pages for large tensors,
what numpy does by default), which removes most of that cost for every op.
"""
import argparse
import json
import os
import platform
import statistics
import sys
import time

import torch

import fakequant

FWD, FWD_BWD = "fwd", "fwd+bwd"


# --- pytorch-quantization's fake_tensor_quant, as plain PyTorch --------------


class _PQFakeTensorQuant(torch.autograd.Function):
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


# --- timing -------------------------------------------------------------------


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_interleaved(fns, device, rounds, warmup=3, reps=1):
    """Median seconds per call of each function, calling them in turn every round
    (on CUDA, `reps` calls a sample, timed with CUDA events)."""
    for f in fns.values():
        for _ in range(warmup):
            f()
    _sync(device)
    samples = {name: [] for name in fns}
    for _ in range(rounds):
        for name, f in fns.items():
            if device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(reps):
                    f()
                end.record()
                end.synchronize()
                samples[name].append(start.elapsed_time(end) / 1e3 / reps)
            else:
                t0 = time.perf_counter()
                f()
                samples[name].append(time.perf_counter() - t0)
    return {name: statistics.median(v) for name, v in samples.items()}


def forward_backward(fn, x, grad):
    """A callable running fn forward and its gradient w.r.t. x (no accumulation into x.grad)."""
    xr = x.detach().requires_grad_()

    def run():
        y = fn(xr)
        return torch.autograd.grad(y, xr, grad)

    return run


# --- the cases -------------------------------------------------------------------


def cases(x):
    """(name, fakequant function, {peer name: peer function}) for each operator."""
    dev = x.device
    channels = 256
    xc = x.view(channels, -1)  # per-channel along axis 0, as conv/linear weights
    scale = torch.full((channels,), 0.02, device=dev)
    zp = torch.zeros(channels, dtype=torch.int32, device=dev)
    amax_c = torch.full((channels, 1), 2.5, device=dev)
    amax = torch.tensor(2.5, device=dev)
    lo, hi = torch.tensor(-2.0, device=dev), torch.tensor(3.0, device=dev)
    # On CUDA, parameters given as Python numbers would cost a host-to-device
    # copy per call; a QAT module keeps them on the device.
    if dev.type == "cuda":
        s1, z1 = torch.tensor(0.02, device=dev), torch.tensor(0, dtype=torch.int32, device=dev)
    else:
        s1, z1 = 0.02, 0
    return [
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
                "pq-python": lambda t: _PQFakeTensorQuant.apply(t, amax),
            },
        ),
        (
            "amax per-channel",
            xc,
            lambda t: fakequant.fake_quantize_amax(t, amax_c),
            {
                "torch": lambda t: torch.fake_quantize_per_channel_affine(
                    t, amax_c.flatten() / 127, zp, 0, -127, 127
                ),
                "pq-python": lambda t: _PQFakeTensorQuant.apply(t, amax_c),
            },
        ),
        ("min/max affine", x, lambda t: fakequant.fake_quantize_min_max(t, lo, hi), {}),
        ("quantize (integer)", x, lambda t: fakequant.quantize_amax(t, amax)[0], {}),
    ]


def run(numel, device, rounds, reps=1):
    torch.manual_seed(0)
    x = torch.randn(numel, device=device)
    grad = torch.randn(numel, device=device)
    rows = []
    for name, xin, ours, peers in cases(x):
        g = grad.view_as(xin)
        fwd = {"clone": lambda t=xin: t.clone(), "fakequant": lambda t=xin, f=ours: f(t)}
        fwd.update({p: (lambda t=xin, f=f: f(t)) for p, f in peers.items()})
        both = {"clone": fwd["clone"], "fakequant": forward_backward(ours, xin, g)}
        both.update({p: forward_backward(f, xin, g) for p, f in peers.items()})
        for mode, fns in ((FWD, fwd), (FWD_BWD, both)):
            times = time_interleaved(fns, device, rounds, reps=reps if device.type == "cuda" else 1)
            clone_time = times.pop("clone")
            limit = clone_time * (1 if mode == FWD else 2)
            bytes_moved = 2 * xin.numel() * xin.element_size() * (1 if mode == FWD else 2)
            for impl, t in times.items():
                rows.append(
                    dict(
                        device=str(device),
                        op=name,
                        mode=mode,
                        impl=impl,
                        ms=t * 1e3,
                        gbps=bytes_moved / t / 1e9,
                        vs_limit=t / limit,
                        fakequant_speedup=(t / times["fakequant"]),
                    )
                )
    return rows


def format_table(rows, numel, device):
    pages = "2 MiB pages (THP_MEM_ALLOC_ENABLE=1)" if os.environ.get("THP_MEM_ALLOC_ENABLE") == "1" else "4 KiB pages"
    where = f"{torch.get_num_threads()} threads, {pages}"
    if device.type == "cuda":
        where = f"{torch.cuda.get_device_name(device)}, CUDA events"
    head = (
        f"{numel} float32 elements on {device} ({where}); "
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
            f"| {r['op']} | {r['mode']} | {r['impl']} | {r['ms']:.2f} | {r['gbps']:.1f} | "
            f"{r['vs_limit']:.2f} | {speed} |"
        )
    return head + "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--numel", type=int, default=1 << 24)
    parser.add_argument("--device", default="cpu", help="cpu, cuda, or several: cpu,cuda")
    parser.add_argument("--cuda-reps", type=int, default=10, help="calls per CUDA timing sample")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--json", help="also save the rows to this JSON file")
    parser.add_argument("--thp", action="store_true", help="rerun with THP_MEM_ALLOC_ENABLE=1")
    args = parser.parse_args()
    if args.thp and os.environ.get("THP_MEM_ALLOC_ENABLE") != "1":
        # torch reads the variable once, at start-up.
        os.environ["THP_MEM_ALLOC_ENABLE"] = "1"
        os.execv(sys.executable, [sys.executable] + sys.argv)
    rows = []
    for device in [torch.device(d) for d in args.device.split(",")]:
        device_rows = run(args.numel, device, args.rounds, args.cuda_reps)
        print(format_table(device_rows, args.numel, device))
        rows += device_rows
    if args.json:
        meta = dict(
            numel=args.numel,
            device=args.device,
            gpu=torch.cuda.get_device_name() if "cuda" in args.device else None,
            torch=torch.__version__,
            threads=torch.get_num_threads(),
            machine=platform.processor() or platform.machine(),
            thp=os.environ.get("THP_MEM_ALLOC_ENABLE") == "1",
        )
        with open(args.json, "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
