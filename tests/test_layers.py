"""The Python package is built in layers: a module imports only from the layers below
it, and no two parts of fakequant/ depend on each other.

The import graph is read from the source with ``ast`` (every ``import`` and ``from ...
import``, relative ones resolved, function-local ones included), so an import hidden in
a function body counts as much as one at the top of a file. Also here, as facts about the
package's structure: the package imports the new paths of moved modules, not their old ones
(fakequant/_moved.py); a block-scale format's tuple is written in one place; docs/layout.md
names every root module and subpackage.
"""
import ast
import pathlib
import re

import pytest

import fakequant
from fakequant import _moved

ROOT = pathlib.Path(fakequant.__file__).parent

# Lowest first. A part is a top-level module or package of fakequant/ (fakequant.nn.quant_conv
# belongs to "nn"); it may import parts of lower layers, and parts of its own layer as long as
# no two of them import each other.
LAYERS = [
    ("the version, the compiled libraries and their loader; the table of moved import paths",
     {"_version", "_build", "_C", "_extension", "_moved"}),
    ("constants, block-scale formats, validation, per-thread export state", {"_core"}),
    ("the operators' rules as plain-PyTorch composites, and the compiled path that runs them", {"composite"}),
    ("operators: the only user of torch.ops.fakequant", {"ops"}),
    ("descriptors and functions", {"tensor_quant"}),
    ("calibration statistics", {"calib"}),
    ("quantizers and quantized modules; torch.ao / torchao drop-in modules", {"nn", "ao"}),
    ("model level: fakequant's own (models) and pytorch-quantization's paths", {"models", "quant_modules", "utils", "optim"}),
    ("export: ONNX graphs, serving checkpoints", {"onnx", "serve"}),
    ("the package, its command line and the checks it runs", {"fakequant", "__main__", "_diagnostics"}),
]
LAYER_OF = {part: i for i, (_, parts) in enumerate(LAYERS) for part in parts}


def _module_name(path: pathlib.Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = ["fakequant", *rel.parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_module(name: str) -> bool:
    rel = pathlib.Path(*name.split(".")[1:])
    return (ROOT / rel).is_dir() or (ROOT / rel).with_suffix(".py").is_file() or any(
        ROOT.glob(f"{rel}.*.so")) or any(ROOT.glob(f"{rel}.*.pyd"))


def _part(name: str) -> str:
    """The part of fakequant a module belongs to ("fakequant" for the package itself)."""
    pieces = name.split(".")
    return pieces[1] if len(pieces) > 1 else "fakequant"


# An old import path (fakequant/_moved.py) is a module that is its new one: it sits in the
# layer of the part it moved to (fakequant/presets.py in models').
LAYER_OF.update({_part(old): LAYER_OF[_part(new)] for old, new in _moved.MOVED.items() if _part(old) not in LAYER_OF})


def _imports(path: pathlib.Path):
    """The fakequant modules ``path`` imports (anywhere in it), resolved to full names."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "fakequant":
                    yield alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source.split(".")[0] != "fakequant":
                continue
            for alias in node.names:
                candidate = f"{source}.{alias.name}"
                # `from pkg import name` imports the module pkg.name if there is one, else pkg
                yield candidate if _is_module(candidate) else source


def import_graph():
    """{part: {part it imports: [(file, module imported)]}} over fakequant/."""
    graph = {}
    for path in sorted(ROOT.rglob("*.py")):
        src = _part(_module_name(path))
        for target in _imports(path):
            dst = _part(target)
            if dst != src:
                graph.setdefault(src, {}).setdefault(dst, []).append((str(path.relative_to(ROOT)), target))
    return graph


def test_every_part_has_a_layer():
    parts = {_part(_module_name(p)) for p in ROOT.rglob("*.py")}
    missing = sorted(parts - set(LAYER_OF))
    assert not missing, f"put these parts of fakequant/ in a layer of LAYERS: {missing}"


def test_no_part_imports_a_higher_layer():
    bad = [f"{src} (layer {LAYER_OF[src]}) imports {dst} (layer {LAYER_OF[dst]}) in {where}"
           for src, targets in import_graph().items() for dst, where in targets.items()
           if LAYER_OF.get(dst, -1) > LAYER_OF.get(src, len(LAYERS))]
    assert not bad, "\n".join(bad)


def module_graph():
    """{module: {module of the same part it imports}} over fakequant/ (a package's __init__ is
    the package's name)."""
    graph = {}
    for path in sorted(ROOT.rglob("*.py")):
        src = _module_name(path)
        for target in _imports(path):
            if target != src and _part(target) == _part(src):
                graph.setdefault(src, {})[target] = True
    return graph


def _cycles(graph):
    """Every cycle a depth-first search finds (a back edge), through any number of nodes."""
    state, stack, cycles = {}, [], []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for dst in graph.get(node, {}):
            if state.get(dst) == "open":
                cycles.append(stack[stack.index(dst):] + [dst])
            elif dst not in state:
                visit(dst)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return cycles


def test_no_two_way_dependency():
    cycles = _cycles(import_graph())
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_no_import_cycle_inside_a_part():
    # e.g. fakequant/serve/: the formats import what they share, never the other way round
    cycles = _cycles(module_graph())
    assert not cycles, "import cycles between modules: " + "; ".join(" -> ".join(c) for c in cycles)


@pytest.mark.parametrize("source,expected", [
    ("from .. import ops\nfrom ..calib import MaxCalibrator\n", {"fakequant.ops", "fakequant.calib"}),
    ("def f():\n    from ..nn.quant_conv import X\n", {"fakequant.nn.quant_conv"}),
    ("import fakequant.onnx as o\n", {"fakequant.onnx"}),
    ("from . import max\n", {"fakequant.calib.max"}),
])
def test_the_parser_sees_relative_and_function_local_imports(tmp_path, monkeypatch, source, expected):
    path = ROOT / "calib" / "histogram.py"  # parsed as if it were this file's source
    monkeypatch.setattr(pathlib.Path, "read_text", lambda self, *a, **k: source)
    assert set(_imports(path)) == expected


def test_the_checks_catch_a_two_way_and_an_upward_dependency(monkeypatch):
    # calib/histogram.py once imported nn.quant_conv (for an isinstance check); serve/_experts.py
    # once imported private names of serve/compressed_tensors.py, which imported it back
    real = _imports
    test_no_import_cycle_inside_a_part()

    def with_upward_import_and_cycle(path):
        yield from real(path)
        if path == ROOT / "calib" / "histogram.py":
            yield "fakequant.nn.quant_conv"
        if path == ROOT / "serve" / "_experts.py":
            yield "fakequant.serve.compressed_tensors"

    monkeypatch.setitem(globals(), "_imports", with_upward_import_and_cycle)
    with pytest.raises(AssertionError, match="calib .* imports nn"):
        test_no_part_imports_a_higher_layer()
    with pytest.raises(AssertionError, match="import cycles"):
        test_no_two_way_dependency()
    with pytest.raises(AssertionError, match=r"import cycles between modules: .*fakequant\.serve\._experts -> "
                                             r"fakequant\.serve\.compressed_tensors"):
        test_no_import_cycle_inside_a_part()


# --- the old import paths (fakequant/_moved.py) -------------------------------------------------

def _old_path_file(old):
    return ROOT.joinpath(*old.split(".")[1:]).with_suffix(".py")


def old_path_imports():
    """(file, old path) of every import of an old path by a module of the package, other than the
    old paths' own modules."""
    old_files = {_old_path_file(old) for old in _moved.MOVED}
    return [(str(path.relative_to(ROOT)), target) for path in sorted(ROOT.rglob("*.py"))
            if path not in old_files for target in _imports(path) if target in _moved.MOVED]


def test_every_old_path_has_its_module():
    missing = [old for old in _moved.MOVED if not _old_path_file(old).is_file()]
    assert not missing, missing


def test_the_package_imports_the_new_paths():
    bad = [f"{where} imports {old}: import {_moved.MOVED[old]}" for where, old in old_path_imports()]
    assert not bad, "\n".join(bad)


def test_the_old_path_check_sees_an_old_import(monkeypatch):
    monkeypatch.setattr(pathlib.Path, "read_text", lambda self, *a, **k: "import fakequant.reference\n")
    found = old_path_imports()
    assert ("nn/quant_conv.py", "fakequant.reference") in found
    assert ("serve/gguf.py", "fakequant.reference") in found
    assert not any(where == "reference.py" for where, _ in found)  # the old path's own module


# --- each block-scale format named once (docs/design.md, "Formats") ---------------------------

# The one place that reads the descriptor's spelling of a format, block_sizes["scale_bits"].
FORMATS_MODULE = ROOT / "_core" / "formats.py"
# (E, M) tuples that only ever spell a block-scale format (E8M0, llama.cpp's float16 scales);
# (4, 3) also names E4M3 elements, so it counts only beside a mention of scale_bits.
SCALE_ONLY = {(8, 0), (5, 10)}


def _int_pair(node):
    if isinstance(node, ast.Tuple) and len(node.elts) == 2 and all(
            isinstance(e, ast.Constant) and type(e.value) is int for e in node.elts):
        return tuple(e.value for e in node.elts)
    return None


def _mentions_scale_bits(node):
    return any((isinstance(n, ast.Attribute) and n.attr == "scale_bits")
               or (isinstance(n, ast.Name) and n.id == "scale_bits")
               or (isinstance(n, ast.Constant) and n.value == "scale_bits") for n in ast.walk(node))


def scale_bits_literals(source, filename="<source>"):
    """(line, what) of each scale_bits tuple literal in ``source``: a tuple that only spells a
    block-scale format, and any (int, int) tuple compared with, assigned to or passed as
    something named scale_bits."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        pair = _int_pair(node)
        if pair in SCALE_ONLY:
            found.append((node.lineno, f"the tuple {pair}"))
        elif isinstance(node, ast.Compare) and _mentions_scale_bits(node):
            pairs = [p for n in ast.walk(node) if (p := _int_pair(n)) is not None]
            if pairs:
                found.append((node.lineno, f"scale_bits compared with {pairs[0]}"))
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if isinstance(key, ast.Constant) and key.value == "scale_bits" and _int_pair(value) is not None:
                    found.append((node.lineno, f"'scale_bits': {_int_pair(value)}"))
        elif isinstance(node, ast.keyword) and node.arg == "scale_bits" and _int_pair(node.value) is not None:
            found.append((node.value.lineno, f"scale_bits={_int_pair(node.value)}"))
    return sorted(set(found))


def test_scale_bits_literals_only_in_the_formats_module():
    bad = [f"{path.relative_to(ROOT)}:{line}: {what}" for path in sorted(ROOT.rglob("*.py")) if path != FORMATS_MODULE
           for line, what in scale_bits_literals(path.read_text(), str(path))]
    assert not bad, ("read the format by name (fakequant._core.BlockScales: spec.scale_format, "
                     "q.scale_format, BlockScales.X.scale_bits), not its tuple:\n" + "\n".join(bad))
    assert scale_bits_literals(FORMATS_MODULE.read_text()), "the mapping moved: update FORMATS_MODULE"


@pytest.mark.parametrize("source,found", [
    ("if q.scale_bits == (4, 3):\n    pass\n", True),
    ("x = spec.scale_bits not in ((4, 3), (8, 0))\n", True),
    ("d = {-1: 32, 'type': 'dynamic', 'scale_bits': (4, 3)}\n", True),
    ("e8m0 = block_sizes.get('scale_bits') == (8, 0)\n", True),
    ("QuantSpec(scale_bits=(4, 3))\n", True),
    ("fmt = (5, 10)\n", True),
    ("e4m3 = (4, 3)\nif fmt == e4m3 and q.scale_format is None:\n    pass\n", False),
    ("if q.scale_format is BlockScales.E8M0:\n    pass\n", False),
])
def test_the_scale_bits_check_sees_the_spellings(source, found):
    assert bool(scale_bits_literals(source)) == found


# --- docs/layout.md names every root module and subpackage -----------------------------------

LAYOUT = ROOT.parent / "docs" / "layout.md"


def root_names():
    """The root modules of fakequant/ (sources, and the compiled ones by their stubs) and its
    subpackages."""
    return ({p.stem for p in ROOT.glob("*.py")} | {p.stem for p in ROOT.glob("*.pyi")}
            | {d.name for d in ROOT.iterdir() if (d / "__init__.py").is_file()})


def layout_names(text):
    """The root modules and subpackages a text names as fakequant/NAME (fakequant/_core/,
    fakequant/_version.py, fakequant/_C)."""
    return set(re.findall(r"(?<![\w./])fakequant/(\w+)", text))


@pytest.mark.skipif(not LAYOUT.is_file(), reason="docs/ is not installed with the package")
def test_layout_names_every_root_module_and_subpackage():
    named, actual = layout_names(LAYOUT.read_text()), root_names()
    assert not actual - named, f"docs/layout.md does not say where these are: {sorted(actual - named)}"
    assert not named - actual, f"docs/layout.md names what fakequant/ does not hold: {sorted(named - actual)}"


def test_the_layout_check_reads_paths():
    assert layout_names("fakequant/_core/ x\nfakequant/_C, fakequant/_build\nsee fakequant/nn/_paths.py, "
                        "tests/fakequant/x, fakequant._C") == {"_core", "_C", "_build", "nn"}
    assert {"__init__", "__main__", "_C", "_build", "_core", "models", "quant_modules"} <= root_names()
