"""From QAT to served checkpoints: a small Llama trained, quantization-aware trained, exported in
both serving formats and reloaded by each format's own library (`make demo-serve`).

    python examples/serve_demo.py [--out DIR] [--quick]

Offline and on the CPU (needs ``pip install 'fakequant[serve]'``; ``make build`` installs it):

1. a random-init ``transformers.LlamaForCausalLM`` (hidden 128, 2 layers, vocabulary 256) learns a
   synthetic next-token task: each sequence follows a fixed random permutation of the
   vocabulary (token t + 1 = perm[token t]) from a random first token; float training first;
2. for each preset, a copy is quantized (``fakequant.quantize_model``), calibrated, and fine-tuned
   with QAT; the held-out loss and next-token accuracy are measured after calibration (PTQ) and
   after QAT, beside the float model trained for the same further steps;
3. each QAT model is exported with ``fakequant.export_checkpoint``: ``INT8``, ``W8A8`` and
   ``W4A16`` as compressed-tensors (vLLM, SGLang), ``GGUF_Q8_0`` and ``GGUF_Q4_0`` as GGUF
   (llama.cpp), the GGUF files with F16 embeddings and ``lm_head`` (llama.cpp's default) and
   with F32 ones;
4. each checkpoint is reloaded by the format's own library and compared with the fakequant model
   in eval mode:

   - compressed-tensors: transformers + compressed-tensors. Weights from the dequantized load
     (``CompressedTensorsConfig(dequantize=True)``), logits from the default load (weights kept
     compressed, inputs quantized by compressed-tensors' own rules);
   - GGUF: ``gguf.GGUFReader`` reads the file and ``gguf.quants.dequantize`` every tensor (the
     q/k rows put back in transformers' order); logits from a transformers Llama holding those
     tensors whose Linear inputs are rounded to Q8_0 by ``gguf.quants`` (what llama.cpp's CPU
     matmul does to the inputs of Q8_0/Q4_0 weights);

5. every compressed-tensors preset (``INT8``, ``W8A8``, ``W4A8``, ``W4A16``, ``FP8``,
   ``FP8_PER_CHANNEL``, ``NVFP4``, ``MXFP8``, ``MXFP4``) QAT'd for each serving target
   (``quantize_model(target="onnx" | "vllm")``, docs/serving.md "Targets"), exported and loaded
   compressed by transformers + compressed-tensors: its logits against fakequant's eval-mode
   model (the largest difference, of the largest logit, argmax agreement), the FP4 and MX
   presets in bfloat16 (with the rotary frequencies in float32, as the load has them);
6. prints the tables, also written to DIR/results.md.

Every quantized weight must equal fakequant's fake-quantized weight bit for bit (same bits, the
sign of zero included: the criterion of the tests' ``bits_equal``); the script exits with an
error otherwise. Everything is seeded.
"""
import os

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing is downloaded
os.environ.setdefault("TQDM_DISABLE", "1")

import argparse  # noqa: E402
import copy  # noqa: E402
import logging  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

import fakequant  # noqa: E402
from fakequant import nn as quant_nn  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_compressed_tensors import largest_diff, size, to_dtype  # noqa: E402

# (preset, export format, GGUF float_type of the other 2-D tensors)
RUNS = [("INT8", "compressed-tensors", None), ("W8A8", "compressed-tensors", None),
        ("W4A16", "compressed-tensors", None), ("GGUF_Q8_0", "gguf", "f16"), ("GGUF_Q8_0", "gguf", "f32"),
        ("GGUF_Q4_0", "gguf", "f16"), ("GGUF_Q4_0", "gguf", "f32")]
# why the compressed load's logits differ where they do (docs/serving.md, docs/serving_gguf.md)
WHY = {
    "W8A8": "per-token int8 inputs: compressed-tensors' scale is amax / 127.5, fakequant's amax / 127",
    "f16": "the file's F16 embeddings and lm_head (fakequant's model keeps them float32)",
}
VOCAB, SEQ, BATCH = 256, 32, 16
# the targets' table: every compressed-tensors preset QAT'd for each target (quantize_model(target=...)),
# the FP4 and MX ones then run in bfloat16 (compressed-tensors' compressed load decompresses them to it)
TARGET_PRESETS = ["INT8", "W8A8", "W4A8", "W4A16", "FP8", "FP8_PER_CHANNEL", "NVFP4", "MXFP8", "MXFP4"]
TARGETS = ("onnx", "vllm")
IN_BFLOAT16 = ("NVFP4", "MXFP8", "MXFP4")
# why the compressed load's logits differ from fakequant's for a (preset, target) (docs/serving.md, "Targets")
WHY_TARGET = {
    ("W8A8", "onnx"): "per-token int8 inputs: compressed-tensors' scale is amax / 127.5, fakequant's amax / 127",
    ("W4A8", "onnx"): "per-token int8 inputs: compressed-tensors' scale is amax / 127.5, fakequant's amax / 127",
    ("W8A8", "vllm"): "per-token int8 inputs: compressed-tensors' scale is amax / 127.5, vLLM's amax / 127",
    ("W4A8", "vllm"): "per-token int8 inputs: compressed-tensors' scale is amax / 127.5, vLLM's amax / 127",
    ("FP8", "vllm"): "per-tensor FP8 inputs: vLLM multiplies by the rounded reciprocal of the scale, "
                     "compressed-tensors divides by it (ties fall apart)",
    ("NVFP4", "onnx"): "activation block scales: compressed-tensors divides E4M3 codes by a global scale, "
                       "fakequant multiplies",
    ("NVFP4", "vllm"): "activation block scales: compressed-tensors computes amax / 6 in bfloat16, vLLM in float32",
    ("MXFP8", "onnx"): "activation block scales: compressed-tensors rounds the block max to the nearest power of "
                       "two, fakequant floors it (OCP)",
    ("MXFP4", "onnx"): "activation block scales: compressed-tensors rounds the block max to the nearest power of "
                       "two, fakequant floors it (OCP)",
}


def same_bits(a, b):
    """Same dtype, shape and bit patterns (the tests' bits_equal criterion, -0.0 != +0.0)."""
    a, b = a.detach().cpu(), b.detach().cpu()
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.int32), b.view(torch.int32))


def make_llama():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=VOCAB, max_position_embeddings=SEQ, rms_norm_eps=1e-5, bos_token_id=0, eos_token_id=0,
        pad_token_id=0)
    return transformers.LlamaForCausalLM(config)


class Task:
    """Sequences that follow a fixed permutation of the vocabulary from a random first token."""

    def __init__(self, seed=0):
        self.perm = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(seed))
        self.eval_ids = self.batch(torch.Generator().manual_seed(10_000))

    def batch(self, generator, n=BATCH):
        ids = torch.empty(n, SEQ, dtype=torch.long)
        ids[:, 0] = torch.randint(0, VOCAB, (n,), generator=generator)
        for t in range(1, SEQ):
            ids[:, t] = self.perm[ids[:, t - 1]]
        return ids


def loss_of(logits, ids):
    return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB).float(), ids[:, 1:].reshape(-1))


def evaluate(model, task):
    """(held-out loss, next-token accuracy) of a model in eval mode."""
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=task.eval_ids).logits
    acc = (logits[:, :-1].argmax(-1) == task.eval_ids[:, 1:]).float().mean().item()
    return loss_of(logits, task.eval_ids).item(), acc


def train(model, task, steps, lr, seed):
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1 - s / steps)
    model.train()
    for _ in range(steps):
        ids = task.batch(generator)
        loss = loss_of(model(input_ids=ids).logits, ids)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    model.eval()
    return model


def quantize_and_qat(float_model, preset, task, steps, target="onnx"):
    model = fakequant.quantize_model(copy.deepcopy(float_model), preset=preset, target=target)
    generator = torch.Generator().manual_seed(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (a weight-only preset's disabled input quantizers collect nothing)
        fakequant.calibrate(model, [task.batch(generator) for _ in range(4)], progress=False,
                            forward_fn=lambda m, ids: m(input_ids=ids))
    ptq = evaluate(model, task)
    train(model, task, steps, lr=5e-4, seed=2)  # (the float reference in main() trains the same)
    return model, ptq, evaluate(model, task)


def weights_equal(model, loaded):
    """(weights equal bit for bit, quantized weights in all): the fake-quantized weight of every
    QuantLinear of ``model`` against the weight of ``loaded``'s module of the same name."""
    equal = total = 0
    for name, module in model.named_modules():
        if isinstance(module, quant_nn.QuantLinear):
            with torch.no_grad():
                fake = module.weight_quantizer(module.weight)
            equal += same_bits(loaded.get_submodule(name).weight, fake)
            total += 1
    return equal, total


# --- compressed-tensors: transformers + compressed-tensors ----------------------------------------

def reload_compressed_tensors(directory):
    """(the dequantized load, for the weights; the default, compressed load, for the logits)."""
    from transformers import AutoModelForCausalLM, CompressedTensorsConfig

    dense = AutoModelForCausalLM.from_pretrained(directory,
                                                 quantization_config=CompressedTensorsConfig(dequantize=True))
    compressed = AutoModelForCausalLM.from_pretrained(directory).eval()
    return dense, compressed, "transformers + compressed-tensors"


# --- GGUF: gguf's reader and dequantization --------------------------------------------------------

def rows_from_llama_cpp(t, heads):
    """q/k projection rows from llama.cpp's order back to transformers' (within each head, rows
    0, half, 1, half + 1, ... of the file are transformers' rows 0, 1, ... of the two halves)."""
    half = t.shape[0] // heads // 2
    return t.reshape(heads, half, 2, *t.shape[1:]).transpose(1, 2).reshape(t.shape)


def q8_0_inputs(module, args):
    """A Linear's input rounded to Q8_0 blocks of 32 by gguf.quants (llama.cpp's CPU matmul)."""
    import gguf

    x = args[0]
    a = x.detach().float().reshape(-1, x.shape[-1]).numpy()
    q8 = gguf.GGMLQuantizationType.Q8_0
    return (torch.from_numpy(gguf.quants.dequantize(gguf.quants.quantize(a, q8), q8)).reshape(x.shape).to(x.dtype),)


def reload_gguf(model, path):
    """A transformers Llama holding the tensors gguf reads from ``path`` (twice: for the weights
    and for the logits); the Linear layers stored as Q8_0/Q4_0 get their inputs rounded to Q8_0
    by gguf."""
    import gguf

    reader = gguf.GGUFReader(path)
    cfg = model.config
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, cfg.num_hidden_layers)
    params = dict(model.named_parameters())
    by_gguf = {names.get_name(n, try_suffixes=(".weight", ".bias")): n for n in params}
    arch = gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.LLAMA]
    heads = reader.fields[gguf.Keys.Attention.HEAD_COUNT.format(arch=arch)].contents()
    kv_heads = reader.fields[gguf.Keys.Attention.HEAD_COUNT_KV.format(arch=arch)].contents()
    reloaded = make_llama().eval()
    state, quantized = {}, []
    for t in reader.tensors:
        hf = by_gguf[t.name]
        values = torch.from_numpy(np.array(gguf.quants.dequantize(t.data, t.tensor_type))).reshape(params[hf].shape)
        rows = heads if ".q_proj." in hf else kv_heads if ".k_proj." in hf else None
        state[hf] = rows_from_llama_cpp(values, rows) if rows else values
        if t.tensor_type.name in ("Q8_0", "Q4_0"):
            quantized.append(hf.rpartition(".")[0])
    reloaded.load_state_dict(state, strict=True)
    for name in quantized:
        reloaded.get_submodule(name).register_forward_pre_hook(q8_0_inputs)
    return reloaded, reloaded, "gguf.GGUFReader + gguf.quants"


def targets_table(trained, model, task, qat_steps, out, start):
    """For every compressed-tensors preset and target: QAT (reusing ``trained``'s float32 models
    by (preset, target)), the compressed-tensors export, and the compressed load's logits
    against fakequant's eval-mode model (the FP4 and MX presets in bfloat16). Returns (the
    table's rows, the runs whose weights were not bit for bit)."""
    rows = ["| preset | target | model dtype | weights, dequantized load | max abs logits diff | "
            "of the largest logit | argmax agreement | why |", "|---|---|---|---|---|---|---|---|"]
    failed = []
    for preset in TARGET_PRESETS:
        for target in TARGETS:
            if (preset, target) not in trained:
                trained[(preset, target)] = quantize_and_qat(model, preset, task, qat_steps, target)
            dtype = torch.bfloat16 if preset in IN_BFLOAT16 else torch.float32
            qat = to_dtype(copy.deepcopy(trained[(preset, target)][0]), dtype).eval()  # (RoPE as loaded)
            directory = os.path.join(out, "targets", f"{preset}-{target}")
            fakequant.export_checkpoint(qat, directory)
            dense, reloaded, _ = reload_compressed_tensors(directory)
            equal, total = weights_equal(qat, dense)
            with torch.no_grad():
                ours = qat(input_ids=task.eval_ids).logits
                theirs = reloaded(input_ids=task.eval_ids).logits
            diff = (theirs.float() - ours.float()).abs().max().item()
            share = diff / ours.float().abs().max().item()
            agree = (theirs.argmax(-1) == ours.argmax(-1)).float().mean().item()
            exact = same_bits(theirs, ours)
            why = "" if exact else WHY_TARGET.get((preset, target), "?")
            rows.append(f"| {preset} | {target} | {str(dtype).replace('torch.', '')} | {equal}/{total} bit for bit | "
                        f"{'0 (bit for bit)' if exact else f'{diff:.3g}'} | {share:.2%} | {agree:.2%} | {why} |")
            print(f"[{time.perf_counter() - start:.0f} s] {preset}, target {target}: logits {share:.2%} of the largest",
                  flush=True)
            if equal != total:
                failed.append(f"{preset} target={target}")
    return rows, failed


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None, help="the folder for the checkpoints and results.md "
                                                    "(default: a temporary folder)")
    parser.add_argument("--quick", action="store_true", help="a few training steps (for the tests)")
    parser.add_argument("--steps", type=int, default=None, help="float training steps (default 150; quick 20)")
    parser.add_argument("--qat-steps", type=int, default=None, help="QAT steps per preset (default 40; quick 2)")
    args = parser.parse_args()
    steps = args.steps if args.steps is not None else 20 if args.quick else 150
    qat_steps = args.qat_steps if args.qat_steps is not None else 2 if args.quick else 40
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(min(2, torch.get_num_threads()))
    out = args.out or tempfile.mkdtemp(prefix="fakequant-serve-demo-")
    os.makedirs(out, exist_ok=True)
    start = time.perf_counter()

    task = Task()
    model = train(make_llama(), task, steps, lr=3e-3, seed=1)
    base = os.path.join(out, "bf16")
    copy.deepcopy(model).to(torch.bfloat16).save_pretrained(base)
    bf16 = size(base)
    float_loss, float_acc = evaluate(model, task)
    lines = [f"Float training: {steps} steps of {BATCH} x {SEQ} tokens; held-out loss {float_loss:.4f}, "
             f"next-token accuracy {float_acc:.2%}. bf16 checkpoint (save_pretrained): {bf16:,} bytes.", ""]
    print(f"[{time.perf_counter() - start:.0f} s] {lines[0]}", flush=True)

    # the reference for QAT: the float model trained for the same further steps
    longer = train(copy.deepcopy(model), task, qat_steps, lr=5e-4, seed=2)
    qat_rows = ["| preset | PTQ loss / accuracy | QAT loss / accuracy |", "|---|---|---|",
                "| none (float: before / after the same steps) | {:.4f} / {:.2%} | {:.4f} / {:.2%} |".format(
                    float_loss, float_acc, *evaluate(longer, task))]
    rows = ["| format | preset | file bytes (x bf16) | load check | max weight diff | "
            "max logits diff (of the largest) | accuracy, reloaded |", "|---|---|---|---|---|---|---|"]
    trained = {}
    failed = []
    for preset, fmt, float_type in RUNS:
        if (preset, "onnx") not in trained:
            trained[(preset, "onnx")] = quantize_and_qat(model, preset, task, qat_steps)
            _, (pl, pa), (ql, qa) = trained[(preset, "onnx")]
            qat_rows.append(f"| {preset} | {pl:.4f} / {pa:.2%} | {ql:.4f} / {qa:.2%} |")
            print(f"[{time.perf_counter() - start:.0f} s] {preset}: PTQ loss {pl:.4f}, QAT loss {ql:.4f}", flush=True)
        qat = trained[(preset, "onnx")][0].eval()
        if fmt == "gguf":
            directory = os.path.join(out, f"{preset}-{float_type}")
            path = fakequant.export_checkpoint(qat, directory, format="gguf", float_type=float_type)
            nbytes = os.path.getsize(path)
            dense, reloaded, how = reload_gguf(qat, path)
            label = f"GGUF ({float_type.upper()} others)"
        else:
            directory = os.path.join(out, preset)
            label = fakequant.export_checkpoint(qat, directory)["format"]
            nbytes = size(directory)
            dense, reloaded, how = reload_compressed_tensors(directory)
            label = f"compressed-tensors {label}"
        equal, total = weights_equal(qat, dense)
        worst = largest_diff(qat, dense)
        with torch.no_grad():
            ours = qat(input_ids=task.eval_ids).logits
            theirs = reloaded(input_ids=task.eval_ids).logits
        diff = (theirs.float() - ours.float()).abs().max().item()
        if same_bits(theirs, ours):
            logits = "0 (bit for bit)"
        else:
            logits = f"{diff:.2g} ({diff / ours.abs().max().item():.2%}): {WHY.get(float_type or preset, '?')}"
        _, acc = evaluate(reloaded, task)
        rows.append(f"| {label} | {preset} | {nbytes:,} ({nbytes / bf16:.2f}x) | {how}: {equal}/{total} "
                    f"weights bit for bit | {worst:.3g} | {logits} | {acc:.2%} |")
        print(f"[{time.perf_counter() - start:.0f} s] {label}, {preset}: exported, reloaded, "
              f"{equal}/{total} weights bit for bit", flush=True)
        if equal != total or worst != 0:
            failed.append(f"{label} {preset}")

    target_rows, target_failed = targets_table(trained, model, task, qat_steps, out, start)
    failed += target_failed
    elapsed = time.perf_counter() - start
    text = "\n".join(lines + [f"QAT ({qat_steps} steps per preset, from the float model; held-out loss / "
                              "next-token accuracy):", ""] + qat_rows + ["", "Exported and reloaded:", ""] + rows
                     + ["", "Each compressed-tensors preset QAT'd for each target (quantize_model(target=...)); "
                            "the compressed load's logits (transformers + compressed-tensors) against fakequant's "
                            "eval-mode model, over the held-out batch:", ""] + target_rows
                     + ["", f"{elapsed:.0f} s in all (torch {torch.__version__}, transformers "
                            f"{transformers.__version__}, {torch.get_num_threads()} threads)."])
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(text + "\n")
    print("\n" + text)
    print(f"\nCheckpoints and results.md in {out}")
    if failed:
        sys.exit(f"weights not bit for bit: {', '.join(failed)}")


if __name__ == "__main__":
    main()
