"""ONNX export of FP8, block-wise and LSQ quantization: the graph each one becomes
(float8 QuantizeLinear/DequantizeLinear at opset 19, block-wise ones at opset 21,
LSQ as the affine QDQ pair), run in ONNX Runtime and compared with PyTorch bit for
bit, with both exporters where they can write the graph.

What ONNX Runtime cannot run is named in the tests that expect it: FP4 E2M1 and the FP6
formats have no QuantizeLinear there (exported as Div/round/Mul), E8M0 scales are computed
in float32 (ONNX Runtime has no E8M0 DequantizeLinear), and blocks holding NaN differ
(ReduceMax does not propagate NaN as the operator does).
"""
import warnings

import pytest
import torch

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

import fakequant  # noqa: E402
from fakequant.nn import TensorQuantizer  # noqa: E402
from fakequant.onnx import ExportWarning  # noqa: E402
from fakequant.tensor_quant import QuantDescriptor  # noqa: E402
import op_table  # noqa: E402
from conftest import bits_equal, ort_session  # noqa: E402

FLOAT8E4M3FN, FLOAT8E5M2, INT4, INT8, UINT8 = 17, 19, 22, 3, 2
N, C, L = 3, 4, 40  # L = 40: blocks of 16 leave a ragged block of 8


def quantizer(amax=None, **desc):
    q = TensorQuantizer(QuantDescriptor(**desc))
    if amax is not None:
        q.amax = amax
    return q


class Branch(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


MX = {-1: 32, "type": "dynamic", "scale_bits": (8, 0)}  # Model Optimizer's spelling of the MX formats
ASYM = {"type": "dynamic", "block_sizes": {-1: None}, "bias": {-1: None, "type": "dynamic", "method": "max_min"}}
PC_AMAX = torch.tensor([0.7, 1.3, 2.1, 3.9]).reshape(1, C, 1)
BLOCK_AMAX = torch.rand(N, C, L // 8, 1, generator=torch.Generator().manual_seed(3)) * 3 + 0.5


def _static_blocks():
    q = quantizer(num_bits=4, block_sizes={-1: 8}, axis=None)
    q.amax = BLOCK_AMAX
    return q


# name: (module factory, minimum opset, exporters that can write it, what the graph holds)
CASES = {
    "fp8_e4m3": (lambda: quantizer(2.0, num_bits=(4, 3)), 19, ("dynamo", "torchscript"), "fp8"),
    "fp8_e5m2": (lambda: quantizer(3.0, num_bits=(5, 2)), 19, ("dynamo", "torchscript"), "fp8"),
    "fp8_per_channel": (lambda: quantizer(PC_AMAX, num_bits=(4, 3), axis=1), 19, ("dynamo", "torchscript"), "fp8"),
    "scaled_e4m3": (lambda: Branch(lambda x: fakequant.tensor_quant.scaled_e4m3(x, 1.5)), 19,
                    ("dynamo", "torchscript"), "fp8"),
    "static_blocks_int4": (_static_blocks, 21, ("dynamo",), "block"),
    "dynamic_blocks_int8": (lambda: quantizer(block_sizes={-1: 16, "type": "dynamic"}), 21, ("dynamo",), "block"),
    "dynamic_blocks_int4": (lambda: quantizer(num_bits=4, block_sizes={-1: 16, "type": "dynamic"}), 21,
                            ("dynamo",), "block"),
    "dynamic_blocks_e4m3": (lambda: quantizer(num_bits=(4, 3), block_sizes={-1: 16, "type": "dynamic"}), 21,
                            ("dynamo",), "block"),
    "nvfp4": (lambda: quantizer(num_bits=(2, 1), block_sizes={-1: 16, "type": "dynamic", "scale_bits": (4, 3)}),
              21, ("dynamo",), "arithmetic"),
    # the TorchScript exporter writes NVFP4 from opset 19 on (no block QuantizeLinear in it); its
    # shape inference asserted on the blocks' Reshape before it had a -1 (issue 16)
    "nvfp4_torchscript": (lambda: quantizer(num_bits=(2, 1),
                                            block_sizes={-1: 16, "type": "dynamic", "scale_bits": (4, 3)}),
                          20, ("torchscript",), "arithmetic"),
    # the OCP microscaling formats: E8M0 block scales computed exactly in the graph (Log, Floor,
    # Pow, comparisons), then block QuantizeLinear (integer, FP8 elements) or arithmetic (FP6, FP4)
    "mxfp8_e4m3": (lambda: quantizer(num_bits=(4, 3), block_sizes=MX), 21, ("dynamo",), "block"),
    "mxfp8_e5m2": (lambda: quantizer(num_bits=(5, 2), block_sizes=MX), 21, ("dynamo",), "block"),
    "mxint8": (lambda: quantizer(num_bits=8, block_sizes=MX), 21, ("dynamo",), "block"),
    "mxfp6_e3m2": (lambda: quantizer(num_bits=(3, 2), block_sizes=MX), 21, ("dynamo",), "arithmetic"),
    "mxfp6_e2m3": (lambda: quantizer(num_bits=(2, 3), block_sizes=MX), 21, ("dynamo",), "arithmetic"),
    "mxfp4": (lambda: quantizer(num_bits=(2, 1), block_sizes=MX), 21, ("dynamo",), "arithmetic"),
    "mxfp4_torchscript": (lambda: quantizer(num_bits=(2, 1), block_sizes=MX), 20, ("torchscript",), "arithmetic"),
    # FP6 on its own (per tensor): no ONNX type, Div/round/Mul
    "fp6_e3m2": (lambda: quantizer(2.0, num_bits=(3, 2)), 19, ("dynamo", "torchscript"), "arithmetic"),
    "fp6_e2m3": (lambda: quantizer(2.0, num_bits=(2, 3)), 19, ("dynamo", "torchscript"), "arithmetic"),
    # per-token dynamic activations: one block the length of the last axis
    "per_token_int8": (lambda: quantizer(num_bits=8, type="dynamic", block_sizes={-1: None}), 21, ("dynamo",),
                       "block"),
    "per_token_fp8": (lambda: quantizer(num_bits=(4, 3), type="dynamic", block_sizes={-1: None}), 21, ("dynamo",),
                      "block"),
    # per-token asymmetric (Model Optimizer's dynamic max_min bias): the row's centre subtracted
    # before the block QuantizeLinear and added after the DequantizeLinear
    "per_token_asym_int8": (lambda: quantizer(num_bits=8, **ASYM), 21, ("dynamo",), "block"),
    "per_token_asym_fp8": (lambda: quantizer(num_bits=(4, 3), **ASYM), 21, ("dynamo",), "block"),
}

# the operators' own cases (tests/op_table.py) that take these inputs
CASES.update({name: (case.make, case.min_opset, case.exporters, case.graph)
              for name, case in op_table.onnx_cases("fp8_block").items()})


def inputs():
    g = torch.Generator().manual_seed(0)
    vals = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    vals = vals[vals.isfinite()].unique()
    mids = ((vals[1:] + vals[:-1]) / 2)  # exact ties of E4M3 at scale 1
    ties = torch.cat([mids, -mids]).repeat(N * C * L // (2 * len(mids)) + 1)[:N * C * L].reshape(N, C, L)
    # magnitudes over many decades per row (tiny blocks far below 2^-24 included), so that
    # the MX formats' power-of-two scales take many exponents, the clamp at 2^-127 too
    spread = torch.randn(N, C, L, generator=g) * torch.logspace(-45, 30, N * C, base=2.0).reshape(N, C, 1)
    return [torch.randn(N, C, L, generator=g) * 2, torch.randn(N, C, L, generator=g) * 40, ties * (2.0 / 448),
            torch.zeros(N, C, L), spread]


def export(module, exporter, opset, path):
    x = inputs()[0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if exporter == "torchscript":
            torch.onnx.export(module, (x,), str(path), dynamo=False, opset_version=opset,
                              input_names=["x"], output_names=["y"])
        else:
            # (the plain call, told the opset: docs/export.md, the opset of a plain export)
            with fakequant.onnx.export_options(opset_version=opset):
                torch.onnx.export(module, (x,), str(path), dynamo=True, opset_version=opset,
                                  input_names=["x"], output_names=["y"], verbose=False)
    proto = onnx.load(str(path))
    onnx.checker.check_model(proto, full_check=True)
    return proto, [w for w in caught if issubclass(w.category, ExportWarning)]


def _attr(node, name):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return None


PARAMS = [(name, exporter, opset) for name, (_, min_opset, exporters, _) in CASES.items()
          for exporter in exporters for opset in sorted({min_opset, 21 if exporter == "dynamo" else 20})
          if opset >= min_opset]


@pytest.mark.parametrize("name,exporter,opset", PARAMS)
def test_onnxruntime_equals_pytorch(tmp_path, name, exporter, opset):
    make, _, _, kind = CASES[name]
    module = make().eval()
    proto, caught = export(module, exporter, opset, tmp_path / "m.onnx")
    # the default session: single quantizers, nothing for its int8 kernels (conftest.ort_session)
    session = ort_session(tmp_path / "m.onnx", "default")
    for n, x in enumerate(inputs()):
        with torch.no_grad():
            expected = module(x)
        got = torch.from_numpy(session.run(None, {"x": x.numpy()})[0])
        bad = (got != expected) | (got.signbit() != expected.signbit())  # the sign of zero too
        assert not bad.any(), (f"{name}, input {n}: {int(bad.sum())} differences, e.g. x={x[bad][:4]} "
                               f"onnxruntime={got[bad][:4]} pytorch={expected[bad][:4]}")
    types = [node.op_type for node in proto.graph.node]
    if kind == "fp8":
        q = next(node for node in proto.graph.node if node.op_type == "QuantizeLinear")
        assert "DequantizeLinear" in types
        # the zero point's type names the float8 format
        assert any(t == onnx.TensorProto.FLOAT8E5M2 if "e5m2" in name else t == onnx.TensorProto.FLOAT8E4M3FN
                   for t in _tensor_types(proto, q.input[2]))
    elif kind == "block":
        q = next(node for node in proto.graph.node if node.op_type == "QuantizeLinear")
        assert _attr(q, "block_size") in (8, 16, 32, L)
        if name.startswith("dynamic"):
            assert "ReduceMax" in types and any("dynamic" in str(w.message) for w in caught)
    elif kind == "arithmetic":
        assert "QuantizeLinear" not in types and "Round" in types
        assert any("Div/round/Mul" in str(w.message) for w in caught)
    else:
        assert "QuantizeLinear" in types and "DequantizeLinear" in types


def _tensor_types(proto, name):
    """The element types ``name`` may have: an initializer's, a Constant's, or the target of a Cast."""
    for t in proto.graph.initializer:
        if t.name == name:
            yield t.data_type
    for node in proto.graph.node:
        if name in node.output:
            if node.op_type == "Constant":
                yield node.attribute[0].t.data_type
            if node.op_type == "Cast":
                yield _attr(node, "to")


def test_fp8_below_opset_19_is_a_clear_error(tmp_path):
    with pytest.raises(Exception, match="opset_version >= 19"):
        export(quantizer(2.0, num_bits=(4, 3)).eval(), "torchscript", 17, tmp_path / "m.onnx")


def test_blockwise_below_opset_21_is_a_clear_error(tmp_path):
    with pytest.raises(Exception, match="opset_version >= 21"):
        export(quantizer(block_sizes={-1: 16, "type": "dynamic"}).eval(), "dynamo", 20, tmp_path / "m.onnx")


def test_nan_blocks_are_the_named_gap(tmp_path):
    """A block holding NaN: the operator gives NaN for the whole block (its amax is NaN);
    ONNX Runtime's ReduceMax skips NaN, so the other elements of that block differ."""
    module = quantizer(block_sizes={-1: 16, "type": "dynamic"}).eval()
    export(module, "dynamo", 21, tmp_path / "m.onnx")
    session = ort_session(tmp_path / "m.onnx", "default")
    x = inputs()[0].clone()
    x[0, 0, 3] = float("nan")
    with torch.no_grad():
        expected = module(x)
    got = torch.from_numpy(session.run(None, {"x": x.numpy()})[0])
    assert expected[0, 0, :16].isnan().all()
    assert bits_equal(got[:, 1:], expected[:, 1:]) and bits_equal(got[1:], expected[1:])
