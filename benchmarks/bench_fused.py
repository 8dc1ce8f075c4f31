"""Fused observer benchmark: ``fakequant.ops.fused_moving_avg_obs_fake_quant`` against
``torch.fused_moving_avg_obs_fake_quant`` (what torch.ao's ``FusedMovingAvgObsFakeQuantize``
calls), both with the observer and fake quantization on, timed in one process with the
two interleaved round by round.

Cases: per tensor on a flat tensor, and per channel (``per_row_fake_quant``, ``ch_axis=0``)
on a ``(64, n / 64)`` weight-shaped tensor; forward with an input that does not require
grad, and forward+backward. Target (issue 15): fakequant at least 1.5x faster than torch at
2^20 and 2^24 float32 elements on CPU.

    python benchmarks/bench_fused.py [--sizes 2^20,2^24] [--rounds 9] [--threads N] [--json PATH]

On a shared 2-core machine a parallel region waits a scheduler tick (4-8 ms) whenever the
other core is busy, which swamps both candidates at 2^20; ``--threads 1`` measures the
kernels without that.
"""
import platform

import torch

import fakequant
from _common import (add_output_options, argument_parser, forward_backward, parse_sizes, settle, size_label,
                     time_interleaved, write_json)

TARGET = 1.5
CHANNELS = 64


def candidates(n, per_channel, mode, device):
    shape = (CHANNELS, n // CHANNELS) if per_channel else (n,)
    x = torch.randn(shape, device=device) * 3 + 0.5
    grad = torch.ones_like(x)
    on = torch.tensor([1], dtype=torch.uint8, device=device)
    fns = {}
    for name, op in (("torch", torch.fused_moving_avg_obs_fake_quant),
                     ("fakequant", fakequant.ops.fused_moving_avg_obs_fake_quant)):
        c = CHANNELS if per_channel else 1
        bufs = (torch.full((c,), float("inf"), device=device), torch.full((c,), float("-inf"), device=device),
                torch.ones(c, device=device), torch.zeros(c, dtype=torch.int32, device=device))

        def fn(t, op=op, bufs=bufs):
            return op(t, on, on, *bufs, 0.01, 0, 255, 0, per_channel, False)

        fns[name] = (lambda fn=fn: fn(x)) if mode == "fwd" else forward_backward(fn, x, grad)
    return fns


def run(args):
    device = torch.device(args.device)
    settle(device)
    rows = []
    for n in args.sizes:
        for per_channel in (False, True):
            for mode in ("fwd", "fwd+bwd"):
                fns = candidates(n, per_channel, mode, device)
                rounds = args.rounds or (15 if n <= 1 << 22 else 7)
                t = time_interleaved(fns, device, rounds, min_sample_s=0.02)
                row = {"device": device.type, "numel": n, "granularity": "per channel" if per_channel else "per tensor",
                       "mode": mode, "torch_ms": t["torch"] * 1e3, "fakequant_ms": t["fakequant"] * 1e3,
                       "speedup": t["torch"] / t["fakequant"]}
                rows.append(row)
                print(format_row(row), flush=True)
    return {"meta": {"torch": torch.__version__, "threads": torch.get_num_threads(),
                     "cpu": platform.processor() or platform.machine()}, "rows": rows}


def format_row(r):
    return (f"| {size_label(r['numel'])} | {r['granularity']} | {r['mode']} | {r['torch_ms']:.3f} | "
            f"{r['fakequant_ms']:.3f} | {r['speedup']:.2f}x |")


def format_table(rows):
    head = ["| elements | granularity | mode | torch ms | fakequant ms | torch / fakequant |",
            "|---|---|---|---|---|---|"]
    return "\n".join(head + [format_row(r) for r in rows])


def main():
    p = argument_parser(__doc__, summary=True)
    p.add_argument("--sizes", default="2^20,2^24")
    p.add_argument("--device", default="cpu")
    p.add_argument("--rounds", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (default: torch's)")
    add_output_options(p)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    args.sizes = parse_sizes(args.sizes)
    result = run(args)
    print(format_table(result["rows"]))
    write_json(args.json, result)


if __name__ == "__main__":
    main()
