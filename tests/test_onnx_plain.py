"""A plain ``torch.onnx.export(model, args, f)`` works on fakequant models, as scripts
written for torch call it: torch's default (dynamo) exporter and the TorchScript one.

The exports run in a fresh process (tests/onnx_plain_worker.py) that imports fakequant and
calls no ``fakequant.onnx`` function. Each graph then passes ``onnx.checker`` (full check),
runs in ONNX Runtime (default session options and ORT_DISABLE_ALL) bit for bit against
PyTorch per quantizer (whole models: against the graph of ``fakequant.onnx.export``), and
is node for node the graph ``fakequant.onnx.export`` writes, initializers included.

The models are tests/onnx_cases.py's; FAST_JOBS run in ``make test``, every other case and
opset it allows is marked slow (``make slow``).
"""
import hashlib
import json
import os
import pathlib
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

import fakequant  # noqa: E402
import onnx_cases  # noqa: E402
from conftest import bits_equal, ort_session  # noqa: E402

HERE = pathlib.Path(__file__).parent

# (case, exporter, opset, declared): declared jobs also set
# fakequant.onnx.export_options(opset_version=opset) around the plain call, which makes the
# graph at 21 fakequant.onnx.export's (int4/int16 types, no zero points).
FAST_JOBS = [
    ("qdq_zoo", "dynamo", 13, False), ("qdq_zoo", "dynamo", 17, False), ("qdq_zoo", "dynamo", 19, False),
    ("qdq_zoo", "dynamo", 21, False), ("qdq_zoo", "dynamo", 21, True), ("qdq_zoo", "torchscript", 17, False),
    ("int_2_5_12_16_bits", "dynamo", 21, True), ("int_2_5_12_16_bits", "dynamo", 19, False),
    ("int_2_5_12_16_bits", "torchscript", 17, False),
    ("torch_affine_family", "dynamo", 19, False), ("torch_affine_family", "torchscript", 13, False),
    ("learned_amax", "dynamo", 17, False), ("learned_amax", "torchscript", 17, False),
    ("two_learned_amax", "dynamo", 20, False),
    ("lsq_learned_scale", "dynamo", 19, False),
    ("ao_prepare_qat_fused", "dynamo", 17, False), ("ao_prepare_qat_fused", "torchscript", 17, False),
    ("ao_prepare_qat_fake_quantize", "dynamo", 19, False), ("ao_prepare_qat_fake_quantize", "torchscript", 13, False),
    ("pytorch_quantization_flow", "dynamo", 19, False), ("pytorch_quantization_flow", "torchscript", 17, False),
    ("pytorch_quantization_flow_fb", "dynamo", 21, True), ("pytorch_quantization_flow_fb", "torchscript", 13, False),
    ("fp8_e4m3", "dynamo", 19, False), ("fp8_per_channel", "torchscript", 19, False),
    ("nvfp4", "dynamo", 21, False), ("mxfp4", "dynamo", 21, False), ("mxint8", "dynamo", 21, False),
    ("per_token_asym_int8", "dynamo", 21, False), ("per_token_fp8", "dynamo", 21, False),
    ("static_blocks_int4", "dynamo", 21, False), ("dynamic_blocks_int4", "dynamo", 21, False),
    ("lsq_per_channel", "dynamo", 13, False),
    ("llama_W8A8_attention", "dynamo", 21, False), ("llama_NVFP4", "dynamo", 21, False),
]


def _all_jobs():
    jobs = []
    for name, case in onnx_cases.CASES.items():
        for exporter in case.exporters:
            for opset in case.opsets(exporter):
                jobs.append((name, exporter, opset, False))
                if exporter == "dynamo" and opset == 21:
                    jobs.append((name, exporter, opset, True))
    return jobs


JOBS = FAST_JOBS + [j for j in _all_jobs() if j not in FAST_JOBS]
# The fast jobs run in `make test`; the others are marked slow (`make slow`).
PARAMS = [pytest.param(j, id=f"{j[0]}-{j[1]}-{j[2]}{'-declared' if j[3] else ''}",
                       marks=() if j in FAST_JOBS else pytest.mark.slow) for j in JOBS]


def _stem(job):
    name, exporter, opset, declared = job
    return f"{name}_{exporter}_{opset}{'_declared' if declared else ''}"


@pytest.fixture(scope="module")
def plain(request, tmp_path_factory):
    """The plain exports of the jobs this session runs, made by worker processes, one a core
    (the exports are Python's work: a process keeps one core busy)."""
    jobs = []
    for item in request.session.items:
        job = getattr(item, "callspec", None) and item.callspec.params.get("job")
        if job and job not in jobs and item.module is request.module and not item.get_closest_marker("skip"):
            jobs.append(job)
    out = tmp_path_factory.mktemp("plain")
    cores = len(os.sched_getaffinity(0))
    shares = [jobs[i::cores] for i in range(cores)]
    workers = [subprocess.Popen([sys.executable, str(HERE / "onnx_plain_worker.py"), str(out), json.dumps(share)],
                                cwd=HERE.parent) for share in shares if share]
    codes = [worker.wait(timeout=3000) for worker in workers]
    assert codes == [0] * len(workers), f"tests/onnx_plain_worker.py exited with {codes}"
    return out


def _load(plain, job):
    path = plain / f"{_stem(job)}.onnx"
    error = path.with_suffix(".error")
    if error.exists():
        pytest.fail(f"plain torch.onnx.export failed:\n{error.read_text()}")
    return path


def _reference(tmp_path, job):
    """The model of ``job`` and the graph fakequant.onnx.export writes for it."""
    name, exporter, opset, _ = job
    case = onnx_cases.CASES[name]
    model = case.make().eval()
    path = tmp_path / "reference.onnx"
    if exporter == "dynamo" and opset < 18:
        opset = 18  # (torch keeps a plain dynamo export at 18 where ONNX's converter fails)
    kwargs = {"dynamic_axes": {"x": {0: "batch"}}} if case.dynamic_batch else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fakequant.onnx.export(model, (case.inputs()[0],), str(path), dynamo=exporter == "dynamo",
                              opset_version=opset, input_names=["x"], **kwargs)
    return model, path


def _run(path, x, optimizations, basic=False):
    # Both graphs of a comparison run in the same session on the same CPU (the int8 kernels of
    # the default one differ between CPUs: conftest.ort_session).
    kind = "graph" if not optimizations else "basic" if basic else "default"
    return ort_session(path, kind).run(None, {"x": x.numpy()})


def _as_list(y):
    return list(y) if isinstance(y, (tuple, list)) else [y]


@pytest.mark.parametrize("job", PARAMS)
def test_plain_export_runs_bit_for_bit(plain, tmp_path, job):
    name = job[0]
    case = onnx_cases.CASES[name]
    path = _load(plain, job)
    onnx.checker.check_model(onnx.load(str(path)), full_check=True)
    model, reference = _reference(tmp_path, job)
    # Zero-point inputs at opset 21 (an asymmetric quantizer, or any int8 one built for opset
    # 20 without export_options(opset_version=21)): ONNX Runtime 1.31-1.32's default session
    # refuses a transformer's graph (docs/export.md); its basic optimizations run it.
    basic = job[2] >= 21 and case.kind == "model" and (case.asymmetric or not job[3])
    # Whole models: float layers between the quantizers, which ONNX Runtime's optimizations
    # fuse differently in different graphs; the numbers of fakequant.onnx.export's graph where
    # the graphs are the same, else PyTorch's up to float rounding (no optimizations).
    same_graph = _comparable(job) is None
    for n, x in enumerate(case.inputs()):
        with torch.no_grad():
            expected = [t.numpy() for t in _as_list(model(x))]
        for optimizations in (True, False):
            got = _run(path, x, optimizations, basic)
            if case.kind == "model" and not same_graph:
                if not optimizations:
                    np.testing.assert_allclose(got[0], expected[0], rtol=1e-3, atol=1e-3)
                continue
            if case.kind == "model":
                expected = _run(reference, x, optimizations, basic)
            assert len(got) == len(expected)
            for i, (g, e) in enumerate(zip(got, expected)):
                assert bits_equal(g, e), (f"{name} output {i}, input {n}, optimizations={optimizations}: "
                                          f"{int(((g != e) | (np.signbit(g) != np.signbit(e))).sum())} differ")
    if case.kind == "model":  # and the reference graph runs what PyTorch computes, up to float rounding
        x = case.inputs()[0]
        with torch.no_grad():
            y = _as_list(model(x))[0]
        np.testing.assert_allclose(_run(reference, x, False)[0], y.numpy(), rtol=1e-3, atol=1e-3)


def canonical(proto):
    """The graph as node-for-node comparable data: each node's type, attributes and inputs,
    where an input is a graph input (by position), an initializer or Constant (by type,
    shape and bytes) or another node's output (by that node's position). An attribute set
    to its default in the operator's schema counts as left out (onnxscript writes the
    defaults, torch.onnx.ops.symbolic what it is given)."""
    graph = proto.graph
    version = {o.domain: o.version for o in proto.opset_import}
    names = {inp.name: ("input", i) for i, inp in enumerate(graph.input)}
    for init in graph.initializer:
        names[init.name] = _tensor_key(init)
    nodes = []
    for k, node in enumerate(graph.node):
        defaults = _defaults(node.op_type, node.domain, version.get(node.domain, 1))
        attrs = sorted((a.name, _attr_key(a)) for a in node.attribute if _attr_key(a) != defaults.get(a.name))
        if node.op_type == "Constant":
            names[node.output[0]] = ("const", attrs)
            continue
        nodes.append((node.domain, node.op_type, attrs, [names.get(i, ("missing", i)) if i else None
                                                         for i in node.input]))
        for j, out in enumerate(node.output):
            names[out] = ("node", len(nodes) - 1, j)
    outputs = [names.get(o.name) for o in graph.output]
    opsets = sorted((o.domain, o.version) for o in proto.opset_import)
    return opsets, nodes, outputs


def _without_layout(graph):
    """The nodes of canonical(...) other than Reshape/Transpose, each as (type, attributes,
    its constant inputs)."""
    return [(n[1], n[2], [i for i in n[3] if i is not None and i[0] in ("tensor", "const")])
            for n in graph[1] if n[1] not in ("Reshape", "Transpose")]


def _defaults(op_type, domain, opset):
    schema = onnx.defs.get_schema(op_type, opset, domain)
    return {name: _attr_key(a.default_value) for name, a in schema.attributes.items()
            if a.default_value.type != onnx.AttributeProto.UNDEFINED}


def _tensor_key(t):
    raw = onnx.numpy_helper.to_array(t).tobytes()
    return ("tensor", t.data_type, tuple(t.dims), hashlib.sha256(raw).hexdigest())


def _attr_key(a):
    if a.type == onnx.AttributeProto.TENSOR:
        return _tensor_key(a.t)
    value = onnx.helper.get_attribute_value(a)
    return value.decode() if isinstance(value, bytes) else repr(value)


def _comparable(job):
    name, exporter, opset, declared = job
    if exporter == "dynamo" and opset == 21 and not declared:
        return "at 21 without export_options(opset_version=21) the nodes are built for opset 20"
    if exporter == "dynamo" and opset < 18:
        return ("below 18 torch converts the dynamo graph itself (it keeps opset 18 where ONNX's "
                "converter fails); fakequant.onnx.export converts it after folding the scales")
    return None


@pytest.mark.parametrize("job", PARAMS)
def test_plain_graph_is_fakequant_onnx_export_graph(plain, tmp_path, job):
    reason = _comparable(job)
    if reason:
        pytest.skip(reason)
    path = _load(plain, job)
    _, reference = _reference(tmp_path, job)
    got, expected = canonical(onnx.load(str(path))), canonical(onnx.load(str(reference)))
    assert got[0] == expected[0], "opsets"
    if onnx_cases.CASES[job[0]].kind == "model":
        # A quantized tensor that is a transposed view (attention's q/k/v) comes out of the
        # plain export contiguous (torch.onnx.ops.symbolic's outputs are), out of the operator
        # with the view's strides: torch adds or drops a Reshape after it. The nodes less
        # the layout ones are the same, each with the same attributes and constants.
        got, expected = _without_layout(got), _without_layout(expected)
        assert sorted(map(repr, got)) == sorted(map(repr, expected))
        return
    assert [n[:2] for n in got[1]] == [n[:2] for n in expected[1]], "node types"
    for k, (g, e) in enumerate(zip(got[1], expected[1])):
        assert g == e, f"node {k} ({g[1]}) differs"
    assert got[2] == expected[2], "outputs"

