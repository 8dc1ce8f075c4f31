"""Every file the code and the docs mention exists: a path-like mention (``csrc/ops/common.cpp``,
``docs/design.md``, ``nn/_paths.py``, a Markdown link) in a tracked source or documentation
file resolves against the repository, the mentioning file's folder, the package or the C++
include folder. System headers (``#include <...>``) and the placeholders below are not files
of ours."""
import pathlib
import re
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SUFFIXES = (".py", ".h", ".cuh", ".cu", ".cpp", ".md", ".toml", ".cfg", ".sh", ".in")
# A token with a folder and a file suffix, or the bare name of a design document.
MENTION = re.compile(r"(?<![\w/.$<-])((?:\.\.?/)?(?:[\w.-]+/)+[\w.-]+\.(?:py|pyi|h|cuh|cu|cpp|md|toml|cfg|txt|json|sh|yml))"
                     r"(?![\w/])|(?<![\w/.])(DESIGN\.md)")
SEARCH = (ROOT, ROOT / "fakequant", ROOT / "csrc" / "include")
# Mentions that name no file of the repository on purpose, with why.
NOT_FILES = {
    "../examples/x.py": "docs/conf.py: an example of what a link outside docs/ becomes",
}
PLACEHOLDER = re.compile(r"^(DIR|ROOT|OUT|build|dist|\.venv[\w-]*)/")
# Records of runs, kept as they were printed: their paths are the running machine's files
# (site-packages, torch's own sources in its log lines), not the repository's.
RECORDS = ("benchmarks/results/",)


def _tracked():
    try:
        out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [ROOT / f for f in out.split()
            if (f.endswith(SUFFIXES) or f.endswith("Makefile")) and not f.startswith(RECORDS)]


def _mentions(path):
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if re.match(r"\s*#\s*include\s*<", line):
            continue
        for match in MENTION.finditer(line):
            token = match.group(1) or match.group(2)
            start = match.start()
            if "://" in line[max(0, start - 80):start]:  # part of a URL
                continue
            yield number, token


def _resolves(path, token):
    if token in NOT_FILES or PLACEHOLDER.match(token):
        return True
    bases = (path.parent,) + SEARCH
    return any((base / token).exists() for base in bases)


def test_every_mentioned_file_exists():
    missing = [f"{path.relative_to(ROOT)}:{number}: {token}"
               for path in _tracked() if path.exists()
               for number, token in _mentions(path) if not _resolves(path, token)]
    assert not missing, "mentions of files that do not exist:\n" + "\n".join(missing)


def test_the_checker_finds_a_missing_file(tmp_path):
    # (the test above can fail: a mention of a file that is not there is reported)
    # (the names are put together here, so that this file mentions no missing file itself)
    missing_cpp, design = "csrc/ops/" + "no_such_file.cpp", "DESIGN" + ".md"
    doc = tmp_path / "doc.md"
    doc.write_text(f"See {missing_cpp} and {design}, not <ATen/ATen.h>.\n")
    tokens = [t for _, t in _mentions(doc)]
    assert tokens == [missing_cpp, design]
    assert not any(_resolves(doc, t) for t in tokens)
    assert _resolves(doc, "csrc/ops/common.cpp") and _resolves(doc, "nn/_paths.py")
