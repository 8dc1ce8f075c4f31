"""ONNX export of single quantizers and operators: the graph is QuantizeLinear ->
[Clip] -> DequantizeLinear with the exact scale, and ONNX Runtime computes what
PyTorch computes, bit for bit, with both exporters at opsets 13, 17, 19, 20 and 21.

One model holds every case as a branch, so each (exporter, opset, dtype) is
exported once and shared by the parametrised tests.
"""
import functools
import warnings

import numpy as np
import pytest
import torch

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

import fakequant  # noqa: E402
from fakequant.nn import TensorQuantizer  # noqa: E402
from fakequant.onnx import ExportWarning  # noqa: E402
from fakequant.tensor_quant import QuantDescriptor  # noqa: E402
from conftest import bits_equal, ort_session  # noqa: E402

EXPORTERS = ["torchscript", "dynamo"]
OPSETS = [13, 17, 19, 20, 21]  # 20: torch's default
DTYPES = {"float32": torch.float32, "float16": torch.float16}
N, C, L = 2, 4, 24  # input (N, C, L); per-channel cases along axis 1
INT8, UINT8, INT4, UINT4 = "int8", "uint8", "int4", "uint4"
ONNX_TYPES = {3: INT8, 2: UINT8, 22: INT4, 21: UINT4}


class Case:
    """One branch: ``fn(module, x)``; its scale(s), integer range and quantizer state."""

    def __init__(self, name, qmin, qmax, scale, amax=None, axis=None, zero_point=None, **desc):
        self.name, self.qmin, self.qmax, self.axis = name, qmin, qmax, axis
        self.scale = torch.as_tensor(scale, dtype=torch.float32).reshape(-1)  # float32, per tensor or (C,)
        self.zero_point = zero_point
        self.amax, self.desc = amax, desc


def _amax_case(name, amax, num_bits=8, unsigned=False, narrow_range=False, axis=None):
    amax32 = torch.as_tensor(amax, dtype=torch.float32)
    bound = 2 ** (num_bits - 1 + unsigned) - 1
    qmin = 0 if unsigned else (-bound if narrow_range else -bound - 1)
    scale = amax32.reshape(-1) / bound  # the float32 division the operator does
    scale = torch.where(amax32.reshape(-1) <= 2.0**-24, torch.full_like(scale, 2.0**100), scale)
    return Case(name, qmin, bound, scale, amax=amax32, axis=axis, num_bits=num_bits, unsigned=unsigned,
                narrow_range=narrow_range)


PC_AMAX = torch.tensor([0.7, 1.3, 2.1, 3.9])
CASES = [
    _amax_case("int8", 2.0),
    _amax_case("int8_pow2", 127 / 16),  # scale 1/16: exact ties in float16 too
    _amax_case("uint8", 3.0, unsigned=True),
    _amax_case("narrow", 2.0, narrow_range=True),
    _amax_case("int4", 1.5, num_bits=4),
    _amax_case("int4_narrow", 1.5, num_bits=4, narrow_range=True),
    _amax_case("uint4", 2.5, num_bits=4, unsigned=True),
    _amax_case("int3", 1.1, num_bits=3),
    _amax_case("uint6", 2.2, num_bits=6, unsigned=True),
    _amax_case("pc_int8", PC_AMAX.reshape(1, C, 1), axis=1),
    _amax_case("pc_narrow_flat_amax", PC_AMAX, axis=1, narrow_range=True),
    _amax_case("pc_uint8", PC_AMAX.reshape(1, C, 1), axis=1, unsigned=True),
    _amax_case("pc_int4", PC_AMAX.reshape(1, C, 1), axis=1, num_bits=4),
    _amax_case("pc_zero_channel", torch.tensor([0.0, 1.0, 2.0, 4.0]).reshape(1, C, 1), axis=1),
    Case("per_tensor_affine", 0, 255, 0.02, zero_point=3),
    Case("per_channel_affine", -128, 127, [0.01, 0.02, 0.03, 0.05], axis=1, zero_point=[0, -5, 7, 1]),
    Case("affine_int4", -8, 7, 0.3, zero_point=0),
    Case("min_max", 0, 255, (2.5 - -1.5) / 255.0, zero_point=None),
    Case("quantize_amax", -128, 127, torch.tensor(2.0) / 127, amax=torch.tensor(2.0)),
]
NAMES = [c.name for c in CASES]
BY_NAME = {c.name: c for c in CASES}


class Zoo(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.quantizers = torch.nn.ModuleDict()
        for c in CASES:
            if c.desc:
                q = TensorQuantizer(QuantDescriptor(axis=c.axis, **c.desc))
                q.amax = c.amax
                self.quantizers[c.name] = q
        self.register_buffer("pc_scale", BY_NAME["per_channel_affine"].scale.clone())
        self.register_buffer("pc_zero_point", torch.tensor([0, -5, 7, 1], dtype=torch.int32))

    def forward(self, x):
        out = [self.quantizers[c.name](x) for c in CASES if c.desc]
        out.append(fakequant.fake_quantize_per_tensor_affine(x, 0.02, 3, 0, 255))
        out.append(fakequant.fake_quantize_per_channel_affine(x, self.pc_scale, self.pc_zero_point, 1, -128, 127))
        out.append(fakequant.fake_quantize_affine(x, 0.3, 0, None, -8, 7))
        out.append(fakequant.fake_quantize_min_max(x, -1.5, 2.5, 8))
        out.append(fakequant.quantize_amax(x, 2.0, 8, False, False)[0])
        return tuple(out)


def _nextafter(x, direction):
    return torch.nextafter(x, torch.full_like(x, direction))


def _ties(scale, qmin, qmax):
    """Inputs (4, C, L) on and next to the rounding ties of ``scale`` (scalar or per channel)."""
    g = torch.Generator().manual_seed(1)
    k = torch.randint(qmin - 2, qmax + 2, (C, L), generator=g).float()
    s = scale.reshape(-1, 1) if scale.numel() > 1 else scale
    exact = (k + 0.5) * s
    return torch.stack([exact, _nextafter(exact, float("inf")), _nextafter(exact, -float("inf")), k * s])


@functools.lru_cache(maxsize=None)
def inputs(dtype_name):
    dtype = DTYPES[dtype_name]
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(N, C, L, generator=g) * 2, torch.randn(N, C, L, generator=g) * 40,
          torch.tensor([0.0, -0.0, 1e4, -1e4, 3e-8, -3e-8]).repeat(N * C * L // 6).reshape(N, C, L)]
    for c in CASES:
        # (the channel of amax 0 has scale 2^100: its ties are far beyond any activation)
        scale = torch.where(c.scale >= 2.0**100, torch.full_like(c.scale, 1 / 127), c.scale)
        xs.append(_ties(scale, c.qmin, c.qmax))
    return [x.to(dtype) for x in xs]


class Exported:
    def __init__(self, exporter, opset, dtype_name, path):
        self.model = Zoo().eval()
        x = inputs(dtype_name)[0]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if exporter == "torchscript":
                torch.onnx.export(self.model, (x,), str(path), dynamo=False, opset_version=opset,
                                  input_names=["x"], output_names=NAMES, dynamic_axes={"x": {0: "batch"}})
            else:
                # Below opset 18 torch's own conversion fails on the scale arithmetic (it
                # converts before folding it); fakequant.onnx.export folds first. From 17 on
                # the plain call, told the opset (docs/export.md: the opset of a plain export).
                export = torch.onnx.export if opset >= 17 else fakequant.onnx.export
                with fakequant.onnx.export_options(opset_version=opset):
                    export(self.model, (x,), str(path), dynamo=True, opset_version=opset, input_names=["x"],
                           output_names=NAMES, dynamic_shapes=({0: torch.export.Dim("batch")},), verbose=False)
        self.warnings = [w for w in caught if issubclass(w.category, ExportWarning)]
        self.proto = onnx.load(str(path))
        onnx.checker.check_model(self.proto, full_check=True)
        # ONNX Runtime's default session: single quantizers, no MatMul/Conv for its int8
        # kernels, so it runs the graph's own QDQ nodes (test_onnx_plain.py also runs ORT_DISABLE_ALL)
        self.session = ort_session(path, "default")
        self.exporter, self.opset = exporter, opset
        self.results = []
        with torch.no_grad():
            for x in inputs(dtype_name):
                got = self.session.run(None, {"x": x.numpy()})
                self.results.append((x, got, [t.numpy() for t in self.model(x)]))


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    cache = {}

    def get(exporter, opset, dtype_name):
        key = (exporter, opset, dtype_name)
        if key not in cache:
            path = tmp_path_factory.mktemp("onnx") / f"zoo_{exporter}_{opset}_{dtype_name}.onnx"
            try:
                cache[key] = Exported(exporter, opset, dtype_name, path)
            except Exception as e:  # noqa: BLE001  (fail every test of this export, fast)
                cache[key] = e
        if isinstance(cache[key], Exception):
            raise cache[key]
        return cache[key]

    return get


# --- ONNX Runtime == PyTorch ------------------------------------------------------------------


@pytest.mark.parametrize("case", NAMES)
@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize("exporter", EXPORTERS)
def test_onnxruntime_equals_pytorch_bit_for_bit(exported, exporter, opset, dtype_name, case):
    art = exported(exporter, opset, dtype_name)
    i = NAMES.index(case)
    for n, (x, got, expected) in enumerate(art.results):
        assert got[i].dtype == expected[i].dtype
        assert got[i].shape == expected[i].shape
        # Bit for bit: equal numbers with the same sign (ONNX Runtime writes +0.0 for q = 0).
        bad = (got[i] != expected[i]) | (np.signbit(got[i]) != np.signbit(expected[i]))
        assert not bad.any(), (
            f"{case}, input {n}: {int(bad.sum())} differences, e.g. x={x.numpy()[bad][:4]} "
            f"onnxruntime={got[i][bad][:4]} pytorch={expected[i][bad][:4]}")


# --- the graph ---------------------------------------------------------------------------------


class Graph:
    def __init__(self, proto):
        self.proto = proto
        self.producer = {o: n for n in proto.graph.node for o in n.output}

    def tensor(self, name):
        """The TensorProto of constant ``name`` (an initializer, or a Constant/Identity of one)."""
        for t in self.proto.graph.initializer:
            if t.name == name:
                return t
        node = self.producer[name]
        if node.op_type == "Identity":
            return self.tensor(node.input[0])
        assert node.op_type == "Constant", f"{name} is computed by {node.op_type}, not a constant"
        return node.attribute[0].t

    def value(self, name):
        return onnx.numpy_helper.to_array(self.tensor(name))

    def chain(self, output):
        """The nodes from the QuantizeLinear to ``output``."""
        nodes, name = [], output
        while True:
            node = self.producer[name]
            nodes.insert(0, node)
            if node.op_type == "QuantizeLinear":
                return nodes
            name = node.input[0]


def _attr(node, name, default=None):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def expected_qtype(c, exporter, opset):
    """int4/uint4 where the range fits (dynamo at opset 21: the TorchScript
    exporter has no 4-bit type); the operators with a zero point take them
    only for the whole 4-bit range. int8/uint8 otherwise."""
    if exporter == "dynamo" and opset >= 21:
        full = (c.qmin, c.qmax) in ((-8, 7), (0, 15))
        fits = c.qmin >= -8 and c.qmax <= (15 if c.qmin >= 0 else 7)
        if full or (fits and c.desc):
            return UINT4 if c.qmin >= 0 else INT4
    return UINT8 if c.qmin >= 0 else INT8


@pytest.mark.parametrize("case", NAMES)
@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize("exporter", EXPORTERS)
def test_graph_is_qdq_with_the_exact_scale(exported, exporter, opset, dtype_name, case):
    art = exported(exporter, opset, dtype_name)
    c = BY_NAME[case]
    graph = Graph(art.proto)
    chain = graph.chain(case)
    types = [n.op_type for n in chain]
    q = chain[0]
    # float16 is computed in float32: Cast -> QuantizeLinear -> ... -> Cast
    x_in = q.input[0]
    if dtype_name == "float16":
        assert graph.producer[x_in].op_type == "Cast" and types[-1] == "Cast"
    else:
        assert x_in == "x" and types[-1] != "Cast" or case == "quantize_amax"
    if case == "quantize_amax":
        assert types[:2] == ["QuantizeLinear", "Cast"]
    else:
        assert "DequantizeLinear" in types
        dq = chain[types.index("DequantizeLinear")]
        assert dq.input[1] == q.input[1] or bits_equal(graph.value(dq.input[1]), graph.value(q.input[1]))
    scale = graph.value(q.input[1])
    assert scale.dtype == np.float32
    assert scale.shape == (() if c.axis is None else (C,))
    # Bit-identical to the float32 scale the operator used.
    assert np.array_equal(scale.reshape(-1).view(np.uint32), c.scale.numpy().view(np.uint32)), (scale, c.scale)
    assert _attr(q, "axis", 1) == (1 if c.axis is None else c.axis)
    qtype = expected_qtype(c, exporter, opset)
    if len(q.input) > 2 and q.input[2]:
        zp = graph.value(q.input[2])
        assert ONNX_TYPES[graph.tensor(q.input[2]).data_type] == qtype
        assert zp.shape == scale.shape
        expected_zp = 0 if c.zero_point is None else np.asarray(c.zero_point)
        if case == "min_max":
            expected_zp = 96  # -rint(-1.5 / step)
        assert bits_equal(zp.astype(np.int64), np.broadcast_to(expected_zp, zp.shape))
    else:
        assert ONNX_TYPES[_attr(q, "output_dtype")] == qtype
    lo, hi = {INT8: (-128, 127), UINT8: (0, 255), INT4: (-8, 7), UINT4: (0, 15)}[qtype]
    clipped = (c.qmin, c.qmax) != (lo, hi)
    if qtype in (INT8, UINT8):
        assert (types[1] == "Clip") == clipped, types
        if clipped:
            assert int(graph.value(chain[1].input[1])) == c.qmin and int(graph.value(chain[1].input[2])) == c.qmax
    else:
        assert types[1] != "Clip" and (("Clip" in types or "Max" in types) == clipped), types


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize("exporter", EXPORTERS)
def test_no_warnings_and_version(exported, exporter, opset, dtype_name):
    art = exported(exporter, opset, dtype_name)
    assert not art.warnings, [str(w.message) for w in art.warnings]
    assert {o.domain: o.version for o in art.proto.opset_import}.get("", None) == opset
    ops = {n.op_type for n in art.proto.graph.node}
    assert ops <= {"QuantizeLinear", "DequantizeLinear", "Clip", "Cast", "Identity", "Constant", "Max", "Min"}, ops
