"""transformers' fused MoE experts (Qwen3-MoE, Mixtral, gpt-oss: 3-D expert parameters)
under quantize_model: every expert quantized as a Linear of its shape would be, per-expert
input quantizers, the rule for experts calibration never reached, the warning for weights
left in float, and torch.compile(fullgraph=True) of the quantized MoE block."""
import warnings

import pytest
import torch

import fakequant
from fakequant import quant_modules
from fakequant.models import experts, presets
from fakequant.nn import QuantizerList, TensorQuantizer
from fakequant.tensor_quant import QuantDescriptor

from conftest import bits_equal, ort_session

transformers = pytest.importorskip("transformers")

EXPERTS = 4


def _qwen3_moe():
    return transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=EXPERTS, num_experts_per_tok=2,
        max_position_embeddings=64))


def _mixtral():
    return transformers.MixtralForCausalLM(transformers.MixtralConfig(
        vocab_size=128, hidden_size=64, intermediate_size=32, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, num_local_experts=EXPERTS, num_experts_per_tok=2, max_position_embeddings=64))


def _gpt_oss():
    return transformers.GptOssForCausalLM(transformers.GptOssConfig(
        vocab_size=128, hidden_size=64, intermediate_size=32, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, num_local_experts=EXPERTS, num_experts_per_tok=2,
        max_position_embeddings=64, layer_types=["full_attention"]))


MODELS = {"qwen3_moe": _qwen3_moe, "mixtral": _mixtral, "gpt_oss": _gpt_oss}


def _tokens(seed=0):
    return torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(seed))


def _quantized(arch, preset):
    torch.manual_seed(0)
    model = MODELS[arch]().eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing left in float: no warning
        fakequant.quantize_model(model, preset=preset)
    fakequant.calibrate(model, [_tokens()], progress=False)
    return model


def _experts_of(model):
    return [m for m in model.modules() if experts.is_fused_experts(m)]


def _as_linear(desc, w):
    """``w`` (out, in) fake-quantized by a fresh quantizer of ``desc``, calibrated on it
    (what an nn.Linear of that weight gets)."""
    q = TensorQuantizer(QuantDescriptor(**desc))
    if not q._dynamic:
        q.enable_calib()
        q.disable_quant()
        q(w)
        q.load_calib_amax()
        q.disable_calib()
        q.enable_quant()
    return q(w)


@pytest.mark.parametrize("preset", sorted(presets.PRESETS))
@pytest.mark.parametrize("arch", sorted(MODELS))
def test_every_expert_is_quantized_as_a_linear_of_its_shape(arch, preset):
    model = _quantized(arch, preset)
    (module,) = _experts_of(model)
    assert model.config._experts_implementation == experts.EXPERTS_IMPLEMENTATION
    for proj in experts.expert_projections(module):
        w = getattr(module, proj).detach()
        if module.is_transposed:
            w = w.transpose(1, 2)
        with torch.no_grad():
            quantized = experts.quantized_weight(module, proj)
        for e in range(EXPERTS):
            assert bits_equal(quantized[e], _as_linear(presets.get(preset).weight, w[e])), (proj, e)
        inputs = getattr(module, f"{proj}_input_quantizer", None)
        if presets.get(preset).input is None:  # a weight-only recipe
            assert inputs is None
        else:
            assert isinstance(inputs, QuantizerList) and len(inputs) == EXPERTS
    assert quant_modules.unconverted(model, usually_quantized=True) == []
    # backward: every expert weight gets a finite gradient through its quantizers
    model.train()
    model(_tokens(1)).logits.float().pow(2).mean().backward()
    for proj in experts.expert_projections(module):
        g = getattr(module, proj).grad
        assert g is not None and bool(g.isfinite().all()) and bool((g != 0).any()), proj


@pytest.mark.parametrize("arch", sorted(MODELS))
def test_the_expert_quantizers_are_in_the_path_forward_and_backward(arch):
    model = _quantized(arch, "INT8")
    (module,) = _experts_of(model)
    ids = _tokens(1)
    model.train()
    logits = model(ids).logits
    logits.float().pow(2).mean().backward()
    for proj in experts.expert_projections(module):
        g = getattr(module, proj).grad
        assert g is not None and bool(g.isfinite().all()) and bool((g != 0).any())
    model.eval()
    with torch.no_grad():
        base = model(ids).logits
        for proj in experts.expert_projections(module):
            for role in ("weight", "input"):
                holder = getattr(module, f"{proj}_{role}_quantizer")
                for q in holder.modules():
                    if isinstance(q, TensorQuantizer):
                        q.disable()
                assert not torch.equal(model(ids).logits, base), (proj, role)
                for q in holder.modules():
                    if isinstance(q, TensorQuantizer):
                        q.enable()
        assert torch.equal(model(ids).logits, base)


def test_an_expert_no_calibration_token_reached_takes_the_largest_amax_of_the_others():
    torch.manual_seed(0)
    model = _qwen3_moe().eval()
    fakequant.quantize_model(model, preset="INT8")
    (module,) = _experts_of(model)
    hidden = torch.randn(32, 64)
    # tokens routed to experts 0 and 1 only (2 and 3 never see one)
    index = torch.stack([torch.arange(32) % 2] * 2, 1)  # even tokens to expert 0, odd to 1
    weights = torch.full((32, 2), 0.5)
    with pytest.warns(UserWarning, match=r"2 of the 4 quantizers of 'gate_up_proj_input_quantizer' \(experts \[2, 3\]\)"):
        fakequant.calibrate(module, [(hidden, index, weights)], progress=False, forward_fn=lambda m, b: m(*b),
                            strict=True)
    for proj in experts.expert_projections(module):
        inputs = getattr(module, f"{proj}_input_quantizer")
        seen = torch.stack([inputs[0].amax, inputs[1].amax])
        for e in (2, 3):
            assert bits_equal(inputs[e].amax, seen.amax(0))
    # expert 0's own range: the largest |x| of the tokens routed to it
    assert bits_equal(module.gate_up_proj_input_quantizer[0].amax, hidden[::2].abs().amax())
    # a token routed to expert 3 now runs quantized on that range
    with torch.no_grad():
        out = module(hidden[:4], torch.full((4, 2), 3), weights[:4])
    assert bool(out.isfinite().all())


class _Fused(torch.nn.Module):
    """A layer holding 3-D weights fakequant does not know."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(4, 8, 8))

    def forward(self, x):
        return torch.einsum("eoi,bi->bo", self.weight, x)


def test_weights_left_in_float_are_named_once_and_unconverted_separates_them():
    model = torch.nn.Sequential(torch.nn.Embedding(10, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 8), _Fused())
    with pytest.warns(UserWarning, match=r"left 1 layer\(s\) with weights in float.*3 \(_Fused\)") as caught:
        fakequant.quantize_model(model, preset="W8A8")
    assert sum("left" in str(w.message) for w in caught) == 1
    assert quant_modules.unconverted(model, usually_quantized=True) == [("3", "_Fused")]
    assert quant_modules.unconverted(model, usually_quantized=False) == [("0", "Embedding"), ("1", "LayerNorm")]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # left in float on purpose: no warning
        fakequant.quantize_model(torch.nn.Sequential(torch.nn.Linear(8, 8), _Fused()), preset="W8A8", exclude=["1"])
    with pytest.raises(TypeError, match="usually_quantized"):
        quant_modules.unconverted(model, usually_quantized="yes")
    # a MoE model: routers stay float by default, unnamed; experts are quantized
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        moe = fakequant.quantize_model(_gpt_oss(), preset="W8A8")
    routers = [name for name, _ in quant_modules.unconverted(moe, usually_quantized=False) if "router" in name]
    assert routers == ["model.layers.0.mlp.router"]


@pytest.mark.parametrize("arch,preset", [("qwen3_moe", "INT8"), ("mixtral", "W8A8"), ("gpt_oss", "NVFP4"),
                                         ("qwen3_moe", "MXFP4"), ("gpt_oss", "FP8")])
def test_the_quantized_moe_block_compiles_with_fullgraph(arch, preset):
    """Compiled, the routed tokens are grouped by expert (one grouped matmul a projection):
    the eager loop's values and gradients, summed in another order."""
    model = _quantized(arch, preset)
    block = model.model.layers[0].mlp
    x = torch.randn(2, 8, 64, generator=torch.Generator().manual_seed(1))
    weights = [p for p in block.parameters() if p.requires_grad]

    def run(fn):
        xi = x.clone().requires_grad_(True)
        out = fn(xi)
        out = out[0] if isinstance(out, tuple) else out  # (gpt-oss's block returns the router scores too)
        grads = torch.autograd.grad((out * out).sum(), [xi, *weights])
        return out.detach(), grads

    eager, eager_grads = run(block)
    torch._dynamo.reset()
    compiled, compiled_grads = run(torch.compile(block, backend="aot_eager", fullgraph=True))
    torch._dynamo.reset()
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-6)
    for got, want in zip(compiled_grads, eager_grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_compiled_experts_compute_the_routed_tokens_only():
    """The compiled graph holds one grouped matmul per projection, not one matmul per
    expert (the dense form the exporters get)."""
    model = _quantized("qwen3_moe", "INT8")
    block = model.model.layers[0].mlp
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(block, backend=backend, fullgraph=True)(torch.randn(2, 8, 64))
    torch._dynamo.reset()
    code = graphs[0].code
    # two grouped matmuls (the experts' projections) and one linear (the router)
    assert code.count("experts_linear") == 2 and code.replace("experts_linear", "").count("linear(") == 1


ROW_WISE = {"W8A8", "W8A8_ASYM", "W4A8", "FP8_PER_CHANNEL", "MXFP8", "MXFP4", "GGUF_Q8_0", "GGUF_Q4_0"}


@pytest.mark.parametrize("preset", sorted(p for p in presets.PRESETS if presets.PRESETS[p].input is not None))
def test_alike_row_wise_input_quantizers_quantize_every_experts_rows_in_one_call(preset):
    """QuantizerList.shared: for per-token and block inputs whose scales read no amax, one
    member gives every member's output, bit for bit (the grouped forward then makes one call
    a projection); calibrated (INT8, FP8) and E4M3-scaled (NVFP4) inputs are per expert."""
    model = _quantized("qwen3_moe", preset)
    inputs = _experts_of(model)[0].gate_up_proj_input_quantizer
    shared = inputs.shared()
    assert (shared is not None) == (preset in ROW_WISE)
    if shared is None:
        return
    x = torch.randn(12, 64, generator=torch.Generator().manual_seed(2)) * 3
    for q in inputs:
        assert bits_equal(shared(x), q(x))
    inputs[1].disable()  # a member unlike the others
    assert inputs.shared() is None
    inputs[1].enable()
    inputs[2].pre_quant_scale = torch.full((64,), 0.5)  # a member with a state of its own
    assert inputs.shared() is None


def _segments_reference(x, weight, counts):
    out, start = torch.zeros(x.shape[0], weight.shape[1], dtype=x.dtype), 0
    for e, n in enumerate(counts.tolist()):
        out[start:start + n] = x[start:start + n] @ weight[e].T
        start += n
    return out


@pytest.mark.parametrize("counts", [[3, 0, 2, 1], [0, 0, 0, 6], [2, 1, 0, 0]])  # (last: 3 trailing rows)
def test_experts_linear_against_the_per_expert_matmul(counts):
    from fakequant.models._experts_linear import experts_linear
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 5, dtype=torch.float64, generator=g, requires_grad=True)
    weight = torch.randn(4, 3, 5, dtype=torch.float64, generator=g, requires_grad=True)
    counts = torch.tensor(counts)
    got = experts_linear(x, weight, counts)
    assert bits_equal(got, _segments_reference(x.detach(), weight.detach(), counts))
    torch.autograd.gradcheck(lambda a, b: experts_linear(a, b, counts), (x, weight))
    torch.library.opcheck(torch.ops.fakequant_moe.experts_linear.default, (x, weight, counts))
    grad = torch.randn(6, 3, dtype=torch.float64, generator=g)
    torch.library.opcheck(torch.ops.fakequant_moe.experts_linear_weight_grad.default, (grad, x.detach(), counts))
    with pytest.raises(ValueError, match="counts"):
        experts_linear(x, weight, torch.tensor([7, 0, 0, 0]))
    with pytest.raises(ValueError, match="weight"):
        experts_linear(x, weight[:, :, :4], counts)


def test_a_quantized_moe_model_exports_to_onnx_and_runs_in_onnxruntime(tmp_path):
    pytest.importorskip("onnxruntime")
    model = _quantized("qwen3_moe", "INT8")

    class Logits(torch.nn.Module):
        def __init__(self, lm):
            super().__init__()
            self.lm = lm

        def forward(self, ids):
            return self.lm(ids, use_cache=False).logits

    ids = _tokens(3)
    with torch.no_grad():
        expected = model(ids).logits
    path = tmp_path / "moe.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (torch's own exporter warnings)
        fakequant.onnx.export(Logits(model), (ids,), str(path))
    # The exported graph, and ONNX Runtime's int8 kernels with signed activations (exact sums on
    # every CPU; conftest.ort_session): the exported experts run every token through every
    # expert, weighted (summed in another order), so both are PyTorch's numbers up to float rounding.
    for kind in ("graph", "int8"):
        session = ort_session(path, kind)
        (got,) = session.run(None, {session.get_inputs()[0].name: ids.numpy()})
        torch.testing.assert_close(torch.from_numpy(got), expected, rtol=1e-5, atol=1e-5,
                                   msg=lambda m, kind=kind: f"{kind} session: {m}")


def test_the_serving_export_refuses_gpt_oss_experts_before_writing(tmp_path):
    # Qwen3-MoE and Mixtral experts are written per expert (tests/test_serve_moe.py); gpt-oss
    # checkpoints keep their experts in a format of their own
    pytest.importorskip("compressed_tensors", reason="the serve extra")
    model = _quantized("gpt_oss", "FP8")
    with pytest.raises(ValueError, match=r"model\.layers\.0\.mlp\.experts: quantized experts of a 'gpt_oss' model"):
        fakequant.export_checkpoint(model, tmp_path / "ckpt")
    assert not (tmp_path / "ckpt").exists()
