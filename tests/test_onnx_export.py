"""ONNX export options, warnings and the graphs of what has no plain QDQ form:
the TensorRT option for narrow ranges, dynamic amax, 9..16 bits, float64,
block quantization, learned ranges, disabled quantizers, bfloat16, and the
switches (enable_onnx_export, use_fb_fake_quant, opset checks, registration)."""
import warnings

import numpy as np
import pytest
import torch

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

import fakequant  # noqa: E402
from fakequant import nn as quant_nn  # noqa: E402
from fakequant.nn import TensorQuantizer  # noqa: E402
from fakequant.onnx import ExportWarning  # noqa: E402
from fakequant.tensor_quant import QuantDescriptor  # noqa: E402
from conftest import bits_equal, needs_exact_u8s8, ort_session  # noqa: E402

EXPORTERS = ["torchscript", "dynamo"]


def export_and_run(module, x, exporter, opset, path, export=None, session="graph", session_options=None, **kwargs):
    """(graph, ONNX Runtime's output, fakequant ExportWarnings) of ``module`` exported at ``opset``;
    ``session``: which ONNX Runtime session runs it (conftest.ort_session; default: the graph itself)."""
    module.eval()
    export = export or fakequant.onnx.export
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        export(module, (x,), str(path), dynamo=exporter == "dynamo", opset_version=opset, input_names=["x"],
               **({"verbose": False} if exporter == "dynamo" else {}), **kwargs)
    proto = onnx.load(str(path))
    onnx.checker.check_model(proto, full_check=True)
    got = ort_session(path, session, session_options).run(None, {"x": x.numpy()})[0]
    return proto, got, [str(w.message) for w in caught if issubclass(w.category, ExportWarning)]


def op_types(proto):
    return [n.op_type for n in proto.graph.node]


def quantizer(**desc):
    return TensorQuantizer(QuantDescriptor(**desc))


X = torch.randn(2, 4, 8, generator=torch.Generator().manual_seed(0)) * 3


# --- narrow range: exact by default, Clip dropped for TensorRT on request ------------------------


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_narrow_range_clip_can_be_dropped_for_tensorrt(exporter, tmp_path):
    q = quantizer(amax=2.0, narrow_range=True)
    s = torch.tensor(2.0) / 127
    x = torch.cat([X.flatten(), torch.tensor([-127.49, -127.5, -127.51, -128.0, -300.0]) * s]).reshape(1, -1)
    expected = q(x).detach().numpy()

    proto, got, caught = export_and_run(q, x, exporter, 17, tmp_path / "exact.onnx")
    assert "Clip" in op_types(proto) and not caught
    assert bits_equal(got, expected)

    # torch.onnx.export itself: the dynamo exporter takes fakequant's translations as a table
    table = {"custom_translation_table": fakequant.onnx.custom_translation_table()} if exporter == "dynamo" else {}
    with fakequant.enable_onnx_export(clip_narrow_range=False):
        proto, got, caught = export_and_run(q, x, exporter, 17, tmp_path / "trt.onnx", export=torch.onnx.export,
                                            **table)
    assert op_types(proto).count("Clip") == 0
    assert len(caught) == 1 and "clip_narrow_range=False" in caught[0] and "-128" in caught[0]
    differ = got != expected
    assert bits_equal(got[~differ], expected[~differ])  # the sign of zero too
    # Only where x / s rounds to -128 does the graph differ: -128 s instead of -127 s.
    assert bits_equal(differ, (x / s).round().numpy() <= -128)
    assert bits_equal(got[differ], np.full(differ.sum(), (-128 * s).item(), np.float32))


# --- dynamic amax ---------------------------------------------------------------------------------


@pytest.mark.parametrize("axis", [None, 1])
@pytest.mark.parametrize("exporter", EXPORTERS)
def test_dynamic_amax_exports_a_computed_scale_with_a_warning(exporter, axis, tmp_path):
    q = quantizer(dynamic=True, axis=axis)
    proto, got, caught = export_and_run(q, X, exporter, 17, tmp_path / "m.onnx")
    assert bits_equal(got, q(X).numpy())
    assert op_types(proto).count("QuantizeLinear") == 1 and "ReduceMax" in op_types(proto)
    assert len(caught) == 1 and "TensorRT" in caught[0] and "constant scales" in caught[0]


# --- what has no plain QDQ form: exact all the same ---------------------------------------------

FALLBACKS = [
    # (name, quantizer descriptor, dtype, exporter, opset, QDQ expected, warning expected)
    ("16bit_opset17", dict(num_bits=16, amax=3.0), torch.float32, "dynamo", 18, False, "opset_version >= 21"),
    ("16bit_torchscript", dict(num_bits=16, amax=3.0), torch.float32, "torchscript", 17, False, "TorchScript"),
    ("16bit_int16", dict(num_bits=16, amax=3.0), torch.float32, "dynamo", 21, True, None),
    ("12bit_per_channel_int16", dict(num_bits=12, axis=1, amax=torch.tensor([[[1.0], [2.0], [3.0], [4.0]]])),
     torch.float32, "dynamo", 21, True, None),
    ("float64", dict(amax=3.0), torch.float64, "torchscript", 17, False, "float64"),
    ("float64", dict(amax=3.0), torch.float64, "dynamo", 18, False, "float64"),
    ("blocks", dict(block_sizes={-1: 4}), torch.float32, "torchscript", 17, False, "more than one axis"),
    ("blocks", dict(block_sizes={-1: 4}), torch.float32, "dynamo", 18, False, "more than one axis"),
]


@pytest.mark.parametrize("name, desc, dtype, exporter, opset, qdq, warning", FALLBACKS,
                         ids=[f"{f[0]}-{f[3]}" for f in FALLBACKS])
def test_ranges_without_a_qdq_type_export_exactly(name, desc, dtype, exporter, opset, qdq, warning, tmp_path):
    q = quantizer(**desc)
    x = X.to(dtype) * 2
    if q.amax is None:  # calibrate the blocks
        q.enable_calib(), q.disable_quant(), q(x), q.load_calib_amax(), q.disable_calib(), q.enable_quant()
    proto, got, caught = export_and_run(q, x, exporter, opset, tmp_path / "m.onnx")
    assert bits_equal(got, q(x).numpy())
    assert ("QuantizeLinear" in op_types(proto)) == qdq, op_types(proto)
    if warning is None:
        assert not caught
    else:
        assert len(caught) == 1 and warning in caught[0] and "Div/Round" in caught[0], caught
    if qdq:
        types = {t.data_type for t in proto.graph.initializer} | {
            a.i for n in proto.graph.node for a in n.attribute if a.name == "output_dtype"}
        assert onnx.TensorProto.INT16 in types


# --- quantizer states -------------------------------------------------------------------------------


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_learned_amax_exports_a_constant_scale(exporter, tmp_path):
    q = quantizer(amax=2.0, learn_amax=True)
    with torch.no_grad():
        q.clip.clip_value_min.fill_(-1.7)
        q.clip.clip_value_max.fill_(2.3)
    proto, got, caught = export_and_run(q, X, exporter, 17, tmp_path / "m.onnx")
    assert bits_equal(got, q(X).detach().numpy()) and not caught
    producers = {o: n for n in proto.graph.node for o in n.output}
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in proto.graph.initializer}
    (qnode,) = [n for n in proto.graph.node if n.op_type == "QuantizeLinear"]
    scale = qnode.input[1]
    while scale not in inits:  # a constant, possibly behind Identity
        node = producers[scale]
        assert node.op_type in ("Identity", "Constant"), f"the scale is computed by {node.op_type}"
        if node.op_type == "Constant":
            break
        scale = node.input[0]
    else:
        assert inits[scale] == np.float32(2.3) / np.float32(127)


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_disabled_quantizers_emit_nothing(exporter, tmp_path):
    layer = quant_nn.QuantLinear(8, 3, quant_desc_input=QuantDescriptor(amax=4.0))
    layer._weight_quantizer.amax = layer.weight.detach().abs().amax(1, keepdim=True)
    layer._input_quantizer.disable()
    # A weight-only DQ -> MatMul becomes MatMulNBits in ONNX Runtime, by default with
    # int8 activations (accuracy level 4); level 0 keeps them float32.
    options = ort.SessionOptions()
    options.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "0")
    proto, got, _ = export_and_run(layer, X, exporter, 17, tmp_path / "one.onnx", session="default",
                                   session_options=options)
    assert op_types(proto).count("QuantizeLinear") == op_types(proto).count("DequantizeLinear") == 1
    np.testing.assert_allclose(got, layer(X).detach().numpy(), rtol=1e-5, atol=1e-6)
    layer._weight_quantizer.disable_quant()
    proto, got, _ = export_and_run(layer, X, exporter, 17, tmp_path / "none.onnx")
    assert "QuantizeLinear" not in op_types(proto) and "DequantizeLinear" not in op_types(proto)


class _BFloat16(torch.nn.Module):
    def __init__(self, q):
        super().__init__()
        self.q = q

    def forward(self, x):
        return self.q(x.bfloat16()).float()


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_bfloat16_computes_in_float32(exporter, tmp_path):
    m = _BFloat16(quantizer(axis=1, amax=torch.tensor([[[1.0], [2.0], [3.0], [4.0]]])))
    proto, got, caught = export_and_run(m, X, exporter, 19, tmp_path / "m.onnx")
    assert bits_equal(got, m(X).numpy()) and not caught


# --- switches ----------------------------------------------------------------------------------


def test_use_fb_fake_quant_is_not_used_during_export(tmp_path):
    q = quantizer(amax=2.0, narrow_range=True)
    expected = q(X).numpy()
    saved = TensorQuantizer.use_fb_fake_quant
    TensorQuantizer.use_fb_fake_quant = True
    try:
        proto, got, _ = export_and_run(q, X, "torchscript", 17, tmp_path / "m.onnx", export=torch.onnx.export)
    finally:
        TensorQuantizer.use_fb_fake_quant = saved
    assert "Clip" in op_types(proto)  # fakequant's narrow range, not torch's full range
    assert bits_equal(got, expected)


def test_enable_onnx_export_restores_everything_when_the_export_raises():
    with pytest.raises(RuntimeError, match="export failed"):
        with fakequant.enable_onnx_export(clip_narrow_range=False):
            assert fakequant.onnx._options.current().clip_narrow_range is False
            raise RuntimeError("export failed")
    assert fakequant.onnx._options.current().clip_narrow_range is True
    assert not TensorQuantizer._enable_onnx_export and not TensorQuantizer.use_fb_fake_quant
    with fakequant.enable_onnx_export():
        quantizer(dynamic=True)(X)  # dynamic: allowed (exported with a warning)
        with pytest.raises(RuntimeError, match="calibrated"):
            quantizer()(X)
    with pytest.raises(TypeError, match="clip_narrow_range"):
        with fakequant.onnx.export_options(clip_narrow_range=1):
            pass


def test_opsets_below_13_are_refused(tmp_path):
    q = quantizer(amax=2.0)
    with pytest.raises(ValueError, match="opset_version >= 13"):
        fakequant.onnx.export(q, (X,), str(tmp_path / "m.onnx"), dynamo=False, opset_version=12)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(Exception, match="opset_version >= 13"):
            torch.onnx.export(q, (X,), str(tmp_path / "m.onnx"), dynamo=False, opset_version=12)


def test_dynamo_translations_are_registered_and_available_as_a_table(tmp_path):
    table = fakequant.onnx.custom_translation_table()
    ops = torch.ops.fakequant
    # every forward operator (the backward ones never reach an inference graph, nor does the
    # fused observer, which updates its buffers in place: docs/torch-ao.md)
    training_only = ("backward", "fused_moving_avg_obs_fake_quant")
    # (nor llama.cpp's blocks, which have no ONNX form: fakequant.ops.fake_quantize_ggml refuses the export)
    no_onnx = ("fake_quantize_ggml",)
    assert set(table) == {getattr(ops, name).default for name in ops
                          if not any(t in name for t in training_only) and name not in no_onnx}
    q = quantizer(amax=2.0)
    proto, got, _ = export_and_run(q, X, "dynamo", 18, tmp_path / "m.onnx", export=torch.onnx.export,
                                   custom_translation_table=table)
    assert bits_equal(got, q(X).numpy())
    assert fakequant.onnx.register() == table  # register() hands out the same table


_FRESH_PROCESS = """
import sys, warnings
{before}
import torch, fakequant, onnx
from fakequant.nn import TensorQuantizer
from fakequant.tensor_quant import QuantDescriptor
{check}
"""


def _run_fresh(before, check):
    import subprocess
    import sys

    code = _FRESH_PROCESS.format(before=before, check=check)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_plain_dynamo_export_works_and_an_exported_program_names_the_call_in_a_fresh_process(tmp_path):
    # A plain torch.onnx.export (dynamo, torch's default) writes the QDQ graph with no
    # warning and nothing patched into torch; an ExportedProgram traced beforehand by
    # torch.export.export fails with an error naming fakequant.onnx.export, which exports it.
    path = tmp_path / "m.onnx"
    out = _run_fresh("meta_path = list(sys.meta_path)", f"""
assert sys.meta_path == meta_path, "import fakequant changed sys.meta_path"
q = TensorQuantizer(QuantDescriptor(amax=2.0, narrow_range=True)).eval()
x = torch.randn(3, 5)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    torch.onnx.export(q, (x,), {str(path)!r}, verbose=False)
    print("plain", sorted(n.op_type for n in onnx.load({str(path)!r}).graph.node))
print("fakequant warnings", [str(w.message) for w in caught if w.category.__module__.startswith("fakequant")])
ep = torch.export.export(q, (x,))
try:
    torch.onnx.export(ep, (x,), {str(path)!r}, verbose=False)
    print("exported the program")
except Exception as e:
    chain, cause = [], e
    while cause is not None:
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    ours = [c for c in chain if isinstance(c, fakequant.onnx.TranslationError)]
    print("program raised", len(ours) > 0 and isinstance(ours[0], RuntimeError) and
          "fakequant.onnx.export(exported_program" in str(ours[0]))
fakequant.onnx.export(ep, (x,), {str(path)!r}, verbose=False)
print("program", sorted(n.op_type for n in onnx.load({str(path)!r}).graph.node))
""")
    assert "plain ['Clip', 'DequantizeLinear', 'QuantizeLinear']" in out, out
    assert "fakequant warnings []" in out, out
    assert "program raised True" in out, out
    assert "program ['Clip', 'DequantizeLinear', 'QuantizeLinear']" in out, out

def test_fakequant_patches_nothing_of_another_library():
    """No import-time patching: no import hooks, no private torch registries."""
    import pathlib

    root = pathlib.Path(fakequant.__file__).parent
    offenders = [f"{path.relative_to(root)}: {needle}" for path in sorted(root.rglob("*.py"))
                 for needle in ("torch.onnx._internal", "sys.meta_path", "_torchlib")
                 if needle in path.read_text()]
    assert not offenders, offenders


class _Affine(torch.nn.Module):
    """torch.ao-style asymmetric activations (zero point 3) before a Linear."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 5)

    def forward(self, x):
        return self.lin(fakequant.fake_quantize_per_tensor_affine(x, 0.05, 3, -128, 127))


@pytest.mark.parametrize("exporter,opset", [("torchscript", 17), ("torchscript", 20), ("dynamo", 18),
                                            ("dynamo", 21), ("dynamo", 23)])
@pytest.mark.parametrize("unsigned", [False, True])
def test_quantized_linear_on_3d_input_loads_in_the_default_session(exporter, opset, unsigned, tmp_path):
    # A transformer's Linear: a 3-D input, then the bias Add. ONNX Runtime 1.31-1.32's default
    # optimizations fuse MatMul + Add into Gemm and, for a QuantizeLinear with a zero-point input
    # at opset >= 21, build a node they then refuse; the symmetric quantizers leave the zero
    # point out from opset 21 on. The default session loads and runs the graph; its numbers are
    # the int8 kernels' (exact only where the CPU has VNNI: test_int8_kernels_*), the graph's are
    # PyTorch's up to the MatMul's sums.
    torch.manual_seed(0)
    layer = quant_nn.QuantLinear(8, 5, quant_desc_input=QuantDescriptor(amax=3.0, unsigned=unsigned))
    layer._weight_quantizer.amax = layer.weight.detach().abs().amax(1, keepdim=True)
    x = X.abs() if unsigned else X
    proto, got, _ = export_and_run(layer, x, exporter, opset, tmp_path / "lin.onnx")
    np.testing.assert_allclose(got, layer(x).detach().numpy(), rtol=1e-5, atol=1e-6)  # (the MatMul's sums)
    assert ort_session(tmp_path / "lin.onnx", "default").run(None, {"x": x.numpy()})[0].shape == got.shape
    # the quantized input alone is exact in the default session
    _, got_q, _ = export_and_run(layer._input_quantizer, x, exporter, opset, tmp_path / "q.onnx", session="default")
    assert bits_equal(got_q, layer._input_quantizer(x))
    if opset >= 21:
        assert all(len(n.input) == 2 for n in proto.graph.node if n.op_type == "QuantizeLinear")


def test_asymmetric_linear_at_opset_21_workaround(tmp_path):
    # With a zero point other than 0 the input must be there, and ONNX Runtime's default session
    # refuses the graph (its bug, docs/export.md); its basic optimizations run it, with the numbers.
    m = _Affine().eval()
    _, got, _ = export_and_run(m, X, "dynamo", 21, tmp_path / "a.onnx", session="basic")
    np.testing.assert_allclose(got, m(X).detach().numpy(), rtol=1e-5, atol=1e-6)


# --- ONNX Runtime's int8 kernels: saturation on x86 CPUs without VNNI ---------------------------

INT8_KERNELS = {"MatMulIntegerToFloat", "QLinearMatMul", "QGemm", "MatMulInteger", "DynamicQuantizeMatMul"}


def _saturating_linear():
    """A QuantLinear whose products saturate 16-bit pair sums: every input element at its amax
    (q = 127, 255 once ONNX Runtime moves int8 activations to uint8 with zero point 128) and
    every weight at its channel's amax (q = 127): 255 * 127 * 2 > 32767."""
    layer = quant_nn.QuantLinear(64, 8, quant_desc_input=QuantDescriptor(amax=1.0))
    with torch.no_grad():
        layer.weight.fill_(0.5)
        layer.weight[::2].neg_()
        layer.bias.zero_()
    layer._weight_quantizer.amax = layer.weight.detach().abs().amax(1, keepdim=True)
    x = torch.ones(4, 64)
    x[1] = -1.0
    x[2, ::2] = 0.0
    x[3] = torch.linspace(-1, 1, 64)
    return layer.eval(), x


def _fused(path, kind, x):
    """(output, node types) of ONNX Runtime's session of ``kind``, from the graph it optimized."""
    options = ort.SessionOptions()
    options.log_severity_level = 3  # (its note that an optimized graph is hardware-specific)
    options.optimized_model_filepath = str(path.with_suffix(f".{kind}.onnx"))
    got = ort_session(path, kind, options).run(None, {"x": x.numpy()})[0]
    return got, {n.op_type for n in onnx.load(options.optimized_model_filepath).graph.node}


def test_int8_kernels_with_signed_activations_are_exact_on_every_cpu(tmp_path):
    # session.qdqisint8allowed=1 keeps the activations int8: s8s8 kernels with 32-bit sums, on
    # every CPU (the u8s8 kernels of the default session saturate without VNNI: docs/export.md).
    layer, x = _saturating_linear()
    _, graph, _ = export_and_run(layer, x, "dynamo", 17, tmp_path / "lin.onnx")
    got, types = _fused(tmp_path / "lin.onnx", "int8", x)
    assert types & INT8_KERNELS, types  # (int8 kernels did run)
    expected = layer(x).detach().numpy()
    np.testing.assert_allclose(graph, expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


@needs_exact_u8s8
def test_int8_kernels_of_the_default_session_are_exact_where_the_cpu_has_vnni(tmp_path):
    layer, x = _saturating_linear()
    export_and_run(layer, x, "dynamo", 17, tmp_path / "lin.onnx")
    got, types = _fused(tmp_path / "lin.onnx", "default", x)
    assert types & INT8_KERNELS, types
    np.testing.assert_allclose(got, layer(x).detach().numpy(), rtol=1e-6, atol=1e-6)
