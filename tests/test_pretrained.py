"""save_pretrained / from_pretrained of quantized transformers models (fakequant.models.pretrained):
the reloaded model is the saved one, quantizers, amax and learned ranges included, bit for bit,
in this process and in a fresh one that only imports transformers and fakequant."""
import json
import subprocess
import sys
import textwrap

import pytest
import torch

import fakequant
from fakequant.nn import TensorQuantizer
from fakequant.tensor_quant import QuantDescriptor

from conftest import bits_equal

transformers = pytest.importorskip("transformers")


def _llama():
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64))


def _qwen3_moe():
    return transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(
        vocab_size=64, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=4, num_experts_per_tok=2,
        max_position_embeddings=64))


IDS = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))

CASES = {
    "llama-INT8-attention": (_llama, dict(preset="INT8", quantize_attention=True)),
    "llama-NVFP4": (_llama, dict(preset="NVFP4")),
    "llama-descriptors": (_llama, dict(
        quant_desc_input=QuantDescriptor(num_bits=8, calib_method="histogram"),
        quant_desc_weight=QuantDescriptor(num_bits=4, block_sizes={-1: 16, "type": "dynamic"}),
        exclude=["*lm_head*", "*down_proj*"])),
    "qwen3_moe-INT8": (_qwen3_moe, dict(preset="INT8")),
}


def _quantized(case):
    build, kwargs = CASES[case]
    torch.manual_seed(0)
    model = fakequant.quantize_model(build().eval(), **kwargs)
    fakequant.calibrate(model, [IDS], progress=False, **({"method": "percentile", "percentile": 99.9}
                                                         if case == "llama-descriptors" else {}))
    return model


def _same(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sorted(sa) == sorted(sb)
    for key in sa:
        assert bits_equal(sa[key], sb[key]), key
    with torch.no_grad():
        assert bits_equal(a(IDS).logits, b(IDS).logits)
    a.train()
    b.train()
    with torch.no_grad():
        assert bits_equal(a(IDS).logits, b(IDS).logits)


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_saved_quantized_model_reloads_with_its_quantizers_bit_for_bit(case, tmp_path):
    model = _quantized(case)
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())["quantization_config"]
    assert config["quant_method"] == "fakequant"
    assert config["amax_shapes"] and all(isinstance(s, list) for s in config["amax_shapes"].values())
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert loaded.config._attn_implementation == model.config._attn_implementation
    assert sum(isinstance(m, TensorQuantizer) for m in loaded.modules()) == \
        sum(isinstance(m, TensorQuantizer) for m in model.modules())
    _same(model, loaded)
    # saved again from the loaded model: the same files' contents
    loaded.save_pretrained(tmp_path / "again")
    assert json.loads((tmp_path / "again" / "config.json").read_text())["quantization_config"] == config


def test_a_fresh_process_that_imports_transformers_and_fakequant_loads_it(tmp_path):
    model = _quantized("qwen3_moe-INT8")
    model.save_pretrained(tmp_path / "model")
    torch.save(IDS, tmp_path / "ids.pt")
    script = textwrap.dedent(f"""
        import torch, transformers, fakequant
        model = transformers.AutoModelForCausalLM.from_pretrained({str(tmp_path / "model")!r}).eval()
        with torch.no_grad():
            torch.save(model(torch.load({str(tmp_path / "ids.pt")!r})).logits, {str(tmp_path / "logits.pt")!r})
    """)
    subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True, timeout=300)
    with torch.no_grad():
        expected = model(IDS).logits
    assert bits_equal(torch.load(tmp_path / "logits.pt"), expected)


def test_a_model_quantized_with_custom_modules_refuses_to_reload_clearly(tmp_path):
    model = _quantized("llama-INT8-attention")
    model.config.quantization_config.recipe["custom_quant_modules"] = True
    model.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="custom_quant_modules"):
        transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
