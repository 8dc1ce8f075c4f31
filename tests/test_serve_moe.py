"""compressed-tensors checkpoints of MoE models (fakequant.export_checkpoint): the fused experts
of Qwen3-MoE and Mixtral written per expert in their hub layout, reloaded by transformers +
compressed-tensors (dequantized load, which stacks them into the fused experts again): every
expert weight equals fakequant's fake-quantized expert weight bit for bit, and so does every
quantized Linear; the logits equal those of the fakequant model with its input quantizers
disabled (the dequantized load has none), bit for bit in float32, with transformers' eager
experts forward. What transformers cannot load for experts is
refused before anything is written (docs/serving.md)."""
import json
import os
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is missing: pip install 'fakequant[serve]'")
pytest.importorskip("compressed_tensors", reason="compressed-tensors is missing: pip install 'fakequant[serve]'")

import fakequant  # noqa: E402
from fakequant.models import experts  # noqa: E402
from fakequant import nn as quant_nn  # noqa: E402
from fakequant.tensor_quant import QuantDescriptor  # noqa: E402
from safetensors import safe_open  # noqa: E402
from transformers import AutoModelForCausalLM, CompressedTensorsConfig  # noqa: E402
from conftest import bits_equal  # noqa: E402

VOCAB = 128
EXPERTS = 4


# the small configurations of tests/test_moe.py; W4A16's groups of 128 need 128 input features
def _qwen3_moe(width=64):
    return transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(
        vocab_size=VOCAB, hidden_size=width, intermediate_size=128, moe_intermediate_size=width // 2 * (width // 64),
        num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=width // 4,
        num_experts=EXPERTS, num_experts_per_tok=2, max_position_embeddings=64))


def _mixtral(width=64):
    return transformers.MixtralForCausalLM(transformers.MixtralConfig(
        vocab_size=VOCAB, hidden_size=width, intermediate_size=width // 2 * (width // 64), num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, num_local_experts=EXPERTS, num_experts_per_tok=2,
        max_position_embeddings=64))


MODELS = {"qwen3_moe": _qwen3_moe, "mixtral": _mixtral}
# the checkpoint's names of an expert's projections (gate, up, down) and of the MoE block
LAYOUT = {"qwen3_moe": ("mlp", ("gate_proj", "up_proj", "down_proj")),
          "mixtral": ("block_sparse_moe", ("w1", "w3", "w2"))}
# preset -> (model dtype, storage format): compressed-tensors decompresses MXFP4 weights to bfloat16
EXPORTED = {"FP8": (torch.float32, "float-quantized"), "FP8_PER_CHANNEL": (torch.float32, "float-quantized"),
            "W4A16": (torch.float32, "pack-quantized"), "MXFP4": (torch.bfloat16, "mxfp4-pack-quantized")}


def _tokens(seed=0):
    return torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(seed))


def _quantized(arch, preset, dtype=torch.float32, **kwargs):
    torch.manual_seed(0)
    model = MODELS[arch](128 if preset == "W4A16" else 64).to(dtype).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (a weight-only preset's disabled input quantizers collect nothing)
        fakequant.quantize_model(model, preset=preset, **kwargs)
        fakequant.calibrate(model, [_tokens()], progress=False)
    return model


def _load(directory):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return AutoModelForCausalLM.from_pretrained(
            directory, quantization_config=CompressedTensorsConfig(dequantize=True))


def _check(model, directory, linears):
    """Every expert weight and quantized Linear weight of the dequantized load bit for bit; logits
    of the model with its input quantizers disabled (float32: bit for bit). Returns the loaded model."""
    dense = _load(directory)
    checked = 0
    for name, module in model.named_modules():
        if experts.is_fused_experts(module):
            for proj in experts.expert_projections(module):
                with torch.no_grad():
                    fake = experts.quantized_weight(module, proj)
                loaded = getattr(dense.get_submodule(name), proj)
                assert loaded.dtype == fake.dtype and bits_equal(loaded, fake), (name, proj)
                checked += 1
        elif isinstance(module, quant_nn.QuantLinear) and module.weight_quantizer.is_enabled:
            with torch.no_grad():
                fake = module.weight_quantizer(module.weight)
            assert bits_equal(dense.get_submodule(name).weight, fake), name
            linears -= 1
    assert checked == 2 and linears == 0
    for name, q in model.named_modules():  # the dequantized load quantizes no input
        if isinstance(q, quant_nn.TensorQuantizer) and "input_quantizer" in name:
            q.disable()
    ids = _tokens(1)
    dense.set_experts_implementation("eager")  # (the loop fakequant's experts forward runs)
    with torch.no_grad():
        ours, theirs = model(input_ids=ids).logits, dense(input_ids=ids).logits
    if ours.dtype == torch.float32:
        assert bits_equal(theirs, ours)
    else:  # bfloat16 (MXFP4): a bfloat16 rounding apart here and there
        torch.testing.assert_close(theirs, ours, rtol=0, atol=1e-2)
    return dense


@pytest.mark.parametrize("preset", sorted(EXPORTED))
@pytest.mark.parametrize("arch", sorted(MODELS))
def test_experts_reload_bit_for_bit(tmp_path, arch, preset):
    dtype, fmt = EXPORTED[preset]
    model = _quantized(arch, preset, dtype)
    config = fakequant.export_checkpoint(model, tmp_path)
    block, names = LAYOUT[arch]
    assert config["format"] == fmt and [g["targets"] for g in config["config_groups"].values()] == [["Linear"]]
    assert config["ignore"] == ["lm_head", f"model.layers.0.{block}.gate"]  # the router stays float
    with safe_open(os.fspath(tmp_path / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    for e in range(EXPERTS):
        for name in names:
            stored = "weight" if fmt == "float-quantized" else "weight_packed"
            assert f"model.layers.0.{block}.experts.{e}.{name}.{stored}" in keys
    assert not any("gate_up_proj" in k or k.endswith("experts.down_proj") for k in keys)
    _check(model, tmp_path, linears=4)


@pytest.mark.parametrize("arch", sorted(MODELS))
def test_static_input_scales_per_expert(tmp_path, arch):
    # FP8: each expert's input quantizer of gate_up_proj gives the input_scale of its gate and up
    # projections (one input, one quantizer), that of down_proj its down projection's
    model = _quantized(arch, "FP8")
    fakequant.export_checkpoint(model, tmp_path)
    (module,) = [m for m in model.modules() if experts.is_fused_experts(m)]
    block, (gate, up, down) = LAYOUT[arch]
    prefix = f"model.layers.0.{block}.experts"
    with safe_open(os.fspath(tmp_path / "model.safetensors"), "pt") as f:
        for e in range(EXPERTS):
            first = module.gate_up_proj_input_quantizer[e].amax.float().reshape(1) / 448
            second = module.down_proj_input_quantizer[e].amax.float().reshape(1) / 448
            assert torch.equal(f.get_tensor(f"{prefix}.{e}.{gate}.input_scale"), first)
            assert torch.equal(f.get_tensor(f"{prefix}.{e}.{up}.input_scale"), first)
            assert torch.equal(f.get_tensor(f"{prefix}.{e}.{down}.input_scale"), second)
        # a per-tensor weight scale is per expert: gate and up share their expert's
        scales = [f.get_tensor(f"{prefix}.{e}.{gate}.weight_scale") for e in range(EXPERTS)]
        assert all(torch.equal(f.get_tensor(f"{prefix}.{e}.{up}.weight_scale"), scales[e]) for e in range(EXPERTS))
        assert len({s.item() for s in scales}) == EXPERTS


def test_experts_in_a_group_of_their_own(tmp_path):
    # two schemes: the experts' group names them by one `re:` target (transformers' experts group),
    # the other Linear layers by their full names
    model = _quantized("qwen3_moe", "FP8_PER_CHANNEL")
    q = model.model.layers[0].self_attn.q_proj
    q._weight_quantizer = quant_nn.TensorQuantizer(QuantDescriptor(num_bits=(4, 3)))  # per tensor, dynamic
    config = fakequant.export_checkpoint(model, tmp_path)
    targets = sorted(t for g in config["config_groups"].values() for t in g["targets"])
    assert targets == ["model.layers.0.self_attn.k_proj", "model.layers.0.self_attn.o_proj",
                       "model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.v_proj",
                       r"re:^model\.layers\.0\.mlp\.experts\.\d+\.(down_proj|gate_proj|up_proj)$"]
    _check(model, tmp_path, linears=4)


def test_experts_alone(tmp_path):
    # attention left in float: listed in ignore, the experts are the one quantized group
    model = _quantized("mixtral", "FP8_PER_CHANNEL", exclude=["*lm_head*", "*self_attn*"])
    config = fakequant.export_checkpoint(model, tmp_path)
    assert config["ignore"] == ["lm_head", "model.layers.0.block_sparse_moe.gate"] + [
        f"model.layers.0.self_attn.{p}_proj" for p in "koqv"]
    dense = _check(model, tmp_path, linears=0)
    assert torch.equal(dense.model.layers[0].self_attn.q_proj.weight, model.model.layers[0].self_attn.q_proj.weight)


def _assert_refused(model, directory, match):
    with pytest.raises(ValueError, match=match):
        fakequant.export_checkpoint(model, directory)
    assert not os.path.exists(directory)  # refused before anything was written


@pytest.mark.parametrize("preset", ["INT8", "W8A8", "W4A8"])
def test_integer_experts_are_refused(tmp_path, preset):
    # transformers dequantizes packed integer experts only (W4A16's); int-quantized ones it drops
    model = _quantized("mixtral", preset)
    _assert_refused(model, tmp_path / "a", r"model\.layers\.0\.mlp\.experts: experts stored as 'int-quantized'")


def test_mx_and_nvfp4_experts_are_refused(tmp_path):
    model = _quantized("qwen3_moe", "MXFP8", torch.bfloat16)  # uint8 exponents read as float scales
    _assert_refused(model, tmp_path / "a", r"model\.layers\.0\.mlp\.experts: experts stored as 'mxfp8-quantized'")
    model = _quantized("qwen3_moe", "NVFP4", torch.bfloat16)  # no weight_global_scale for experts
    _assert_refused(model, tmp_path / "b", r"experts\.gate_up_proj_weight_quantizer: expert weights with a global "
                                           r"scale per expert \(NVFP4\)")


def test_experts_of_another_model_type_are_refused(tmp_path):
    model = _quantized("qwen3_moe", "FP8")
    model.config.model_type = "olmoe"  # same modules, a layout the export does not know
    _assert_refused(model, tmp_path / "a", r"model\.layers\.0\.mlp\.experts: quantized experts of a 'olmoe' model")


def test_float_experts(tmp_path):
    # experts excluded: written by save_pretrained per expert, ignored by one pattern per module
    model = _quantized("qwen3_moe", "FP8", exclude=["*lm_head*", "*experts*"])
    config = fakequant.export_checkpoint(model, tmp_path / "a")
    assert config["ignore"] == ["lm_head", "model.layers.0.mlp.gate",
                                r"re:^model\.layers\.0\.mlp\.experts\.\d+\.(down_proj|gate_proj|up_proj)$"]
    dense = _load(tmp_path / "a")
    for proj in ("gate_up_proj", "down_proj"):
        assert torch.equal(getattr(dense.model.layers[0].mlp.experts, proj),
                           getattr(model.model.layers[0].mlp.experts, proj))
    # beside packed weights transformers would drop them (it reads every expert's weight_packed)
    model = _quantized("mixtral", "W4A16", exclude=["*lm_head*", "*experts*"])
    _assert_refused(model, tmp_path / "b", r"model\.layers\.0\.mlp\.experts: experts left in float beside "
                                           r"'pack-quantized' weights")
