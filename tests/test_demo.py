"""The main job (`make demo`) runs end to end; here with fewer epochs."""
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("sklearn")
pytest.importorskip("matplotlib")
pytest.importorskip("onnxruntime")

DEMO = Path(__file__).resolve().parent.parent / "examples" / "digits_qat.py"


def test_demo_quick(tmp_path):
    out = subprocess.run([sys.executable, str(DEMO), "--quick", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout
    assert "| weights | calibration | float32 | PTQ | QAT | ONNX Runtime |" in text
    assert text.count("| 8-bit |") == 4 and text.count("| 4-bit weights |") == 4
    assert "ONNX Runtime agrees with PyTorch on" in text
    assert (tmp_path / "calibration_histogram.png").stat().st_size > 10_000
    assert len(list(tmp_path.glob("digits_*.onnx"))) == 8
