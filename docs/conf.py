"""Sphinx configuration of the documentation site: `make docs` (Sphinx + MyST, furo theme).

The pages are the Markdown files of docs/; the home page (index.md) takes the landing sections
of the repository's README.md. Build: make docs, or from the repository root
    python -m sphinx -W --keep-going -n -b html -d build/docs/doctrees docs build/docs/html

Links. Markdown links between pages (``[text](export.md#some-heading)``) are MyST cross-references:
a missing page or heading anchor is a warning, and -W makes it fail the build. Links to files
outside docs/ (``../examples/x.py``, ``../csrc/README.md``) become downloads of the file, and a
missing file is a warning too; two of them are pages of the site under another name and are
rewritten to it before parsing: ../README.md is the home page (index.md), and
../benchmarks/results/README.md is included into performance.md (see _SITE_PAGES).
"""
import importlib
import inspect
import os
import posixpath
import re
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))  # the checkout's fakequant, with its compiled libraries in place

import logging  # noqa: E402

# torchao (imported by fakequant.ao.pt2e) and torch log about optional kernels of theirs that
# this CPU build lacks; not the documentation's business.
for _name in ("torchao", "torch.utils._pytree"):
    logging.getLogger(_name).setLevel(logging.ERROR)

import fakequant  # noqa: E402

project = "fakequant"
author = "the fakequant authors"
copyright = "the fakequant authors"
release = fakequant.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
]

source_suffix = {".md": "markdown"}
root_doc = "index"
# Not pages: anything but docs/*.md (a README.md in docs/ would describe the folder, not the library).
exclude_patterns = ["README.md", "**/README.md", "_static", "_build", ".DS_Store"]
templates_path = []

# -- MyST -------------------------------------------------------------------------------------
# Slugs for headings down to ####, so that [x](page.md#some-heading) resolves (and is checked).
myst_heading_anchors = 4
myst_enable_extensions = ["deflist"]

# -- autodoc ----------------------------------------------------------------------------------
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False

# Nitpicky (-n): every cross-reference must resolve, so that a renamed function or class that a
# docstring names fails the build. The exception is torch's types in signatures and docstrings
# (torch.Tensor, torch.nn.Module, QConfig; "Module" in a docstring's argument types): there is
# no intersphinx here (the build is offline), so they are named, not linked. Without this list,
# -n gives 88 warnings, all of them torch types.
nitpick_ignore_regex = [
    ("py:class", r"torch(\..+)?"),
    ("py:class", r"Module"),
    # Other libraries' classes in the signatures' type hints (no intersphinx: the build is
    # offline); ProcessGroup is torch.distributed's, as its annotations spell it.
    ("py:class", r"(numpy|np|contextlib|os|collections\.abc|typing)\..+"),
    ("py:class", r"ProcessGroup"),
    # Private helpers of ours named in public signatures' hints (not documented on purpose).
    ("py:class", r"fakequant(\.\w+)*\._\w+"),
]

# -- HTML -------------------------------------------------------------------------------------
html_theme = "furo"
html_title = f"fakequant {release}"
html_static_path = ["_static"]
html_css_files = ["fakequant.css"]  # compact tables for the make bench report (performance.md)
html_show_sourcelink = False

# -- links to files outside docs/ that are pages of the site ---------------------------------
# The repository path (relative to the repository root) of a Markdown file that is not in docs/,
# and the page (with an anchor, or None to keep the link's own) that shows it in the site.
_SITE_PAGES = {
    "README.md": ("index.md", None),
    "benchmarks/results/README.md": ("performance.md", "the-make-bench-report"),
}
_LINK = re.compile(r"(!?)\[([^\]\n]*)\]\(([^)\s]+)\)")  # [text](target) and ![alt](image)


def _rewrite_links(text, file_dir, doc_dir):
    """Markdown links of a file in file_dir, as seen from a page in doc_dir (they differ for an
    included file): links into docs/ made relative to the page, links to _SITE_PAGES made links
    to the page that shows them, links to other files of the repository made downloads. A link
    whose text is its own path (``[docs/demo.md](docs/demo.md)``, the README's style) gets no
    text, so that the site shows the title of the page or section instead."""
    def sub(match):
        image, label, target = match.groups()
        if re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("#"):
            return match.group(0)
        path, sep, anchor = target.partition("#")
        resolved = posixpath.normpath(posixpath.join(file_dir, path))  # relative to the repository root
        page = None
        if resolved in _SITE_PAGES:
            page, page_anchor = _SITE_PAGES[resolved]
            anchor = anchor or page_anchor
            new = posixpath.relpath(posixpath.join("docs", page), doc_dir) + (f"#{anchor}" if anchor else "")
        elif resolved.startswith("docs/"):
            page = resolved
            new = posixpath.relpath(resolved, doc_dir) + sep + anchor
        else:
            # a file of the repository outside docs/: a download (MyST's path: links), which
            # Sphinx copies into the site; a missing file is a warning
            new = ("" if image else "path:") + posixpath.relpath(resolved, doc_dir)
        if page and not image and label.strip("`") in (path, target):
            label = ""
        return f"{image}[{label}]({new})"
    return _LINK.sub(sub, text)


def _source_read(app, docname, source):
    doc_dir = posixpath.dirname(posixpath.join("docs", docname))
    source[0] = _rewrite_links(source[0], doc_dir, doc_dir)


def _include_read(app, relative_path, parent_docname, content):
    file_dir = posixpath.dirname(Path(os.path.relpath(DOCS / relative_path, ROOT)).as_posix())
    doc_dir = posixpath.dirname(posixpath.join("docs", parent_docname))
    content[0] = _rewrite_links(content[0], file_dir, doc_dir)


# -- cross-references to a re-exported name -------------------------------------------------
# Each object is documented once, in api.md, under one public name (fakequant.ops.fake_quantize_amax);
# docstrings also name it as fakequant.fake_quantize_amax, or by the module that defines it. A
# reference that Sphinx cannot resolve by name is resolved here when it names the same Python
# object as a documented name; anything else stays unresolved (a warning under -n).
def _lookup(dotted):
    """The object a dotted name names, as an attribute before a submodule of the same name
    (fakequant.calib.reduce_amax is the function, not the module that defines it); None if none."""
    parts = dotted.split(".")
    try:
        obj = importlib.import_module(parts[0])
    except (ImportError, ValueError):
        return None
    for i, attr in enumerate(parts[1:], 1):
        if hasattr(obj, attr):
            obj = getattr(obj, attr)
            continue
        try:
            obj = importlib.import_module(".".join(parts[: i + 1]))
        except (ImportError, ValueError):
            return None
    return obj


def _documented_by_object(app):
    cache = getattr(app, "_fakequant_documented", None)  # one build: the app, not the pickled env
    if cache is None:
        cache = {}
        for name, entry in app.env.get_domain("py").objects.items():
            if entry.aliased or not name.startswith("fakequant"):
                continue
            obj = _lookup(name)
            if obj is not None and (callable(obj) or inspect.ismodule(obj)):
                # an alias (quant_nn.Conv2d, "alias of QuantConv2d") only where the object's
                # own name is not documented
                if id(obj) not in cache or name.rsplit(".", 1)[-1] == getattr(obj, "__name__", None):
                    cache[id(obj)] = name
        app._fakequant_documented = cache
    return cache


def _missing_reference(app, env, node, contnode):
    if node.get("refdomain") != "py":
        return None
    target = node["reftarget"].lstrip(".~")
    module, cls = node.get("py:module"), node.get("py:class")
    candidates = ([f"{module}.{cls}.{target}"] if module and cls else []) + (
        [f"{module}.{target}"] if module else []) + [target]
    documented = _documented_by_object(app)
    name = None
    for candidate in candidates:
        obj = _lookup(candidate) if candidate.startswith("fakequant") else None
        if obj is not None and (callable(obj) or inspect.ismodule(obj)):
            name = documented.get(id(obj))
            if name:
                break
    if name is None and "." not in target:
        # a bare name in a docstring (a Raises: section names the class it raises): the one
        # documented object of that name, if there is exactly one
        matches = {n for n in documented.values() if n.rsplit(".", 1)[-1] == target}
        name = matches.pop() if len(matches) == 1 else None
    if name is None:
        return None
    return env.get_domain("py").resolve_xref(env, node["refdoc"], app.builder, "obj", name, node, contnode)


# A module-level instance (QUANT_DESC_8BIT_PER_TENSOR, PRESETS) has no docstring of its own:
# autodata would show its class's (the dict's, the descriptor's), so it shows none; api.md says
# what it is where needed.
def _process_docstring(app, what, name, obj, options, lines):
    if what in ("data", "attribute") and not inspect.isclass(obj) and not callable(obj) \
            and getattr(obj, "__doc__", None) is not None and obj.__doc__ == type(obj).__doc__:
        lines[:] = []


def setup(app):
    app.connect("source-read", _source_read)
    app.connect("include-read", _include_read)
    app.connect("missing-reference", _missing_reference)
    app.connect("autodoc-process-docstring", _process_docstring)
