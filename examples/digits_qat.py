"""fakequant end to end on real data: the handwritten digits that ship with scikit-learn.

    python examples/digits_qat.py [--out DIR] [--quick]

1. trains a small CNN in float32;
2. post-training quantization (PTQ): calibrates once and sets amax with each of
   max, entropy, percentile and mse;
3. quantization-aware training (QAT): fine-tunes from each calibration with a
   small learning rate and a cosine schedule;
4. does it again with 4-bit weights, where PTQ loses more and QAT wins it back;
5. exports each QAT model to ONNX (QuantizeLinear/DequantizeLinear) and runs it
   in ONNX Runtime;
6. prints the accuracies and how closely ONNX Runtime agrees with PyTorch;
7. plots one layer's calibration histogram with the amax each method chose.

Everything is seeded: the numbers are the same on every run on a given machine.
"""
import argparse
import copy
import os
import tempfile
import time

import torch
from sklearn.datasets import load_digits
from torch import nn
from tqdm.auto import tqdm

import fakequant
from fakequant.tensor_quant import QuantDescriptor
from fakequant.utils.calibrate import collect_stats, compute_amax

METHODS = ("max", "entropy", "percentile", "mse")
SEED = 0


# --- data and model -----------------------------------------------------------------------


def load_data():
    """Train/validation/test splits of the 8x8 digits, as (N, 1, 8, 8) float tensors in [0, 1]."""
    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(digits.target, dtype=torch.int64)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(SEED))
    x, y = x[order], y[order]
    n_test, n_val = 450, 200
    return (x[n_test + n_val :], y[n_test + n_val :]), (x[n_test : n_test + n_val], y[n_test : n_test + n_val]), (x[:n_test], y[:n_test])


def batches(data, batch_size, shuffle, seed=SEED):
    x, y = data
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed)) if shuffle else torch.arange(len(y))
    return [(x[order[i : i + batch_size]], y[order[i : i + batch_size]]) for i in range(0, len(y), batch_size)]


def make_model():
    # Small on purpose: with few channels there is little redundancy to absorb
    # quantization error, so calibration and QAT visibly matter.
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(16, 10),
    )


@torch.no_grad()
def logits_of(model, data):
    model.eval()
    return model(data[0])


def accuracy(logits, labels):
    return 100.0 * float((logits.argmax(1) == labels).float().mean())


def train(model, data, val, epochs, lr, desc, optimizer="adam"):
    """Trains with a cosine schedule; returns the model at its best validation accuracy."""
    torch.manual_seed(SEED)
    params = model.parameters()
    opt = torch.optim.Adam(params, lr=lr) if optimizer == "adam" else torch.optim.SGD(params, lr=lr, momentum=0.9)
    steps = epochs * len(batches(data, 64, False))
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    best, best_state = accuracy(logits_of(model, val), val[1]), copy.deepcopy(model.state_dict())
    for epoch in tqdm(range(epochs), desc=desc, unit="epoch", leave=False):
        model.train()
        for x, y in batches(data, 64, True, seed=SEED + epoch):
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
        acc = accuracy(logits_of(model, val), val[1])
        if acc > best:
            best, best_state = acc, copy.deepcopy(model.state_dict())
    model.load_state_dict(best_state)
    return model


# --- quantization ------------------------------------------------------------------------


def quantized_copy(model, weight_bits):
    """The float model with every conv/linear quantized: activations 8-bit per tensor with
    histogram calibration, weights per output channel with max calibration."""
    qmodel = copy.deepcopy(model)
    return fakequant.quantize_model(
        qmodel,
        quant_desc_input=QuantDescriptor(num_bits=8, calib_method="histogram"),
        quant_desc_weight=QuantDescriptor(num_bits=weight_bits, axis=(0,)),
    )


def amax_state(model):
    return {k: v.clone() for k, v in model.state_dict().items() if k.endswith("_amax")}


def export_and_run(model, test, path):
    """Exports to ONNX and runs the test set in ONNX Runtime: (logits, seconds)."""
    import onnxruntime as ort

    model.eval()
    start = time.perf_counter()
    fakequant.onnx.export(model, (test[0],), path, dynamo=False, opset_version=17)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    (out,) = session.run(None, {session.get_inputs()[0].name: test[0].numpy()})
    return torch.from_numpy(out), time.perf_counter() - start


def count_qdq(path):
    import onnx

    graph = onnx.load(path).graph
    return sum(n.op_type == "QuantizeLinear" for n in graph.node), sum(n.op_type == "DequantizeLinear" for n in graph.node)


def plot_histogram(qmodel, amaxes, layer, path):
    """One layer's calibration histogram, log scale, with each method's amax."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    calibrator = qmodel.get_submodule(layer)._input_quantizer._calibrator
    hist = calibrator._calib_hist.double().cpu().numpy()
    edges = calibrator._calib_bin_edges.double().cpu().numpy()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.stairs(hist, edges, fill=True, color="0.6", label="|activation| histogram (2048 bins)")
    colors = dict(max="tab:red", entropy="tab:blue", percentile="tab:green", mse="tab:purple")
    for method in METHODS:
        value = float(amaxes[method][f"{layer}._input_quantizer._amax"])
        ax.axvline(value, color=colors[method], lw=2, label=f"{method}: amax = {value:.3f}")
    ax.set_yscale("log")
    ax.set_ylim(bottom=0.8)
    ax.set_xlabel(f"|input| of layer {layer}")
    ax.set_ylabel("count (log)")
    ax.set_title("Calibration: where each method clips this layer's inputs (8-bit)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --- the run ------------------------------------------------------------------------------


def run_config(name, float_model, weight_bits, train_set, val, test, calib, out_dir, qat_epochs):
    """PTQ with each calibration method, then QAT from each, then ONNX Runtime. One row per method."""
    qmodel = quantized_copy(float_model, weight_bits)
    collect_stats(qmodel, calib, progress=True)
    amaxes, rows = {}, []
    for method in METHODS:
        compute_amax(qmodel, method, **({"percentile": 99.99} if method == "percentile" else {}))
        amaxes[method] = amax_state(qmodel)
    for method in METHODS:
        model = copy.deepcopy(qmodel)
        model.load_state_dict(amaxes[method], strict=False)
        ptq = accuracy(logits_of(model, test), test[1])
        model = train(model, train_set, val, qat_epochs, 1e-3, f"QAT {name} {method}", optimizer="sgd")
        torch_logits = logits_of(model, test)
        path = os.path.join(out_dir, f"digits_{name.replace(' ', '_')}_{method}.onnx")
        ort_logits, _ = export_and_run(model, test, path)
        rows.append(
            dict(
                config=name, method=method, ptq=ptq, qat=accuracy(torch_logits, test[1]),
                ort=accuracy(ort_logits, test[1]),
                agree=100.0 * float((ort_logits.argmax(1) == torch_logits.argmax(1)).float().mean()),
                max_diff=float((ort_logits - torch_logits).abs().max()),
                qdq=count_qdq(path), onnx=path,
            )
        )
    return qmodel, amaxes, rows


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "fakequant-demo"))
    parser.add_argument("--quick", action="store_true", help="fewer epochs (a smoke test, for the test suite)")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(SEED)
    torch.use_deterministic_algorithms(True)
    start = time.perf_counter()

    train_set, val, test = load_data()
    calib = batches(train_set, 128, False)[:4]
    print(f"digits: {len(train_set[1])} train, {len(val[1])} validation, {len(test[1])} test images (8x8)")

    float_model = train(make_model(), train_set, val, 3 if args.quick else 30, 3e-3, "float32 training")
    float_acc = accuracy(logits_of(float_model, test), test[1])
    print(f"float32 test accuracy: {float_acc:.2f}%")

    qat_epochs = 1 if args.quick else 4
    rows = []
    for name, bits in (("8-bit", 8), ("4-bit weights", 4)):
        qmodel, amaxes, config_rows = run_config(name, float_model, bits, train_set, val, test, calib, args.out, qat_epochs)
        rows += config_rows
        if bits == 8:
            plot = os.path.join(args.out, "calibration_histogram.png")
            plot_histogram(qmodel, amaxes, "3", plot)

    print()
    print("| weights | calibration | float32 | PTQ | QAT | ONNX Runtime | same predictions | max logit diff |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['config']} | {r['method']} | {float_acc:.2f}% | {r['ptq']:.2f}% | {r['qat']:.2f}% | "
              f"{r['ort']:.2f}% | {r['agree']:.2f}% | {r['max_diff']:.2e} |")
    print()
    for config in ("8-bit", "4-bit weights"):
        sub = [r for r in rows if r["config"] == config]
        best_ptq = max(r["ptq"] for r in sub)
        best_qat = max(r["qat"] for r in sub)
        print(f"{config}: best PTQ {best_ptq:.2f}%, best QAT {best_qat:.2f}% "
              f"({'QAT at or above PTQ' if best_qat >= best_ptq else 'QAT BELOW PTQ'})")
    agree = min(r["agree"] for r in rows)
    q, dq = rows[0]["qdq"]
    print(f"ONNX Runtime agrees with PyTorch on {agree:.2f}% of predictions at worst "
          f"(each graph: {q} QuantizeLinear, {dq} DequantizeLinear)")
    print(f"calibration histogram plot: {plot}")
    print(f"ONNX models: {args.out}/digits_*.onnx")
    print(f"total time {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
