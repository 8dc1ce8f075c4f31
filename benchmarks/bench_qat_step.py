"""What QAT costs over float training: one training step of a ResNet-18-shaped
model (batch 32, 3x64x64 inputs), float32 vs fakequant vs torch.ao eager-mode QAT.

For each: median step time, peak resident memory of a fresh process running
only that configuration, and the bytes autograd saves for backward in a step
(torch.autograd.graph.saved_tensors_hooks). Then, per implementation of one
fake-quant op run alone, the bits it saves per element.

    python benchmarks/bench_qat_step.py [--steps 3] [--json PATH]
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # for bench_ops

CONFIGS = ("float", "fakequant", "torch.ao")


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.relu1, self.relu2 = nn.ReLU(), nn.ReLU()
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
        self.add = torch.ao.nn.quantized.FloatFunctional()  # a plain add outside torch.ao QAT

    def forward(self, x):
        out = self.relu1(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu2(self.add.add(out, x if self.down is None else self.down(x)))


class ResNet18(nn.Module):
    """ResNet-18's layer shapes, for 64x64 inputs."""

    def __init__(self, classes=100):
        super().__init__()
        self.quant = torch.ao.quantization.QuantStub()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU())
        blocks, cin = [], 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            blocks += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, classes)
        self.dequant = torch.ao.quantization.DeQuantStub()

    def forward(self, x):
        x = self.blocks(self.stem(self.quant(x)))
        return self.dequant(self.fc(torch.flatten(self.pool(x), 1)))


def build(config, data):
    torch.manual_seed(0)
    model = ResNet18()
    if config == "fakequant":
        import fakequant

        fakequant.quantize_model(model)
        fakequant.calibrate(model, [data[0]], num_batches=1, progress=False)
    elif config == "torch.ao":
        model.train()
        model.qconfig = torch.ao.quantization.get_default_qat_qconfig("x86")
        torch.ao.quantization.prepare_qat(model, inplace=True)
    model.train()
    return model


def saved_bytes(model, data):
    """Bytes autograd keeps for backward in one step (each storage counted once).
    The fake-quant share is this minus the float model's."""
    seen, counts = set(), {"bytes": 0}

    def pack(t):
        key = (t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
        if key not in seen:
            seen.add(key)
            counts["bytes"] += key[1]
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = nn.functional.cross_entropy(model(data[0]), data[1])
    loss.backward()
    return counts["bytes"]


def saved_bits_per_element_of_one_op():
    """Bits saved for backward per element by one fake-quant op, each implementation
    run alone on a tensor that requires grad."""
    import fakequant
    from bench_ops import _PQFakeTensorQuant

    x = torch.randn(1 << 16, requires_grad=True)
    amax = torch.tensor(2.5)
    ao = torch.ao.quantization.FakeQuantize(quant_min=-128, quant_max=127, dtype=torch.qint8)
    candidates = {
        "fakequant.fake_quantize_amax": lambda: fakequant.fake_quantize_amax(x, amax),
        "fakequant.fake_quantize_per_tensor_affine": lambda: fakequant.fake_quantize_per_tensor_affine(x, 0.02, 0, -128, 127),
        "torch.fake_quantize_per_tensor_affine": lambda: torch.fake_quantize_per_tensor_affine(x, 0.02, 0, -128, 127),
        "torch.ao FakeQuantize module": lambda: ao(x),
        "pytorch-quantization's fake_tensor_quant (as plain PyTorch)": lambda: _PQFakeTensorQuant.apply(x, amax),
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


def run_one(config, steps):
    """Runs in a fresh process: step times, peak RSS, saved bytes per element."""
    torch.manual_seed(0)
    data = (torch.randn(32, 3, 64, 64), torch.randint(0, 100, (32,)))
    model = build(config, data)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    times = []
    for _ in range(steps + 1):
        t0 = time.perf_counter()
        loss = nn.functional.cross_entropy(model(data[0]), data[1])
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    result = dict(config=config, step_ms=statistics.median(times[1:]) * 1e3,
                  peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    result["saved_mb"] = saved_bytes(model, data) / 2**20
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--json")
    parser.add_argument("--one", choices=CONFIGS, help=argparse.SUPPRESS)  # the child process
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one(args.one, args.steps)))
        return
    rows = []
    for config in CONFIGS:
        out = subprocess.run([sys.executable, __file__, "--one", config, "--steps", str(args.steps)],
                             capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    base = rows[0]["step_ms"]
    print(f"ResNet-18-shaped model, batch 32, 3x64x64, SGD; {torch.get_num_threads()} threads; median of {args.steps} steps")
    print("| training | step (ms) | x float | peak RSS (MB) | saved for backward (MB) |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['config']} | {r['step_ms']:.0f} | {r['step_ms'] / base:.2f} | {r['peak_rss_mb']:.0f} | {r['saved_mb']:.0f} |")
    bits = saved_bits_per_element_of_one_op()
    print()
    print("| one fake-quant op | saved for backward (bits/element) |")
    print("|---|---:|")
    for name, b in bits.items():
        print(f"| {name} | {b:g} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(steps=rows, saved_bits_per_element=bits), f, indent=1)


if __name__ == "__main__":
    main()
