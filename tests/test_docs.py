"""The API reference (docs/api.md) documents every public name of the public modules, so that
it cannot go stale: a new public function without its entry fails here, before the site
(`make docs`) is built. Parsing only; Sphinx is not needed."""
import ast
import importlib
import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
API = ROOT / "docs" / "api.md"

MODULES = [
    "fakequant", "fakequant.ops", "fakequant.tensor_quant", "fakequant.nn", "fakequant.calib",
    "fakequant.quant_modules", "fakequant.utils", "fakequant.models.presets", "fakequant.models.hf",
    "fakequant.models.experts", "fakequant.models.pretrained", "fakequant.models.distill", "fakequant.onnx",
    "fakequant.serve", "fakequant.serve.compressed_tensors", "fakequant.optim", "fakequant.ao", "fakequant.ao.pt2e",
    "fakequant.composite.rules",
]

# `.. autofunction:: name` in {eval-rst} blocks, ```{autofunction} name``` in MyST; options below
# a directive (`:members:`) are indented lines that start with a colon.
_DIRECTIVE = re.compile(
    r"^(?:\s*\.\. |```\{)(?:auto|py:)(\w+)(?::: |\}\s*)(\S+)((?:\n\s*:[\w-]+:.*)*)", re.M)


def public_names(module):
    """`__all__` if the module has one; otherwise the names its own source defines or (for the
    package) imports, without a leading underscore."""
    if hasattr(module, "__all__"):
        return list(module.__all__)
    names = []
    for node in ast.parse(inspect.getsource(module)).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            names += [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.append(node.target.id)
        elif isinstance(node, ast.ImportFrom) and module.__name__ == "fakequant":
            names += [alias.asname or alias.name for alias in node.names]
    return [n for n in dict.fromkeys(names) if not n.startswith("_")]


def lookup(dotted):
    """What a dotted name names: an attribute before a submodule of the same name, as Python
    resolves `fakequant.calib.reduce_amax` (the function, not the module defining it)."""
    parts = dotted.split(".")
    obj = importlib.import_module(parts[0])
    for i, attr in enumerate(parts[1:], 1):
        obj = getattr(obj, attr) if hasattr(obj, attr) else importlib.import_module(".".join(parts[:i + 1]))
    return obj


def directives():
    """(kind, name, options) of every autodoc / py: directive of api.md."""
    return [(m.group(1), m.group(2), m.group(3)) for m in _DIRECTIVE.finditer(API.read_text())]


def documented():
    """The names api.md documents, and the modules whose members an automodule covers."""
    names, covered = set(), {}
    for kind, name, options in directives():
        names.add(name)
        member_option = re.search(r":members:(.*)", options)
        if kind == "module" and member_option:
            listed = member_option.group(1).strip()
            covered[name] = {n.strip() for n in listed.split(",")} if listed else None  # None: all
    return names, covered


def _is_object(obj):
    return inspect.isfunction(obj) or inspect.isclass(obj) or inspect.ismodule(obj) or inspect.isbuiltin(obj)


@pytest.fixture(scope="module")
def reference():
    names, covered = documented()
    by_object = {}
    for name in names:
        obj = lookup(name)
        if _is_object(obj):
            by_object.setdefault(id(obj), name)
    return names, covered, by_object


def test_the_directives_parse():
    kinds = {kind for kind, _, _ in directives()}
    assert {"module", "function", "class", "data"} <= kinds, kinds
    assert len(directives()) > 150


@pytest.mark.parametrize("name", [n for _, n, _ in directives()] if API.exists() else [])
def test_every_directive_names_an_object(name):
    lookup(name)  # raises if api.md documents a name that no longer exists


@pytest.mark.parametrize("module_name", MODULES)
def test_every_public_name_is_documented(module_name, reference):
    names, covered, by_object = reference
    module = importlib.import_module(module_name)
    public = public_names(module)
    assert public, f"{module_name}: no public names found"
    missing = []
    for name in public:
        full = f"{module_name}.{name}"
        obj = getattr(module, name)
        if full in names:
            continue
        if module_name in covered and (covered[module_name] is None or name in covered[module_name]):
            continue
        # a re-export (fakequant.calibrate is fakequant.utils.calibrate): the same object
        # documented under another public name
        if _is_object(obj) and id(obj) in by_object:
            continue
        missing.append(full)
    assert not missing, f"docs/api.md does not document: {', '.join(missing)}"


def test_a_missing_name_is_caught(reference, monkeypatch):
    # the check above can fail: a public function that api.md does not name
    names, covered, by_object = reference
    import fakequant.utils

    def brand_new_helper():
        """Not in the API reference."""

    monkeypatch.setattr(fakequant.utils, "__all__", [*fakequant.utils.__all__, "brand_new_helper"])
    monkeypatch.setattr(fakequant.utils, "brand_new_helper", brand_new_helper, raising=False)
    with pytest.raises(AssertionError, match="fakequant.utils.brand_new_helper"):
        test_every_public_name_is_documented("fakequant.utils", reference)
