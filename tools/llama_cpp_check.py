"""llama.cpp against fakequant, through llama-cpp-python: `make llama-check` (not part of `make
test`: it builds llama-cpp-python from its sdist, about 20 minutes on 2 cores).

    python tools/llama_cpp_check.py LLAMA_PYTHON [--out DIR] [--steps N]

LLAMA_PYTHON is the Python of a virtualenv with llama-cpp-python (the Makefile's .venv-llama,
from constraints/llama.txt); this script runs in fakequant's own and calls that one with
tools/llama_cpp_run.py. It

1. makes a SentencePiece-style Llama tokenizer (tests/sentencepiece_style.py) and trains a small
   Llama (hidden 128, 2 layers, 4 heads, 2 key/value heads) on its corpus: float first, then
   QAT copies with GGUF_Q8_0 and GGUF_Q4_0;
2. exports each with ``fakequant.export_checkpoint(..., format="gguf", tokenizer=...)``, with
   the default float_type ("auto": the embeddings and lm_head as trained) and with "f16";
3. has llama.cpp tokenize STRINGS (spaces, digits, punctuation, non-ASCII text) and compares with
   the Hugging Face tokenizer, id for id (BOS included);
4. has llama.cpp compute every position's logits of a held-out line (one thread, float32 KV
   cache, no flash attention) and compares with the fakequant model in eval mode.

Prints the table (also DIR/results.md); exits 1 if a tokenization differs (but for KNOWN), or
if a default export's next-token argmax differs from the model's at any position.
"""
import argparse
import copy
import json
import pathlib
import subprocess
import sys
import tempfile

import numpy as np
import torch
import transformers

import fakequant

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
from sentencepiece_style import corpus, sentencepiece_style_tokenizer  # noqa: E402

STRINGS = [
    "names", "The names", "renamed namespace", "Hello world", "two  spaces and   three", " leading space",
    "trailing space ", "digits 0123456789 and 3.14, 2024", "punctuation: (a), [b]; {c}! \"d\"? 'e'... -f-",
    "naïve café, Zoë, straße, über", "日本語のテキスト", "emoji 🙂 and ♥", "tab\tand\nnewline",
    corpus(seed=1)[0],
]
# Where llama.cpp's "llama" tokenizer cannot do as the Hugging Face one does, whatever the file says:
# transformers' Llama tokenizer (tokenizers' Metaspace, prepend_scheme="first") puts "▁" before the
# text unless the text starts with a space; llama.cpp puts it before every text (as SentencePiece's
# add_dummy_prefix does), and tokenizer.ggml.add_space_prefix=false would drop it everywhere.
KNOWN = {" leading space": "a leading space: llama.cpp adds \"▁\" before it, transformers does not"}
SEQ, BATCH = 32, 8


def train(model, data, steps, lr):
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(1)
    model.train()
    for _ in range(steps):
        batch = data[torch.randint(0, len(data), (BATCH,), generator=g)]
        loss = model(batch, labels=batch).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("llama_python")
    parser.add_argument("--out", default="build/llama-check")
    parser.add_argument("--steps", type=int, default=150, help="float training steps (QAT: a third of them)")
    args = parser.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    tok = sentencepiece_style_tokenizer()
    ids = [i for line in corpus() for i in tok(line)["input_ids"]]
    data = torch.tensor(ids[: len(ids) // SEQ * SEQ]).reshape(-1, SEQ)
    held_out = torch.tensor(tok(" ".join(corpus(seed=2)[:3]))["input_ids"][:SEQ]).unsqueeze(0)
    config = transformers.LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=len(tok),
                                      max_position_embeddings=256, rms_norm_eps=1e-5,
                                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    float_model = train(transformers.LlamaForCausalLM(config), data, args.steps, 3e-3)
    models = {"float": float_model}
    for preset in ("GGUF_Q8_0", "GGUF_Q4_0"):
        qat = fakequant.quantize_model(copy.deepcopy(float_model), preset=preset)
        models[preset] = train(qat, data, args.steps // 3, 1e-3)

    files = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, model in models.items():
            for float_type in ("auto", "f16"):
                kwargs = {} if float_type == "auto" else {"float_type": float_type}
                files[label, float_type] = fakequant.export_checkpoint(
                    model, pathlib.Path(tmp) / f"{label}-{float_type}.gguf", format="gguf", tokenizer=tok, **kwargs)
        job = {"files": [str(p) for p in files.values()], "ids": held_out[0].tolist(), "strings": STRINGS, "out": tmp}
        (pathlib.Path(tmp) / "job.json").write_text(json.dumps(job))
        subprocess.run([args.llama_python, str(HERE / "llama_cpp_run.py"), str(pathlib.Path(tmp) / "job.json")],
                       check=True)
        results = {key: dict(np.load(path.with_suffix(".npz"))) for key, path in files.items()}
        sizes = {key: path.stat().st_size for key, path in files.items()}

    failed = False
    lines = ["Tokenization (llama.cpp's llama_tokenize vs the Hugging Face tokenizer, BOS included):", "",
             "| string | Hugging Face | llama.cpp |", "|---|---|---|"]
    first = results["float", "auto"]
    for i, text in enumerate(STRINGS):
        hf = tok(text)["input_ids"]
        same = all(r[f"tokens_{i}"].tolist() == hf for r in results.values())
        failed |= not same and text not in KNOWN
        got = "the same" if same else f"{first[f'tokens_{i}'].tolist()}" + (f" ({KNOWN[text]})" if text in KNOWN else "")
        lines.append(f"| {json.dumps(text, ensure_ascii=False)} | {hf} | {got} |")
    lines += ["", f"Logits of {held_out.shape[1]} positions (llama.cpp vs the fakequant model in eval mode):", "",
              "| model | float_type (embeddings, lm_head) | file size | max abs(llama.cpp - fakequant) | "
              "positions within 1e-4 | largest abs logit | same argmax |", "|---|---|---|---|---|---|---|"]
    for (label, float_type), result in results.items():
        with torch.no_grad():
            expected = models[label](held_out).logits[0].numpy()
        got = result["logits"]
        same = int((got.argmax(-1) == expected.argmax(-1)).sum())
        failed |= float_type == "auto" and same != len(got)
        diff = np.abs(got - expected)
        lines.append(f"| {label} | {float_type} | {sizes[label, float_type]:,} B | {diff.max():.2g} | "
                     f"{int((diff.max(-1) < 1e-4).sum())}/{len(got)} | {np.abs(expected).max():.3g} | {same}/{len(got)} |")
    text = "\n".join(lines) + "\n"
    print(text)
    (out / "results.md").write_text(text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
