"""GGUF (llama.cpp): the GGUF presets' rule against gguf's own numpy quantization, and
export_gguf's files read back by gguf's own reader, bit for bit."""
import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf", reason="GGUF export tests need the gguf package (pip install 'fakequant[serve]')")
transformers = pytest.importorskip("transformers", reason="GGUF export tests need transformers")

import fakequant  # noqa: E402
from fakequant import ops  # noqa: E402
from fakequant.composite import rules as reference  # noqa: E402
from fakequant.models import presets  # noqa: E402
from fakequant.serve.gguf import export_gguf  # noqa: E402
from fakequant.tensor_quant import QuantDescriptor  # noqa: E402
from conftest import bits_equal  # noqa: E402
from sentencepiece_style import sentencepiece_style_tokenizer  # noqa: E402

TYPES = {"Q8_0": 8, "Q4_0": 4}
PRESET_OF = {"Q8_0": "GGUF_Q8_0", "Q4_0": "GGUF_Q4_0"}


def gguf_roundtrip(x, kind):
    """gguf's quantize then dequantize of float32 rows: llama.cpp's values."""
    qtype = gguf.GGMLQuantizationType[kind]
    a = x.detach().float().numpy()
    return torch.from_numpy(gguf.quants.dequantize(gguf.quants.quantize(a, qtype), qtype).reshape(a.shape))


def hard_rows():
    """Rows of 32 where the rule's details show: ties of x / d (Q8_0 rounds halves away from zero),
    x / d + 8.5 rounding up in float32 (Q4_0), equal magnitudes of both signs (Q4_0 takes the
    first), zeros of both signs, float16 subnormal and underflowing scales, a saturating Q4_0
    element, and random rows of very different magnitudes."""
    g = torch.Generator().manual_seed(1)
    rows = [
        torch.cat([torch.tensor([127.0]), torch.arange(31) - 15.5]),  # d = 1: x.5 ties
        torch.cat([torch.tensor([-8.0, 0.49999997, -0.49999997, 0.5, -0.5, 1.5, 7.4999995]), torch.zeros(25)]),
        torch.cat([torch.tensor([3.0, -3.0, 1.0, -1.0]), torch.zeros(28)]),
        torch.cat([torch.tensor([-3.0, 3.0, -2.9]), torch.zeros(29)]),
        torch.tensor([0.0, -0.0] * 16),
        torch.tensor([-0.0] * 32),
        torch.randn(32, generator=g) * 3e-6,   # float16 subnormal scales
        torch.randn(32, generator=g) * 1e-9,   # scales that underflow float16
        torch.cat([torch.tensor([8.0, -8.0, -7.6, 7.9]), torch.randn(28, generator=g)]),  # Q4_0: -8 saturates
    ]
    rows += list(torch.randn(64, 32, generator=g) * torch.logspace(-4, 4, 64).unsqueeze(1))
    return torch.stack(rows)


@pytest.mark.parametrize("kind", TYPES)
def test_rule_is_gguf_quantize_then_dequantize(kind):
    x = hard_rows()
    assert bits_equal(ops.fake_quantize_ggml(x, 32, TYPES[kind]), gguf_roundtrip(x, kind))
    assert bits_equal(reference.fake_quantize_ggml(x, 32, TYPES[kind])[0], gguf_roundtrip(x, kind))


def test_round_to_float16_is_the_cast():
    g = torch.Generator().manual_seed(2)
    v = torch.randn(1 << 16, generator=g) * torch.exp2(torch.randint(-40, 20, (1 << 16,), generator=g).float())
    v = torch.cat([v, torch.tensor([0.0, -0.0, 65504.0, 65519.99, 65520.0, -1e30, float("inf"), 2.0**-25, 2.0**-26,
                                    2.0**-25 * 1.0001, 2.0**-24 * 1.5, float("nan")])])
    assert bits_equal(reference.round_to_float16(v), v.half().float())


def test_gradient_passes_where_nothing_saturates():
    x = torch.cat([torch.tensor([8.0, -8.0, -7.4, 3.0]), torch.zeros(28)]).requires_grad_()
    ops.fake_quantize_ggml(x, 32, 4).sum().backward()
    assert x.grad[1] == 0 and x.grad[0] == 1 and x.grad[2] == 1 and bool((x.grad[3:] == 1).all())
    x = (torch.randn(4, 64) * 5).requires_grad_()
    ops.fake_quantize_ggml(x, 32, 8).sum().backward()
    assert bool((x.grad == 1).all())  # Q8_0 never saturates


@pytest.mark.parametrize("kind", TYPES)
def test_other_dtypes_axes_and_short_blocks(kind):
    x = torch.randn(3, 40, 6)
    y = ops.fake_quantize_ggml(x, 32, TYPES[kind], axis=1)
    assert bits_equal(y, ops.fake_quantize_ggml(x.transpose(1, 2), 32, TYPES[kind]).transpose(1, 2))
    # a row of 40: blocks of 32 and 8, the second quantized on its own
    rows = x.transpose(1, 2).reshape(-1, 40)
    pad = torch.cat([rows, torch.zeros(rows.shape[0], 24)], 1)
    assert bits_equal(ops.fake_quantize_ggml(rows, 32, TYPES[kind]), gguf_roundtrip(pad, kind)[:, :40])
    for dtype in (torch.bfloat16, torch.float16, torch.float64):  # float32 math, one rounding to dtype
        h = (torch.randn(4, 64) * 3).to(dtype)
        assert bits_equal(ops.fake_quantize_ggml(h, 32, TYPES[kind]), gguf_roundtrip(h.float(), kind).to(dtype))


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match="num_bits"):
        ops.fake_quantize_ggml(torch.randn(32), 32, 6)
    with pytest.raises(ValueError, match="block_size"):
        ops.fake_quantize_ggml(torch.randn(32), 0, 8)
    with pytest.raises(TypeError, match="input"):
        ops.fake_quantize_ggml(torch.arange(32), 32, 8)
    with pytest.raises(ValueError, match=r"scale_bits'\] = \(5, 10\).*num_bits=6"):
        QuantDescriptor(num_bits=6, block_sizes={-1: 32, "type": "dynamic", "scale_bits": (5, 10)})
    with pytest.raises(ValueError, match="scale_bits"):
        QuantDescriptor(num_bits=8, block_sizes={-1: 32, "type": "dynamic", "scale_bits": (5, 9)})


@pytest.mark.parametrize("kind", TYPES)
def test_preset_weights_and_inputs_are_llama_cpps(kind):
    torch.manual_seed(0)
    model = fakequant.quantize_model(torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.Linear(96, 8)),
                                     preset=PRESET_OF[kind])
    layer = model[0]
    assert bits_equal(layer.weight_quantizer(layer.weight), gguf_roundtrip(layer.weight, kind))
    x = torch.randn(2, 5, 64) * 4
    assert bits_equal(layer.input_quantizer(x), gguf_roundtrip(x.reshape(-1, 64), "Q8_0").reshape(x.shape))
    model(x).sum().backward()
    assert layer.weight.grad is not None and bool(torch.isfinite(layer.weight.grad).all())


def test_onnx_export_is_refused(tmp_path):
    model = fakequant.quantize_model(torch.nn.Sequential(torch.nn.Linear(32, 8)), preset="GGUF_Q8_0")
    with pytest.raises(Exception, match="no ONNX form"):
        torch.onnx.export(model, (torch.randn(2, 32),), str(tmp_path / "m.onnx"), dynamo=False)


@pytest.mark.slow
@pytest.mark.parametrize("kind", TYPES)
def test_compiled_matches_eager(kind):
    x = hard_rows()
    f = torch.compile(lambda t: ops.fake_quantize_ggml(t, 32, TYPES[kind]), fullgraph=True)
    assert bits_equal(f(x), ops.fake_quantize_ggml(x, 32, TYPES[kind]))


# --- export: the file read back by gguf ------------------------------------------------------------

def tiny(model_type="llama", **kwargs):
    torch.manual_seed(0)
    common = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  vocab_size=128, intermediate_size=128, max_position_embeddings=256)
    common.update(kwargs)
    if model_type == "qwen2":
        return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common))
    if model_type == "mistral":
        return transformers.MistralForCausalLM(transformers.MistralConfig(rms_norm_eps=1e-5, **common))
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(rms_norm_eps=1e-5, **common))


def llama_rows_undone(t, heads):
    """The inverse of llama.cpp's q/k row order (within each head: rows 0, half, 1, half + 1, ...)."""
    half = t.shape[0] // heads // 2
    return t.reshape(heads, half, 2, *t.shape[1:]).transpose(1, 2).reshape(t.shape)


def read_back(path, model, permuted=True):
    """{HF parameter name: (GGML type name, the tensor as gguf dequantizes it, rows undone)}."""
    reader = gguf.GGUFReader(path)
    cfg = model.config
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA if permuted else gguf.MODEL_ARCH.QWEN2,
                                     cfg.num_hidden_layers)
    by_gguf = {names.get_name(n, try_suffixes=(".weight", ".bias")): n for n, _ in model.named_parameters()}
    out = {}
    for t in reader.tensors:
        values = torch.from_numpy(np.array(gguf.quants.dequantize(t.data, t.tensor_type)))
        hf = by_gguf[t.name]
        values = values.reshape(dict(model.named_parameters())[hf].shape)
        heads = (cfg.num_attention_heads if ".q_proj." in hf else cfg.num_key_value_heads if ".k_proj." in hf else None)
        if permuted and heads is not None:
            values = llama_rows_undone(values, heads)
        out[hf] = (t.tensor_type.name, values)
    return reader, out


def field(reader, key):
    return reader.fields[key].contents()


def check_metadata(reader, model, arch="llama"):
    cfg, K = model.config, gguf.Keys
    expected = {
        K.General.ARCHITECTURE: arch,
        K.LLM.CONTEXT_LENGTH.format(arch=arch): cfg.max_position_embeddings,
        K.LLM.EMBEDDING_LENGTH.format(arch=arch): cfg.hidden_size,
        K.LLM.BLOCK_COUNT.format(arch=arch): cfg.num_hidden_layers,
        K.LLM.FEED_FORWARD_LENGTH.format(arch=arch): cfg.intermediate_size,
        K.LLM.VOCAB_SIZE.format(arch=arch): cfg.vocab_size,
        K.Attention.HEAD_COUNT.format(arch=arch): cfg.num_attention_heads,
        K.Attention.HEAD_COUNT_KV.format(arch=arch): cfg.num_key_value_heads,
        K.Attention.KEY_LENGTH.format(arch=arch): cfg.hidden_size // cfg.num_attention_heads,
        K.Rope.DIMENSION_COUNT.format(arch=arch): cfg.hidden_size // cfg.num_attention_heads,
        K.Rope.FREQ_BASE.format(arch=arch): cfg.rope_parameters["rope_theta"],
        K.General.QUANTIZATION_VERSION: gguf.GGML_QUANT_VERSION,
        K.Tokenizer.MODEL: "none",
    }
    for key, value in expected.items():
        assert field(reader, key) == value, key
    eps = field(reader, K.Attention.LAYERNORM_RMS_EPS.format(arch=arch))
    assert eps == np.float32(cfg.rms_norm_eps)


@pytest.mark.parametrize("float_type", ["auto", "f16"])
@pytest.mark.parametrize("kind", TYPES)
def test_export_is_the_qat_model_bit_for_bit(kind, float_type, tmp_path):
    """The default (float_type="auto") writes every tensor as trained, the embeddings and lm_head
    included (F32 for this float32 model); "f16" rounds those to float16, as asked."""
    model = fakequant.quantize_model(tiny(), preset=PRESET_OF[kind])
    path = export_gguf(model, tmp_path / "out", **({} if float_type == "auto" else {"float_type": float_type}))
    assert path == tmp_path / "out" / "model.gguf"
    reader, tensors = read_back(path, model)
    check_metadata(reader, model)
    file_type = {"Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0, "Q4_0": gguf.LlamaFileType.MOSTLY_Q4_0}[kind]
    assert field(reader, gguf.Keys.General.FILE_TYPE) == file_type
    params = dict(model.named_parameters())
    assert set(tensors) == set(params)  # every parameter, once (lm_head included: not tied)
    quantized = {n[: -len(".weight")] for n, (t, _) in tensors.items() if t == kind}
    linears = {n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and hasattr(m, "weight_quantizer")}
    assert quantized == linears and len(linears) == 14  # 7 per layer; lm_head stays float
    for name, (ggml_type, values) in tensors.items():
        module = model.get_submodule(name.rpartition(".")[0])
        with torch.no_grad():
            if ggml_type == kind:
                assert bits_equal(values, module.weight_quantizer(module.weight)), name
            elif params[name].dim() == 2:  # the embeddings and lm_head
                assert ggml_type == {"auto": "F32", "f16": "F16"}[float_type], name
                expected = params[name].detach()
                assert bits_equal(values, expected if float_type == "auto" else expected.half().float()), name
            else:
                assert ggml_type == "F32" and params[name].dim() == 1, name
                assert bits_equal(values, params[name].detach()), name


@pytest.mark.parametrize("dtype, ggml_type, file_type", [(torch.bfloat16, "BF16", "MOSTLY_BF16"),
                                                         (torch.float16, "F16", "MOSTLY_F16")])
def test_default_keeps_the_models_float_type(dtype, ggml_type, file_type, tmp_path):
    """float_type="auto" stores a bfloat16 / float16 model's float tensors in their own type
    (exact, half of F32); the Q4_0 blocks dequantize to its fake-quantized weights in its dtype."""
    float_model = tiny().to(dtype)
    reader, tensors = read_back(export_gguf(float_model, tmp_path / "float.gguf"), float_model)
    assert field(reader, gguf.Keys.General.FILE_TYPE) == gguf.LlamaFileType[file_type]
    params = dict(float_model.named_parameters())
    for name, (kind, values) in tensors.items():
        assert kind == (ggml_type if params[name].dim() == 2 else "F32"), name
        assert bits_equal(values.to(dtype), params[name].detach()), name
    model = fakequant.quantize_model(tiny().to(dtype), preset="GGUF_Q4_0")
    reader, tensors = read_back(export_gguf(model, tmp_path / "q4.gguf"), model)
    assert field(reader, gguf.Keys.General.FILE_TYPE) == gguf.LlamaFileType.MOSTLY_Q4_0
    for name, (kind, values) in tensors.items():
        module = model.get_submodule(name.rpartition(".")[0])
        with torch.no_grad():
            expected = module.weight_quantizer(module.weight) if kind == "Q4_0" else dict(model.named_parameters())[name]
        assert kind in ("Q4_0", ggml_type, "F32") and bits_equal(values.to(dtype), expected.detach()), name


def test_f32_export_of_a_float_model_is_every_tensor(tmp_path):
    model = tiny()
    path = export_gguf(model, tmp_path / "f32.gguf", float_type="f32")
    assert path == tmp_path / "f32.gguf"
    reader, tensors = read_back(path, model)
    check_metadata(reader, model)
    assert field(reader, gguf.Keys.General.FILE_TYPE) == gguf.LlamaFileType.ALL_F32
    params = dict(model.named_parameters())
    assert set(tensors) == set(params)
    for name, (ggml_type, values) in tensors.items():
        assert ggml_type == "F32" and bits_equal(values, params[name].detach()), name
    # the q/k rows are in llama.cpp's order in the file (undone above): not the transformers order
    raw = {t.name: np.array(t.data) for t in reader.tensors}
    q = params["model.layers.0.self_attn.q_proj.weight"].detach().numpy()
    assert not np.array_equal(raw["blk.0.attn_q.weight"], q)
    assert np.array_equal(raw["blk.0.attn_q.weight"][1], q[8])  # head 0: row 1 is the second half's first


def test_tied_embeddings_mistral_and_qwen2(tmp_path):
    model = fakequant.quantize_model(tiny(tie_word_embeddings=True), preset="GGUF_Q8_0")
    reader, tensors = read_back(export_gguf(model, tmp_path / "tied.gguf"), model)
    assert "output.weight" not in {t.name for t in reader.tensors}  # llama.cpp reuses token_embd
    mistral = fakequant.quantize_model(tiny("mistral"), preset="GGUF_Q8_0")  # converted as Llama
    reader, tensors = read_back(export_gguf(mistral, tmp_path / "mistral.gguf"), mistral)
    check_metadata(reader, mistral)
    for name, (ggml_type, values) in tensors.items():
        if ggml_type == "Q8_0":
            module = mistral.get_submodule(name.rpartition(".")[0])
            assert bits_equal(values, module.weight_quantizer(module.weight)), name
    qwen = fakequant.quantize_model(tiny("qwen2"), preset="GGUF_Q4_0")
    reader, tensors = read_back(export_gguf(qwen, tmp_path / "qwen.gguf"), qwen, permuted=False)
    assert field(reader, gguf.Keys.General.ARCHITECTURE) == "qwen2"
    for name, (ggml_type, values) in tensors.items():
        module = qwen.get_submodule(name.rpartition(".")[0])
        if ggml_type == "Q4_0":
            assert bits_equal(values, module.weight_quantizer(module.weight)), name
        elif name.endswith(".bias"):  # q/k/v biases of Qwen2, in F32
            assert ggml_type == "F32" and bits_equal(values, dict(qwen.named_parameters())[name].detach()), name


def test_refuses_before_writing(tmp_path):
    w8a8 = fakequant.quantize_model(tiny(), preset="W8A8")
    with pytest.raises(ValueError, match=r"model\.layers\.0\.self_attn\.q_proj\.weight_quantizer: .*no GGUF form"):
        export_gguf(w8a8, tmp_path / "w8a8")
    assert not (tmp_path / "w8a8").exists()
    model = fakequant.quantize_model(tiny(), preset="GGUF_Q4_0")
    model.model.layers[1].mlp.down_proj.weight_quantizer.num_bits = 8  # Q8_0: still a GGUF quantizer
    export_gguf(model, tmp_path / "mixed.gguf")
    model.model.layers[1].mlp.down_proj.input_quantizer.num_bits = 4  # llama.cpp's inputs are Q8_0
    with pytest.raises(ValueError, match=r"down_proj\.input_quantizer: .*no GGUF form"):
        export_gguf(model, tmp_path / "bad.gguf")
    assert not (tmp_path / "bad.gguf").exists()
    with pytest.raises(ValueError, match="model_type"):
        export_gguf(transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2)),
                    tmp_path / "gpt2.gguf")
    with pytest.raises(ValueError, match="float_type"):
        export_gguf(tiny(), tmp_path / "x.gguf", float_type="bf16")
    model = fakequant.quantize_model(tiny(), preset="GGUF_Q8_0")
    for m in model.modules():
        if isinstance(m, fakequant.nn.TensorQuantizer) and m is not model.model.layers[0].mlp.up_proj.weight_quantizer:
            m.disable()
    model.model.layers[0].mlp.up_proj.weight_quantizer.num_bits = 6  # not a GGML type
    with pytest.raises(ValueError, match=r"up_proj\.weight_quantizer: .*no GGUF form"):
        export_gguf(model, tmp_path / "six.gguf")


def test_tokenizer_is_written(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    bpe = tokenizers.ByteLevelBPETokenizer()
    bpe.train_from_iterator(["hello world, hello llama"] * 4, vocab_size=300, min_frequency=1,
                            special_tokens=["<s>", "</s>"])
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, bos_token="<s>", eos_token="</s>")
    model = tiny(vocab_size=len(tok) + 16)  # the model's rows beyond the tokenizer: unused tokens
    reader, _ = read_back(export_gguf(model, tmp_path / "tok.gguf", tok, tokenizer_pre="gpt-2"), model)
    K = gguf.Keys.Tokenizer
    assert field(reader, K.MODEL) == "gpt2" and field(reader, K.PRE) == "gpt-2"
    tokens = field(reader, K.LIST)
    assert len(tokens) == model.config.vocab_size
    vocab = tok.get_vocab()
    assert all(tokens[i] == t for t, i in vocab.items())
    assert tokens[-1] == f"[PAD{len(tokens) - 1}]"
    assert field(reader, K.TOKEN_TYPE)[-1] == gguf.TokenType.UNUSED
    assert field(reader, K.BOS_ID) == vocab["<s>"] and field(reader, K.EOS_ID) == vocab["</s>"]
    assert len(field(reader, K.MERGES)) > 0


def test_llama_tokenizer_is_written_with_its_merges_order(tmp_path):
    """The scores llama.cpp's "llama" tokenizer merges by (the highest-scoring token that two
    adjacent tokens make, again and again) rank the tokens as the tokenizer's merges do, read back
    through gguf's reader: llama.cpp then merges in the tokenizer's order (make llama-check runs
    llama.cpp's own tokenizer on it). gguf's LlamaHfVocab alone writes -1000 for every token."""
    import json
    import warnings
    pytest.importorskip("tokenizers")
    tok = sentencepiece_style_tokenizer()
    model = tiny(vocab_size=len(tok) + 16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every pair that makes a token is a merge: no warning
        path = export_gguf(model, tmp_path / "llama-tok.gguf", tok)
    reader, _ = read_back(path, model)
    K = gguf.Keys.Tokenizer
    assert field(reader, K.MODEL) == "llama"
    tokens, scores, types = field(reader, K.LIST), field(reader, K.SCORES), field(reader, K.TOKEN_TYPE)
    assert len(tokens) == len(scores) == len(types) == model.config.vocab_size
    vocab = tok.get_vocab()
    assert all(tokens[i] == t for t, i in vocab.items()) and len(vocab) == len(tok)
    T = gguf.TokenType
    for t, i in vocab.items():
        assert types[i] == (T.BYTE if t.startswith("<0x") else T.CONTROL if t in ("<unk>", "<s>", "</s>") else T.NORMAL), t
    assert all(types[i] == T.UNUSED for i in range(len(tok), len(tokens)))
    assert field(reader, K.BOS_ID) == vocab["<s>"] and field(reader, K.EOS_ID) == vocab["</s>"]
    assert field(reader, K.UNK_ID) == vocab["<unk>"]
    assert tok("names")["input_ids"][0] == vocab["<s>"]
    assert field(reader, K.ADD_BOS) is True and field(reader, K.ADD_EOS) is False  # as the tokenizer
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m)
              for m in json.loads(tok.backend_tokenizer.to_str())["model"]["merges"]]
    assert len(merges) > 500
    made = [vocab[a + b] for a, b in merges]
    for k, (first, second) in enumerate(zip(made, made[1:])):  # the merges' order, token by token
        assert scores[first] > scores[second] or first == second, merges[k:k + 2]
    merged = set(made)
    lowest = min(scores[i] for i in merged)
    assert all(scores[i] < lowest for i in range(len(tok)) if i not in merged)  # characters, bytes, specials
    # what -1000 everywhere did: llama.cpp merged left to right (issue 38: "names" -> ame+s, not am+es)
    assert len({scores[i] for i in merged}) == len(merged)


def test_a_tokenizer_llama_cpp_would_merge_otherwise_is_named(tmp_path):
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{b:02X}>": 3 + b for b in range(256)}}
    for piece in ("\u2581", "a", "b", "c", "ab", "bc", "abc"):
        vocab[piece] = len(vocab)
    tok = transformers.LlamaTokenizer(vocab=vocab, merges=[("a", "b"), ("b", "c"), ("ab", "c")])  # no a + bc
    with pytest.warns(UserWarning, match=r"no merge for 1 such pairs \('a' \+ 'bc'\)"):
        export_gguf(tiny(vocab_size=len(vocab)), tmp_path / "w.gguf", tok)
