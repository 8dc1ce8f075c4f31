"""compressed-tensors checkpoints (fakequant.export_checkpoint), checked by the consumer's
libraries: transformers + compressed-tensors load each export, and every quantized weight
they decompress equals fakequant's fake-quantized weight bit for bit; their logits (the
weights kept compressed, decompressed by compressed-tensors at the first forward) equal the
model's in eval mode bit for bit where the format's activation rule is fakequant's, and are
within the bound stated per preset otherwise (docs/serving.md)."""
import json
import os
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is missing: pip install 'fakequant[serve]'")
pytest.importorskip("compressed_tensors", reason="compressed-tensors is missing: pip install 'fakequant[serve]'")

import fakequant  # noqa: E402
from fakequant import nn as quant_nn  # noqa: E402
from fakequant.tensor_quant import QuantDescriptor  # noqa: E402
from transformers import AutoModelForCausalLM, CompressedTensorsConfig  # noqa: E402
from conftest import bits_equal  # noqa: E402

VOCAB = 128

# preset -> (model dtype, logits bound relative to the largest logit; 0: bit for bit, reason).
# The FP4 and MX formats run in bfloat16: compressed-tensors 0.20 decompresses their weights to
# bfloat16 (a float32 model fails in its forward, and NVFP4's float32 weights cannot be matched).
CASES = {
    "W8A8": (torch.float32, 0.02, "per-token int8 scale: compressed-tensors divides amax by 127.5, fakequant by 127"),
    "W4A8": (torch.float32, 0.02, "per-token int8 scale: compressed-tensors divides amax by 127.5, fakequant by 127"),
    "INT8": (torch.float32, 0.0, "same rule"),
    "W4A16": (torch.float32, 0.0, "weights only"),
    "FP8": (torch.float32, 0.0, "same rule"),
    "FP8_PER_CHANNEL": (torch.float32, 0.0, "same rule"),
    "NVFP4": (torch.bfloat16, 0.15, "activation block scales: compressed-tensors rounds global_scale * amax / 6 "
                                   "to E4M3 and divides by the global scale, in bfloat16; fakequant rounds "
                                   "amax / 6 / g to E4M3 and multiplies by g, in float32"),
    "MXFP8": (torch.bfloat16, 0.10, "activation block scales: compressed-tensors rounds the block max to the "
                                    "nearest power of two first, fakequant takes floor(log2(amax))"),
    "MXFP4": (torch.bfloat16, 0.35, "activation block scales: compressed-tensors rounds the block max to the "
                                    "nearest power of two first, fakequant takes floor(log2(amax))"),
}


def _llama(hidden=64):
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=64, bos_token_id=0, eos_token_id=0,
        pad_token_id=0))


def _qwen3():
    return transformers.Qwen3ForCausalLM(transformers.Qwen3Config(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, vocab_size=VOCAB, max_position_embeddings=64, tie_word_embeddings=True, attention_bias=True,
        bos_token_id=0,
        eos_token_id=0, pad_token_id=0))


def _quantized(make, preset, dtype, seed=0):
    torch.manual_seed(seed)
    model = make().to(dtype).eval()
    model = fakequant.quantize_model(model, preset=preset)
    data = [torch.randint(0, VOCAB, (2, 8)) for _ in range(2)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (a weight-only preset's disabled input quantizers collect nothing)
        fakequant.calibrate(model, data, progress=False, forward_fn=lambda m, ids: m(input_ids=ids))
    return model


def _load(directory, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return AutoModelForCausalLM.from_pretrained(directory, **kwargs)


def _check(model, directory, bound):
    """Weights (dequantized load) bit for bit; logits (compressed load) within bound."""
    dense = _load(directory, quantization_config=CompressedTensorsConfig(dequantize=True))
    checked = 0
    for name, module in model.named_modules():
        if isinstance(module, quant_nn.QuantLinear):
            with torch.no_grad():
                fake = module.weight_quantizer(module.weight)
            loaded = dense.get_submodule(name).weight
            assert loaded.dtype == fake.dtype and bits_equal(loaded, fake), name
            checked += 1
    assert checked == 14  # 2 layers x (q, k, v, o, gate, up, down)
    ids = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = model(input_ids=ids).logits
        theirs = _load(directory)(input_ids=ids).logits
    assert theirs.dtype == ours.dtype
    if bound == 0:
        assert bits_equal(theirs, ours)
    else:
        diff = (theirs.float() - ours.float()).abs().max() / ours.float().abs().max()
        assert diff <= bound, f"logits differ by {diff:.4f} of the largest, over the bound {bound}"
    return dense


@pytest.mark.parametrize("preset", sorted(CASES))
def test_llama_presets_reload_through_compressed_tensors(tmp_path, preset):
    dtype, bound, _ = CASES[preset]
    model = _quantized(lambda: _llama(128 if preset == "W4A16" else 64), preset, dtype)
    config = fakequant.export_checkpoint(model, tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())["quantization_config"]
    assert written["quant_method"] == "compressed-tensors" and config["format"] == written["format"]
    assert written["ignore"] == ["lm_head"]  # every Linear quantized or ignored by its full name
    _check(model, tmp_path, bound)


def test_qwen3_with_tied_embeddings_and_biases(tmp_path):
    model = _quantized(_qwen3, "FP8_PER_CHANNEL", torch.float32)
    fakequant.export_checkpoint(model, tmp_path / "a")
    dense = _check(model, tmp_path / "a", 0.0)
    assert dense.lm_head.weight is dense.model.embed_tokens.weight
    assert torch.equal(dense.model.embed_tokens.weight, model.model.embed_tokens.weight)
    assert torch.equal(dense.model.layers[1].self_attn.k_proj.bias, model.model.layers[1].self_attn.k_proj.bias)
    # a quantized lm_head tied to the embeddings cannot be written (one tensor for both)
    model = fakequant.quantize_model(_qwen3(), preset="FP8_PER_CHANNEL", exclude=[])
    _assert_refused(model, tmp_path / "b", r"lm_head\.weight_quantizer: its weight is shared with "
                                           r"model\.embed_tokens\.weight")


def test_mixed_schemes_and_excluded_layers(tmp_path):
    # layer 1's MLP stays in float (ignored by full name), and q_proj of layer 0 gets 4-bit
    # per-channel weights: two config groups that name their layers
    torch.manual_seed(0)
    model = fakequant.quantize_model(_llama().eval(), preset="INT8", exclude=["*lm_head*", "model.layers.1.mlp*"])
    q = model.model.layers[0].self_attn.q_proj
    q.weight_quantizer.num_bits = 4
    data = [torch.randint(0, VOCAB, (2, 8))]
    fakequant.calibrate(model, data, progress=False, forward_fn=lambda m, ids: m(input_ids=ids))
    config = fakequant.export_checkpoint(model, tmp_path)
    assert config["ignore"] == ["lm_head", "model.layers.1.mlp.down_proj", "model.layers.1.mlp.gate_proj",
                                "model.layers.1.mlp.up_proj"]
    targets = sorted(t for group in config["config_groups"].values() for t in group["targets"])
    assert "model.layers.0.self_attn.q_proj" in targets and "Linear" not in targets and len(targets) == 11
    dense = _load(tmp_path, quantization_config=CompressedTensorsConfig(dequantize=True))
    with torch.no_grad():
        assert bits_equal(dense.model.layers[0].self_attn.q_proj.weight, q.weight_quantizer(q.weight))
    assert bits_equal(dense.model.layers[1].mlp.up_proj.weight, model.model.layers[1].mlp.up_proj.weight)


def test_learned_weight_range(tmp_path):
    # a weight quantizer with learn_amax (its clip bounds trained): per-tensor scale max(-min, max) / 127
    torch.manual_seed(0)
    model = fakequant.quantize_model(_llama().eval(), preset="INT8")
    fakequant.calibrate(model, [torch.randint(0, VOCAB, (2, 8))], progress=False,
                        forward_fn=lambda m, ids: m(input_ids=ids))
    layer = model.model.layers[0].mlp.down_proj
    layer._weight_quantizer = quant_nn.TensorQuantizer(QuantDescriptor(num_bits=8, learn_amax=True, amax=0.05))
    with torch.no_grad():
        layer.weight_quantizer.clip.clip_value_max.fill_(0.04)  # as if trained: asymmetric bounds
    config = fakequant.export_checkpoint(model, tmp_path)
    assert len(config["config_groups"]) == 2  # per tensor for down_proj of layer 0, per channel elsewhere
    dense = _load(tmp_path, quantization_config=CompressedTensorsConfig(dequantize=True))
    with torch.no_grad():
        assert bits_equal(dense.model.layers[0].mlp.down_proj.weight, layer.weight_quantizer(layer.weight))


def _assert_refused(model, directory, match):
    with pytest.raises(ValueError, match=match):
        fakequant.export_checkpoint(model, directory)
    assert not os.path.exists(directory)  # refused before anything was written


def test_refuses_what_the_format_cannot_describe(tmp_path):
    torch.manual_seed(0)
    model = fakequant.quantize_model(_llama().eval(), preset="W8A8")
    model.model.layers[1].mlp.up_proj.input_quantizer.num_bits = 5
    model.model.layers[1].mlp.up_proj.input_quantizer.narrow_range = True
    _assert_refused(model, tmp_path / "a", r"model\.layers\.1\.mlp\.up_proj\.input_quantizer: a narrow range \[-15, 15\]")

    torch.manual_seed(0)
    model = fakequant.quantize_model(_llama().eval(), preset="W4A16")  # groups of 128 along 64 input features
    _assert_refused(model, tmp_path / "b", r"model\.layers\.0\.self_attn\.q_proj\.weight_quantizer: blocks of 128")

    torch.manual_seed(0)
    model = fakequant.quantize_model(_llama().eval(), preset="NVFP4")  # uncalibrated: no global input scale
    _assert_refused(model, tmp_path / "c", r"q_proj\.input_quantizer: NVFP4 activations without a calibrated")

    torch.manual_seed(0)
    model = fakequant.quantize_model(_llama().eval(), preset="W8A8", quantize_attention=True)
    _assert_refused(model, tmp_path / "d", r"self_attn\.q_bmm_quantizer: a quantizer outside the Linear layers")

    model = fakequant.quantize_model(transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_embd=64, n_layer=1, n_head=4, vocab_size=VOCAB, n_positions=32)), preset="W8A8")
    _assert_refused(model, tmp_path / "e", r"transformer\.h\.0\.attn\.c_attn\._input_quantizer: a quantizer outside")


def test_arguments(tmp_path):
    torch.manual_seed(0)
    model = fakequant.quantize_model(_llama().eval(), preset="W8A8")
    with pytest.raises(ValueError, match="format must be one of"):
        fakequant.export_checkpoint(model, tmp_path, format="onnx")
    with pytest.raises(TypeError, match="directory must be a path"):
        fakequant.export_checkpoint(model, 3)
    with pytest.raises(TypeError, match="model must be a transformers PreTrainedModel"):
        fakequant.export_checkpoint(torch.nn.Sequential(quant_nn.QuantLinear(4, 4)), tmp_path)
    with pytest.raises(TypeError, match="tokenizer must have save_pretrained"):
        fakequant.export_checkpoint(model, tmp_path, tokenizer="gpt2")
    with pytest.raises(ValueError, match="no quantized Linear layer"):
        fakequant.export_checkpoint(_llama(), tmp_path)
    assert not any(tmp_path.iterdir())
    pytest.importorskip("gguf", reason="the serve extra")
    with pytest.raises(ValueError, match="GGUF"):  # a W8A8 model has no GGUF equivalent: refused, nothing written
        fakequant.export_checkpoint(model, tmp_path / "m.gguf", format="gguf")
    assert not any(tmp_path.iterdir())


def test_tokenizer_and_generation_config_written(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {f"t{i}": i for i in range(VOCAB)}
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="t0")),
        unk_token="t0", pad_token="t0")
    torch.manual_seed(0)
    model = _quantized(_llama, "FP8", torch.float32)
    fakequant.export_checkpoint(model, tmp_path, tokenizer=tok)
    assert (tmp_path / "generation_config.json").exists()
    loaded = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert loaded.convert_tokens_to_ids("t5") == 5


def test_weight_only_preset_disables_inputs():
    torch.manual_seed(0)
    model = fakequant.quantize_model(_llama(128), preset="W4A16")
    layer = model.model.layers[0].mlp.down_proj
    assert not layer.input_quantizer.is_enabled and layer.weight_quantizer.is_enabled
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the disabled input quantizers are not "uncalibrated"
        fakequant.calibrate(model, [torch.randint(0, VOCAB, (2, 8))], progress=False,
                            forward_fn=lambda m, ids: m(input_ids=ids))
    with pytest.raises(ValueError, match="quantizes weights only"):
        fakequant.quantize_model(_llama(128), preset="W4A16", quantize_attention=True)
    assert fakequant.quantize_model(_llama(128), preset="W4A16",
                                    quantize_attention=QuantDescriptor(num_bits=8)) is not None


@pytest.mark.parametrize("preset", ["W8A8", "FP8", "W4A16"])
def test_bfloat16_weights_reload_bit_for_bit(tmp_path, preset):
    # the dequantized load reads the float32 scales as written: bfloat16 weights are exact too
    # (the compressed load rounds them to bfloat16 first: docs/serving.md)
    model = _quantized(lambda: _llama(128 if preset == "W4A16" else 64), preset, torch.bfloat16)
    fakequant.export_checkpoint(model, tmp_path)
    dense = _load(tmp_path, quantization_config=CompressedTensorsConfig(dequantize=True))
    for name, module in model.named_modules():
        if isinstance(module, quant_nn.QuantLinear):
            with torch.no_grad():
                fake = module.weight_quantizer(module.weight)
            assert fake.dtype == torch.bfloat16 and bits_equal(dense.get_submodule(name).weight, fake), name
