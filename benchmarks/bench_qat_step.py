"""What QAT costs over float training: one SGD training step of ResNet-18
(torchvision's layer structure: 7x7/2 stem, max pool, four stages of two basic
blocks; batch 32, 3x64x64 inputs, 100 classes) in float32, with fakequant, with
fakequant's modules running torch's fake-quant ops, and with torch.ao
eager-mode QAT.

- Step time: all configurations built in one process and stepped in turn,
  round by round (so that machine noise hits all alike); the median.
- Peak memory: a fresh process per configuration runs two steps and reports
  its peak resident set size (VmHWM), and the resident size before the
  first step (the model, the data and the libraries).
- Saved for backward: the bytes autograd keeps for backward in one step, all
  of them and those packed while a fake-quant module runs (fakequant's
  TensorQuantizer, torch.ao's FakeQuantize), counted with
  torch.autograd.graph.saved_tensors_hooks, each storage once; divided by the
  elements those modules quantize, it gives bits per element.
- Then one fake-quant op of each implementation alone: bits it saves per element.

    python benchmarks/bench_qat_step.py [--rounds 5] [--json PATH]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch
from torch import nn

from _common import (PQFakeTensorQuant, ResNet18, add_output_options, argument_parser, new_storage_bytes,
                     progress_bar, status_mb, write_json)

CONFIGS = ("float", "fakequant", "fakequant, torch's ops", "torch.ao")
DESCRIPTIONS = {
    "float": "float32 training, no quantization",
    "fakequant": "fakequant.quantize_model (8-bit inputs per tensor, weights per channel), max calibration",
    "fakequant, torch's ops": "the same model with TensorQuantizer.use_fb_fake_quant = True "
                              "(torch.fake_quantize_per_*_affine inside fakequant's modules)",
    "torch.ao": "torch.ao.quantization eager mode: fuse_modules_qat (conv+bn(+relu)), "
                "get_default_qat_qconfig('x86'), prepare_qat",
}
BATCH, SIZE, CLASSES = 32, 64, 100


def make_data():
    torch.manual_seed(0)
    return torch.randn(BATCH, 3, SIZE, SIZE), torch.randint(0, CLASSES, (BATCH,))


def build(config, data):
    torch.manual_seed(0)
    model = ResNet18(CLASSES)
    if config.startswith("fakequant"):
        import fakequant

        fakequant.quantize_model(model)
        fakequant.calibrate(model, [data[0]], num_batches=1, progress=False)
    elif config == "torch.ao":
        model.train()
        model = torch.ao.quantization.fuse_modules_qat(model, model.fusion_groups())
        model.qconfig = torch.ao.quantization.get_default_qat_qconfig("x86")
        torch.ao.quantization.prepare_qat(model, inplace=True)
    model.train()
    return model


class _TorchOps:
    """Switches fakequant's quantizers to torch's ops while a step of that configuration runs."""

    def __init__(self, config):
        self.on = config == "fakequant, torch's ops"

    def __enter__(self):
        if self.on:
            from fakequant.nn import TensorQuantizer

            TensorQuantizer.use_fb_fake_quant = True

    def __exit__(self, *exc):
        if self.on:
            from fakequant.nn import TensorQuantizer

            TensorQuantizer.use_fb_fake_quant = False


def step(model, opt, data):
    loss = nn.functional.cross_entropy(model(data[0]), data[1])
    opt.zero_grad()
    loss.backward()
    opt.step()


def _quantizer_classes():
    classes = [torch.ao.quantization.FakeQuantizeBase]
    try:
        from fakequant.nn import TensorQuantizer

        classes.append(TensorQuantizer)
    except ImportError:
        pass
    return tuple(classes)


def saved_bytes(model, data):
    """Bytes autograd keeps for backward in one step (each storage once): in all,
    and packed while a fake-quant module runs; and the elements those modules
    quantized."""
    seen, counts = set(), {"all": 0, "fake_quant": 0, "quantized_elements": 0}
    active = [0]
    quantizers = [m for m in model.modules() if isinstance(m, _quantizer_classes())]

    def pre(module, args):
        active[0] += 1
        counts["quantized_elements"] += args[0].numel()

    def post(module, args, output):
        active[0] -= 1

    handles = [m.register_forward_pre_hook(pre) for m in quantizers]
    handles += [m.register_forward_hook(post) for m in quantizers]

    def pack(t):
        n = new_storage_bytes(seen, t)
        counts["all"] += n
        if active[0]:
            counts["fake_quant"] += n
        return t

    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = nn.functional.cross_entropy(model(data[0]), data[1])
        loss.backward()
    finally:
        for h in handles:
            h.remove()
    return counts


def saved_bits_per_element_of_one_op():
    """Bits saved for backward per element by one fake-quant op, each implementation
    run alone on a tensor that requires grad."""
    import fakequant

    x = torch.randn(1 << 16, requires_grad=True)
    amax = torch.tensor(2.5)
    ao = torch.ao.quantization.FakeQuantize(quant_min=-128, quant_max=127, dtype=torch.qint8)
    candidates = {
        "fakequant.fake_quantize_amax": lambda: fakequant.fake_quantize_amax(x, amax),
        "fakequant.fake_quantize_per_tensor_affine": lambda: fakequant.fake_quantize_per_tensor_affine(x, 0.02, 0, -128, 127),
        "torch.fake_quantize_per_tensor_affine": lambda: torch.fake_quantize_per_tensor_affine(x, 0.02, 0, -128, 127),
        "torch.ao FakeQuantize module": lambda: ao(x),
        "pytorch-quantization's fake_tensor_quant (as plain PyTorch)": lambda: PQFakeTensorQuant.apply(x, amax),
    }
    bits = {}
    for name, fn in candidates.items():
        saved = {"bytes": 0}

        def pack(t):
            if t.numel() > 1:  # scalar scales and zero points aside
                saved["bytes"] += t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            fn()
        bits[name] = 8.0 * saved["bytes"] / x.numel()
    return bits


def memory_of_one(config):
    """In a fresh process: resident size before training, peak over two steps, saved bytes."""
    data = make_data()
    model = build(config, data)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    with _TorchOps(config):
        step(model, opt, data)  # the optimizer's momentum buffers exist from here on
        before = status_mb("VmRSS")
        step(model, opt, data)
        peak = status_mb("VmHWM")
        saved = saved_bytes(model, data)
    return dict(config=config, rss_before_mb=before, peak_rss_mb=peak,
                saved_mb=saved["all"] / 2**20, saved_fake_quant_mb=saved["fake_quant"] / 2**20,
                quantized_elements=saved["quantized_elements"],
                fake_quant_bits_per_element=(8.0 * saved["fake_quant"] / saved["quantized_elements"]
                                             if saved["quantized_elements"] else None))


def step_times(rounds, progress=None):
    """Median step time of every configuration, stepped in turn each round."""
    data = make_data()
    models = {c: build(c, data) for c in CONFIGS}
    opts = {c: torch.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9) for c, m in models.items()}
    samples = {c: [] for c in CONFIGS}
    for r in range(rounds + 1):  # the first round warms up
        for c in CONFIGS:
            with _TorchOps(c):
                t0 = time.perf_counter()
                step(models[c], opts[c], data)
                dt = time.perf_counter() - t0
            if r:
                samples[c].append(dt)
        if progress is not None:
            progress.update(1)
    return {c: statistics.median(v) for c, v in samples.items()}


def run(rounds, progress=True):
    with progress_bar(rounds + 1 + len(CONFIGS), "QAT step", progress) as bar:
        times = step_times(rounds, bar)
        rows = []
        for config in CONFIGS:
            out = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", config],
                                 capture_output=True, text=True, check=True)
            row = json.loads(out.stdout.strip().splitlines()[-1])
            row["step_ms"] = times[config] * 1e3
            rows.append(row)
            bar.update(1)
    base = rows[0]["step_ms"]
    for r in rows:
        r["vs_float"] = r["step_ms"] / base
    return dict(steps=rows, rounds=rounds, threads=torch.get_num_threads(),
                saved_bits_per_element=saved_bits_per_element_of_one_op(), descriptions=DESCRIPTIONS)


def format_tables(result):
    rows = result["steps"]
    lines = [
        "| training | step (ms) | x float | peak RSS (MB) | RSS before the step (MB) | saved for backward (MB) "
        "| of which by fake-quant modules (MB) | bits/element saved by fake quantization |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        bits = r["fake_quant_bits_per_element"]
        lines.append(
            f"| {r['config']} | {r['step_ms']:.0f} | {r['vs_float']:.2f} | {r['peak_rss_mb']:.0f} | "
            f"{r['rss_before_mb']:.0f} | {r['saved_mb']:.1f} | {r['saved_fake_quant_mb']:.2f} | "
            f"{'' if bits is None else f'{bits:.2f}'} |"
        )
    lines += ["", "| one fake-quant op alone | saved for backward (bits/element) |", "|---|---:|"]
    for name, b in result["saved_bits_per_element"].items():
        lines.append(f"| {name} | {b:g} |")
    return "\n".join(lines)


def main():
    parser = argument_parser(__doc__)
    parser.add_argument("--rounds", type=int, default=5, help="timed steps of each configuration")
    add_output_options(parser, progress=True)
    parser.add_argument("--one", choices=CONFIGS, help=argparse.SUPPRESS)  # the child process
    args = parser.parse_args()
    if args.one:
        print(json.dumps(memory_of_one(args.one)))
        return
    result = run(args.rounds, not args.no_progress)
    print(f"ResNet-18 (torchvision's layers), batch {BATCH}, 3x{SIZE}x{SIZE}, SGD; "
          f"{result['threads']} threads; median of {args.rounds} steps, configurations interleaved")
    print(format_tables(result))
    write_json(args.json, result)


if __name__ == "__main__":
    main()
