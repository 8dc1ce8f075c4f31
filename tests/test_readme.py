"""The Python examples of the README and of every docs/ page run as written, in
order, one namespace per page; the README stays a landing page that links every
docs/ page, and every relative link of them resolves."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
# Pages of the documentation site (make docs) that the README does not link: the site's home
# page (the README's own sections, included), the API reference generated from the docstrings,
# and the page that includes CHANGELOG.md.
SITE_ONLY = {"index.md", "api.md", "changelog.md"}


def python_blocks(page):
    return re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)


def run_blocks(page, blocks):
    namespace = {"__name__": page.stem}
    for i, block in enumerate(blocks):
        exec(compile(block, f"{page.relative_to(ROOT)}[python block {i}]", "exec"), namespace)


def test_readme_examples_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # examples may write files
    blocks = python_blocks(README)
    assert blocks, "the README has no Python example"
    run_blocks(README, blocks)


@pytest.mark.parametrize("page", [p for p in DOCS if python_blocks(p)], ids=lambda p: p.name)
def test_docs_examples_run(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run_blocks(page, python_blocks(page))


def test_the_pages_with_examples_are_run():
    # what the parametrized test above covers, so that moving an example cannot drop it silently
    assert {p.name for p in DOCS if python_blocks(p)} >= {"operators.md", "export.md", "compile-distributed.md"}


def test_readme_is_a_landing_page():
    text = README.read_text()
    assert len(text.splitlines()) < 300
    assert "make demo" in text and "make test" in text
    linked = set(re.findall(r"\]\((docs/[^)#]+\.md)", text))
    assert linked == {f"docs/{p.name}" for p in DOCS if p.name not in SITE_ONLY}, \
        "every docs/ page is linked from the README"


@pytest.mark.parametrize("page", [README, *DOCS], ids=lambda p: p.name)
def test_relative_links_resolve(page):
    for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
        if re.match(r"[a-z]+://", target) or target.startswith("#"):
            continue
        path = target.split("#")[0]
        assert (page.parent / path).exists(), f"{page.name}: broken link {target}"
