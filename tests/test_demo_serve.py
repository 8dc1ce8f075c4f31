"""The third main job (`make demo-serve`) runs end to end; here with a few training steps.
Skipped without the `serve` extra."""
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="the serving demo needs transformers: pip install 'fakequant[serve]'")
pytest.importorskip("compressed_tensors",
                    reason="the serving demo needs compressed-tensors: pip install 'fakequant[serve]'")
pytest.importorskip("gguf", reason="the serving demo needs gguf: pip install 'fakequant[serve]'")

DEMO = Path(__file__).resolve().parent.parent / "examples" / "serve_demo.py"


def test_demo_serve_quick(tmp_path):
    out = subprocess.run([sys.executable, str(DEMO), "--quick", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    table = (tmp_path / "results.md").read_text()
    assert table.strip() in out.stdout  # printed, and written to results.md
    rows = [line for line in table.splitlines() if line.startswith(("| compressed-tensors ", "| GGUF ("))]
    assert len(rows) == 7
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[3].endswith(": 14/14 weights bit for bit") and cells[4] == "0", row
    exact = {(c[0], c[1]) for c in ([c.strip() for c in r.strip("|").split("|")] for r in rows)
             if c[5] == "0 (bit for bit)"}
    # the same rules: bit for bit; W8A8 (per-token scale) and F16 embeddings: not, with the reason
    assert exact == {("compressed-tensors int-quantized", "INT8"), ("compressed-tensors pack-quantized", "W4A16"),
                     ("GGUF (F32 others)", "GGUF_Q8_0"), ("GGUF (F32 others)", "GGUF_Q4_0")}
    assert (tmp_path / "INT8" / "config.json").exists() and (tmp_path / "GGUF_Q4_0-f16" / "model.gguf").exists()

    # every compressed-tensors preset for each target: weights bit for bit; the logits bit for bit
    # where compressed-tensors computes the target's rules, else a stated reason
    targets = [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()
               if line.startswith("| ") and line.split("|")[2].strip() in ("onnx", "vllm")]
    assert len(targets) == 18
    assert all(c[3] == "14/14 bit for bit" for c in targets), targets
    exact = {(c[0], c[1]) for c in targets if c[4] == "0 (bit for bit)"}
    same_rules = {(p, t) for p in ("INT8", "W4A16", "FP8_PER_CHANNEL") for t in ("onnx", "vllm")} | {
        ("FP8", "onnx"), ("MXFP8", "vllm"), ("MXFP4", "vllm")}
    # FP8 with target vllm: vLLM's reciprocal against compressed-tensors' division, bit for bit unless a tie
    assert same_rules <= exact <= same_rules | {("FP8", "vllm")}
    assert all(c[7] and c[7] != "?" for c in targets if (c[0], c[1]) not in exact), targets
