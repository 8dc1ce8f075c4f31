"""The planted mistakes of tools/emulate.py (`make cuda-emulate-planted`, CI's last CUDA step)
each name text that occurs exactly once in its file of csrc/cuda: a kernel change that rewrites
that text fails here, in seconds, instead of an hour into CI."""
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _planted():
    spec = importlib.util.spec_from_file_location("emulate", ROOT / "tools" / "emulate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.PLANTED


@pytest.mark.parametrize("mistake", _planted(), ids=lambda m: m[0])
def test_each_planted_mistake_replaces_text_that_occurs_once(mistake):
    name, filename, text, replacement = mistake[:4]
    source = (ROOT / "csrc" / "cuda" / filename).read_text()
    assert source.count(text) == 1, f"{name}: {text!r} occurs {source.count(text)} times in csrc/cuda/{filename}"
    assert replacement != text
