"""The models of the plain ``torch.onnx.export`` tests (tests/test_onnx_plain.py): one
entry per format the export covers, each a module whose outputs are what its quantizers
compute (so ONNX Runtime is compared with PyTorch per quantizer), with the opsets each
format allows. The quantizer cases come from the single-quantizer tests
(test_onnx_qdq.py's Zoo, test_onnx_fp8_block.py's CASES) and the operator cases from the
op table (tests/op_table.py); the model cases are whole
quantized models (torch.ao QAT modules, transformers presets), compared with ONNX Runtime
through the graph of ``fakequant.onnx.export``.

Importing this module calls no ``fakequant.onnx`` function (the worker process relies on
it): the factories only build modules.
"""
import dataclasses
from typing import Callable, Dict, List, Tuple

import torch

import fakequant
import fakequant.ao
import op_table
import test_onnx_fp8_block as fp8_block
import test_onnx_qdq as qdq
from fakequant.nn import TensorQuantizer
from fakequant.tensor_quant import QuantDescriptor

OPSETS = (13, 17, 19, 21)


@dataclasses.dataclass
class Case:
    make: Callable[[], torch.nn.Module]
    inputs: Callable[[], List[torch.Tensor]]  # the first one is the export's example
    min_opset: int = 13
    exporters: Tuple[str, ...] = ("dynamo", "torchscript")
    # "quantizers": every output is a quantizer's, compared with PyTorch bit for bit;
    # "model": whole-model outputs (float layers between the quantizers)
    kind: str = "quantizers"
    slow: bool = False
    dynamic_batch: bool = True
    # A zero point other than 0 at opset 21: ONNX Runtime 1.31-1.32's default optimizations
    # refuse the graph (docs/export.md); its basic ones run it.
    asymmetric: bool = False

    def opsets(self, exporter: str) -> List[int]:
        # The TorchScript exporter writes no block-wise QuantizeLinear (opset 21 types).
        top = 20 if exporter == "torchscript" else 21
        if self.kind == "model":  # whole models: the lowest opset and the highest
            return sorted({self.min_opset, top})
        return [o for o in OPSETS if self.min_opset <= o <= top] or [top]


class Outputs(torch.nn.Module):
    """The outputs of several modules on one input, as a tuple."""

    def __init__(self, *modules: torch.nn.Module) -> None:
        super().__init__()
        self.branches = torch.nn.ModuleList(modules)

    def forward(self, x):
        return tuple(m(x) for m in self.branches)


def _bits():
    qs = []
    for bits in (2, 5, 12, 16):
        for unsigned in (False, True):
            q = TensorQuantizer(QuantDescriptor(num_bits=bits, unsigned=unsigned, narrow_range=not unsigned))
            q.amax = torch.tensor(2.5)
            qs.append(q)
        pc = TensorQuantizer(QuantDescriptor(num_bits=bits, axis=1))
        pc.amax = qdq.PC_AMAX.reshape(1, qdq.C, 1)
        qs.append(pc)
    return Outputs(*qs)


def _pact(amax=3.0):
    """A learned range: pytorch-quantization's learn_amax (PACT-style clipping, LSQ-like
    gradient of the amax)."""
    return TensorQuantizer(QuantDescriptor(num_bits=8, learn_amax=True, amax=amax))


def _ao_qat(fused: bool):
    """torch.ao eager QAT after prepare_qat and a few steps, with fakequant's modules: the
    fused observer (x86's default QAT qconfig) or FakeQuantize with its observer."""
    import torch.ao.quantization as tq

    def make():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Conv1d(4, 6, 3), torch.nn.ReLU(), torch.nn.Conv1d(6, 4, 1))
        qconfig = tq.get_default_qat_qconfig("x86") if fused else tq.QConfig(
            activation=tq.FakeQuantize.with_args(observer=tq.MovingAverageMinMaxObserver, quant_min=0, quant_max=255),
            weight=tq.default_per_channel_weight_fake_quant)
        model.qconfig = fakequant.ao.use_fakequant(qconfig)
        tq.prepare_qat(model, inplace=True)
        g = torch.Generator().manual_seed(5)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        for _ in range(3):
            model(torch.randn(2, 4, 24, generator=g) * 3).square().mean().backward()
            optimizer.step()
        # (an exported graph never observes: PyTorch computes the same with the observers off)
        model.apply(tq.disable_observer)
        return model
    return make


class _FbFakeQuant(torch.nn.Module):
    """pytorch-quantization's export switch around the model: TensorQuantizer.use_fb_fake_quant."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x):
        TensorQuantizer.use_fb_fake_quant = True
        try:
            return self.model(x)
        finally:
            TensorQuantizer.use_fb_fake_quant = False


def _pytorch_quantization_flow(fb_fake_quant: bool):
    """pytorch-quantization's README flow: quant_modules.initialize(), build the model from
    torch.nn, calibrate, fine-tune (QAT), export."""
    def make():
        from fakequant import quant_modules

        quant_modules.initialize()
        try:
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Conv1d(4, 8, 3, padding=1), torch.nn.ReLU(),
                                        torch.nn.Conv1d(8, 4, 1), torch.nn.Flatten(), torch.nn.Linear(4 * 24, 10))
        finally:
            quant_modules.deactivate()
        batches = _ao_inputs()
        fakequant.calibrate(model, batches, progress=False)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        for x in batches:
            model(x).square().mean().backward()
            optimizer.step()
        return _FbFakeQuant(model) if fb_fake_quant else model
    return make


def _llama(preset: str, quantize_attention: bool):
    def make():
        import transformers

        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
            hidden_size=64, intermediate_size=96, num_hidden_layers=1, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=64, max_position_embeddings=32, bos_token_id=0, eos_token_id=0,
            pad_token_id=0)).eval()
        model.config.use_cache = False
        model = fakequant.quantize_model(model, preset=preset, quantize_attention=quantize_attention)
        fakequant.calibrate(model, [{"input_ids": ids} for ids in _ids()[:2]], progress=False)
        return _Logits(model)
    return make


class _Logits(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids, use_cache=False).logits


def _ids():
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, 64, (2, 8), generator=g) for _ in range(3)]


def _qdq_inputs():
    return qdq.inputs("float32")


def _ao_inputs():
    g = torch.Generator().manual_seed(6)
    return [torch.randn(2, 4, 24, generator=g) * 3 for _ in range(3)]


CASES: Dict[str, Case] = {
    # int 3..8 bits per tensor and per channel, unsigned, narrow, affine, min/max, quantize_amax
    "qdq_zoo": Case(qdq.Zoo, _qdq_inputs),
    "int_2_5_12_16_bits": Case(_bits, _qdq_inputs),
    "learned_amax": Case(lambda: Outputs(_pact()), _qdq_inputs),
    # two learned ranges on one tensor (the dynamo exporter's optimizer once lost their bounds)
    "two_learned_amax": Case(lambda: Outputs(_pact(), _pact(2.0)), _qdq_inputs),
    "ao_prepare_qat_fused": Case(_ao_qat(True), _ao_inputs, kind="model"),
    "ao_prepare_qat_fake_quantize": Case(_ao_qat(False), _ao_inputs, kind="model"),
    "pytorch_quantization_flow": Case(_pytorch_quantization_flow(False), _ao_inputs, kind="model"),
    "pytorch_quantization_flow_fb": Case(_pytorch_quantization_flow(True), _ao_inputs, kind="model"),
}
# the operators' own cases (the op table's; those on test_onnx_fp8_block's inputs come with its CASES)
for _name, _case in op_table.onnx_cases("qdq").items():
    CASES[_name] = Case(_case.make, _qdq_inputs, _case.min_opset, _case.exporters)
for _name, (_make, _min_opset, _exporters, _) in fp8_block.CASES.items():
    CASES[_name] = Case(_make, fp8_block.inputs, _min_opset, tuple(_exporters), dynamic_batch=False)
_FAST_PRESETS = {("W8A8", True), ("NVFP4", False)}
for _preset in sorted(p for p in fakequant.models.presets.PRESETS if not p.startswith("GGUF_")):  # (no ONNX form: GGUF)
    for _attention in (False, True):
        if _attention and fakequant.models.presets.PRESETS[_preset].input is None:
            continue  # a weight-only preset has no input descriptor for the attention inputs
        CASES[f"llama_{_preset}{'_attention' if _attention else ''}"] = Case(
            _llama(_preset, _attention), _ids, {"INT8": 13, "FP8": 19}.get(_preset, 21), ("dynamo",), kind="model", slow=(_preset, _attention) not in _FAST_PRESETS, dynamic_batch=False)
