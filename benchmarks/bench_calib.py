"""Calibration benchmark: HistogramCalibrator.compute_amax and histogram collection.

    python benchmarks/bench_calib.py [--bins 2048] [--repeat 20] [--device cpu|cuda] [--baseline]

Prints the median time of compute_amax("entropy" | "mse" | "percentile") on a
histogram of ``--bins`` bins (pytorch-quantization's pure-Python entropy loop
takes about 1.4 s per quantizer at 2048 bins), and the throughput of
collecting histograms per tensor and per channel, next to torch.histc (what
pytorch-quantization uses, float32 counts, per tensor only). ``--baseline``
also times a per-candidate (unvectorised) entropy search for comparison.
"""
import argparse
import statistics
import time

import numpy as np
import torch

from fakequant.calib import HistogramCalibrator


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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


def loop_entropy(hist, num_bits=8, start_bin=128):
    """Entropy search one candidate at a time (numpy per candidate), for comparison."""
    bins = hist.astype(np.int64).copy()
    bins[0] = bins[1]
    levels = 1 << (num_bits - 1)
    best, best_i = None, None
    for i in range(start_bin, len(bins) + 1):
        level = (np.arange(i) * levels) // i
        nonzero = bins[:i] > 0
        sums = np.bincount(level[nonzero], weights=bins[:i][nonzero], minlength=levels)
        counts = np.bincount(level[nonzero], minlength=levels)
        q = np.where(nonzero, sums[level] / np.maximum(counts[level], 1), 0.0)
        p = bins[:i].astype(np.float64)
        p[-1] += bins[i:].sum()
        p, q = p / p.sum(), q / q.sum()
        with np.errstate(divide="ignore", invalid="ignore"):
            kl = np.where(p > 0, np.where(q > 0, p * np.log(p / q), np.inf), 0.0).sum()
        if best is None or kl <= best:
            best, best_i = kl, i
    return best_i


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bins", type=int, default=2048)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--baseline", action="store_true", help="also time a per-candidate entropy loop")
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {device}")

    # A ReLU-like activation with a long tail, as calibration sees.
    x = torch.randn(4_000_000, device=device).relu() ** 1.5
    calibrator = HistogramCalibrator(8, None, True, num_bins=args.bins)
    calibrator.collect(x)

    print(f"\ncompute_amax on a {args.bins}-bin histogram (median of {args.repeat})")
    print(f"{'method':<12}{'time (ms)':>12}{'amax':>12}")
    for method, kwargs in (("entropy", {}), ("mse", {}), ("percentile", {"percentile": 99.99})):
        seconds = timed(lambda: calibrator.compute_amax(method, **kwargs), args.repeat, device)
        amax = calibrator.compute_amax(method, **kwargs).item()
        print(f"{method:<12}{seconds * 1e3:>12.2f}{amax:>12.4f}")
    if args.baseline:
        hist = calibrator._calib_hist.cpu().numpy()
        seconds = timed(lambda: loop_entropy(hist), 1, device, warmup=0)
        print(f"{'loop (ref.)':<12}{seconds * 1e3:>12.2f}  (entropy, one candidate at a time)")

    print(f"\nhistogram collection, {args.bins} bins (median of {args.repeat})")
    print(f"{'case':<34}{'elements':>12}{'time (ms)':>12}{'Gelem/s':>10}")
    for numel in (1 << 20, 1 << 24):
        t = torch.randn(numel, device=device)

        def collect_per_tensor():
            c = HistogramCalibrator(8, None, False, num_bins=args.bins)
            c.collect(t)
            c.collect(t)

        def histc():
            a = t.abs()
            h = torch.histc(a, bins=args.bins, min=0, max=float(a.max()))
            h += torch.histc(a, bins=args.bins, min=0, max=float(a.max()))

        per_channel = t.reshape(64, -1)

        def collect_per_channel():
            c = HistogramCalibrator(8, 0, False, num_bins=args.bins)
            c.collect(per_channel)
            c.collect(per_channel)

        for name, fn in (("fakequant, per tensor (int64)", collect_per_tensor),
                         ("fakequant, 64 channels (int64)", collect_per_channel),
                         ("torch.histc, per tensor (float32)", histc)):
            repeat = max(3, args.repeat // 4) if numel > 1 << 20 else args.repeat
            seconds = timed(fn, repeat, device) / 2
            print(f"{name:<34}{numel:>12}{seconds * 1e3:>12.2f}{numel / seconds / 1e9:>10.3f}")


if __name__ == "__main__":
    main()
