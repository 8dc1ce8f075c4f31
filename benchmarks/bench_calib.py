"""Calibration benchmark: HistogramCalibrator.compute_amax and histogram collection.

    python benchmarks/bench_calib.py [--bins 2048] [--repeat 20] [--device cpu|cuda] [--baseline] [--json PATH]

Prints the median time of compute_amax("entropy" | "mse" | "percentile") on a
histogram of ``--bins`` bins (pytorch-quantization's pure-Python entropy loop
takes about 1.4 s per quantizer at 2048 bins), and the throughput of
collecting histograms per tensor and per channel, next to torch.histc (what
pytorch-quantization uses, float32 counts, per tensor only). ``--baseline``
also times a per-candidate (unvectorised) entropy search for comparison.
"""
import statistics
import time

import torch

from _common import add_output_options, argument_parser, size_label, sync, test_oracles, write_json
from fakequant.calib import HistogramCalibrator


def timed(fn, repeat, device, warmup=2):
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def run(bins=2048, repeat=20, device="cpu", baseline=False):
    """compute_amax times and histogram collection throughput, as a dict of rows."""
    device = torch.device(device)
    torch.manual_seed(0)
    # A ReLU-like activation with a long tail, as calibration sees.
    x = torch.randn(4_000_000, device=device).relu() ** 1.5
    calibrator = HistogramCalibrator(8, None, True, num_bins=bins)
    calibrator.collect(x)

    amax_rows = []
    for method, kwargs in (("entropy", {}), ("mse", {}), ("percentile", {"percentile": 99.99})):
        seconds = timed(lambda: calibrator.compute_amax(method, **kwargs), repeat, device)
        amax = calibrator.compute_amax(method, **kwargs).item()
        amax_rows.append(dict(method=method, ms=seconds * 1e3, amax=amax))
    if baseline:
        hist = calibrator._calib_hist.cpu().numpy()
        edges = calibrator._calib_bin_edges.cpu().numpy()
        entropy_amax = test_oracles().entropy_amax
        seconds = timed(lambda: entropy_amax(hist, edges), 1, device, warmup=0)
        amax_rows.append(dict(method="entropy, one candidate at a time (numpy loop, for reference)",
                              ms=seconds * 1e3, amax=None))

    collect_rows = []
    for numel in (1 << 20, 1 << 24):
        t = torch.randn(numel, device=device)

        def collect_per_tensor():
            c = HistogramCalibrator(8, None, False, num_bins=bins)
            c.collect(t)
            c.collect(t)

        def histc():
            a = t.abs()
            h = torch.histc(a, bins=bins, min=0, max=float(a.max()))
            h += torch.histc(a, bins=bins, min=0, max=float(a.max()))

        per_channel = t.reshape(64, -1)

        def collect_per_channel():
            c = HistogramCalibrator(8, 0, False, num_bins=bins)
            c.collect(per_channel)
            c.collect(per_channel)

        for name, fn in (("fakequant, per tensor (int64)", collect_per_tensor),
                         ("fakequant, 64 channels (int64)", collect_per_channel),
                         ("torch.histc, per tensor (float32)", histc)):
            reps = max(3, repeat // 4) if numel > 1 << 20 else repeat
            seconds = timed(fn, reps, device) / 2
            collect_rows.append(dict(case=name, numel=numel, ms=seconds * 1e3, gelem_s=numel / seconds / 1e9))
    return dict(bins=bins, repeat=repeat, device=str(device), compute_amax=amax_rows, collect=collect_rows)


def format_tables(result):
    lines = [f"| method | compute_amax, {result['bins']} bins (ms) | amax |", "|---|---:|---:|"]
    for r in result["compute_amax"]:
        amax = "" if r["amax"] is None else f"{r['amax']:.4f}"
        lines.append(f"| {r['method']} | {r['ms']:.2f} | {amax} |")
    lines += ["", f"| histogram collection, {result['bins']} bins | elements | time per tensor (ms) "
              "| Gelements/s |", "|---|---:|---:|---:|"]
    for r in result["collect"]:
        lines.append(f"| {r['case']} | {size_label(r['numel'])} | {r['ms']:.2f} | {r['gelem_s']:.3f} |")
    return "\n".join(lines)


def main():
    parser = argument_parser(__doc__, summary=True)
    parser.add_argument("--bins", type=int, default=2048)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--baseline", action="store_true", help="also time a per-candidate entropy loop")
    add_output_options(parser, json_help="also save the results to this JSON file")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {args.device}; "
          f"medians of {args.repeat} (of {max(3, args.repeat // 4)} at 2^24 elements)")
    result = run(args.bins, args.repeat, args.device, args.baseline)
    result["threads"] = torch.get_num_threads()
    print(format_tables(result))
    write_json(args.json, result)


if __name__ == "__main__":
    main()
