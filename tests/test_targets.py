"""quantize_model(target=...): the serving target's rules (docs/serving.md, "Targets").

The default ("onnx") keeps the library's rules (tools/op_fingerprint.py and the rest of the
suite check its bits); "vllm" follows vLLM's kernels where they differ, checked here against
an independent float32/float64 reference of each kernel's arithmetic and, where
compressed-tensors computes the same rule, against compressed-tensors itself."""
import math
import sys
import warnings

import numpy as np
import pytest
import torch

import fakequant
from fakequant.composite import rules
from fakequant.nn import TensorQuantizer
from fakequant._core import BlockScales
from conftest import bits_equal

transformers = pytest.importorskip("transformers")


def _llama(dtype=torch.float32, hidden=64):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                      bos_token_id=0, eos_token_id=0, pad_token_id=0)
    return transformers.LlamaForCausalLM(config).to(dtype).eval()


def _quantizers(model):
    return {name: q for name, q in model.named_modules() if isinstance(q, TensorQuantizer)}


# --- the choice, recorded ---------------------------------------------------------------------


def test_default_target_is_onnx_and_keeps_the_paths():
    from fakequant.nn import _paths
    model = fakequant.quantize_model(_llama(), preset="W8A8")
    quantizers = _quantizers(model)
    assert quantizers and all(q.target == "onnx" for q in quantizers.values())
    inputs = [q for name, q in quantizers.items() if name.endswith("input_quantizer")]
    assert all(q._path is _paths.DYNAMIC_BLOCKS for q in inputs)


def test_target_is_recorded_on_every_quantizer():
    from fakequant.nn import _paths
    model = fakequant.quantize_model(_llama(), preset="FP8", target="vllm")
    quantizers = _quantizers(model)
    assert all(q.target == "vllm" for q in quantizers.values())
    for name, q in quantizers.items():  # weights are stored as trained: their rule stays the library's
        assert q._values is (_paths.FP8 if name.endswith("weight_quantizer") else _paths.VLLM_FP8), name


def test_bad_target_raises():
    with pytest.raises(ValueError, match="target must be one of"):
        fakequant.quantize_model(_llama(), preset="W8A8", target="tensorrt")
    with pytest.raises(ValueError, match=r"model\.layers\.0\..*target='vllm'"):
        fakequant.quantize_model(_llama(), preset="GGUF_Q8_0", target="vllm")
    with pytest.raises(NotImplementedError, match="asymmetric"):
        fakequant.quantize_model(_llama(), preset="W8A8_ASYM", target="vllm")


def test_refused_setting_leaves_the_quantizer_as_it_was():
    q = TensorQuantizer(fakequant.QuantDescriptor(num_bits=4, block_sizes={-1: None, "type": "dynamic"}))
    with pytest.raises(NotImplementedError, match="int8 or FP8"):
        q.target = "vllm"
    assert q.target == "onnx"
    x = torch.randn(4, 16)
    torch.testing.assert_close(q(x), rules.fake_quantize_blockwise(x, 16, 4)[0], rtol=0, atol=0)


def test_target_survives_pickle_and_from_pretrained(tmp_path):
    import pickle
    model = fakequant.quantize_model(_llama(), preset="W8A8", target="vllm")
    q = model.model.layers[0].mlp.down_proj.input_quantizer
    assert pickle.loads(pickle.dumps(q)).target == "vllm"
    model.save_pretrained(tmp_path)
    again = transformers.LlamaForCausalLM.from_pretrained(tmp_path)
    assert all(q.target == "vllm" for q in _quantizers(again).values())


# --- the rules against each kernel's arithmetic ------------------------------------------------


def _int8_rows_reference(x):
    """vLLM's dynamic_scaled_int8_quant in numpy float32: x * (127 / amax), round half even,
    saturate, times amax / 127."""
    x = x.numpy().astype(np.float32)
    amax = np.abs(x).max(-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.float32(127.0) / amax
        q = np.rint(x * r)
    q = np.nan_to_num(q, nan=0.0).clip(-128, 127)
    return torch.from_numpy((q * (amax / np.float32(127.0))).astype(np.float32) + 0.0)


def test_vllm_int8_rows_is_the_kernels_rule_and_differs_from_dividing():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4096, 64, generator=g) * torch.rand(4096, 1, generator=g) * 10
    x[0] = 0.0
    y, mask = rules.vllm_round_int8_rows(x)
    assert torch.equal(y, _int8_rows_reference(x))
    assert bool(mask.all())
    # halfway values (k + 1/2 steps): multiplying by the rounded reciprocal moves many by one step
    amax = torch.rand(256, 1, generator=g) * 10 + 0.1
    x = torch.cat([amax, (torch.arange(-126, 126).float() + 0.5) * (amax / 127)], 1)
    y = rules.vllm_round_int8_rows(x)[0]
    assert torch.equal(y, _int8_rows_reference(x))
    onnx = rules.fake_quantize_blockwise(x, x.shape[1], 8, narrow_range=False)[0]
    assert not torch.equal(y, onnx)
    assert ((y - onnx).abs() <= amax / 127 * 1.0001).all()


def test_vllm_fp8_reciprocal_is_the_kernels_rule():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1 << 16, generator=g) * 3
    amax = torch.tensor(7.3)
    y, _ = rules.vllm_round_fp8_reciprocal(x, amax)
    s = np.float32(7.3) / np.float32(448.0)
    r = np.float32(1.0) / s
    v = np.clip(x.numpy() * r, -448, 448)
    expected = torch.from_numpy(v).to(torch.float8_e4m3fn).float() * torch.tensor(s)
    assert torch.equal(y, expected)
    # halfway between E4M3 values: the rounded reciprocal moves some by one step
    grid = torch.arange(0, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    x = (grid[:-1] + grid[1:]) / 2 * (amax / 448)
    assert not torch.equal(rules.vllm_round_fp8_reciprocal(x, amax)[0], rules.fake_quantize_fp8(x, amax)[0])


def test_vllm_per_token_fp8_floor_on_the_scale():
    x = torch.tensor([[1e-4, -5e-4, 2e-4, 0.0], [1.0, -2.0, 0.5, 0.25]])
    y, _ = rules.vllm_fake_quantize_blocks(x, 4, 8, 4)
    s = torch.tensor([[rules.VLLM_FP8_MIN_SCALE], [2.0 / 448]])
    assert torch.equal(y, (x / s).to(torch.float8_e4m3fn).float() * s)


def test_vllm_mx_exponent_rounds_to_the_nearest_power_of_two():
    amax = torch.tensor([1.0, 1.74, 1.75, 1.99, 3.5, 0.0, 6.0])
    k = rules.vllm_mx_exponent_of(amax, 4, 2)  # E2M1: emax 2
    assert k.tolist() == [-2, -2, -1, -1, 0, -127, 0]
    k8 = rules.vllm_mx_exponent_of(amax, 8, 4)  # E4M3: emax 8, the same rounding
    assert (k8 - k)[amax > 0].eq(-6).all()


@pytest.mark.parametrize("num_bits", [4, 8])
def test_vllm_mx_scales_are_compressed_tensors(num_bits):
    helpers = pytest.importorskip("compressed_tensors.quantization.utils.mxfp_utils")
    g = torch.Generator().manual_seed(2)
    amax = (torch.rand(10000, generator=g) * 2.0 ** torch.randint(-20, 20, (10000,), generator=g)).bfloat16()
    theirs = helpers.generate_mx_scales(amax, num_bits=num_bits).float() - 127
    exponent_bits = 2 if num_bits == 4 else 4
    ours = rules.vllm_mx_exponent_of(amax.float(), num_bits, exponent_bits)
    assert torch.equal(ours, theirs)


def test_vllm_nvfp4_scales_are_compressed_tensors_in_float32():
    helpers = pytest.importorskip("compressed_tensors.quantization.utils.helpers")
    QuantizationArgs = pytest.importorskip("compressed_tensors.quantization").QuantizationArgs
    g = torch.Generator().manual_seed(3)
    amax = torch.rand(4096, generator=g) * 4
    tensor_amax = torch.tensor(4.0)
    args = QuantizationArgs(num_bits=4, type="float", strategy="tensor_group", group_size=16, symmetric=True,
                            dynamic="local", scale_dtype=torch.float8_e4m3fn)
    big = helpers.generate_gparam(-tensor_amax.reshape(1), tensor_amax.reshape(1))
    theirs, _ = helpers.calculate_qparams(-amax, amax, args, global_scale=big)
    values = rules.vllm_block_scales(amax, 4, 2, BlockScales.E4M3, tensor_amax)
    assert torch.equal(values.global_scale.reshape(1), big.float())
    assert torch.equal(values.code, theirs.float())
    assert torch.equal(values.scale, theirs.float() / big.float())


def test_vllm_rules_pass_the_gradient_where_not_saturated():
    from fakequant.ops import _vllm
    x = torch.randn(8, 32, requires_grad=True)
    _vllm.round_int8_rows(x).sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))
    x = torch.tensor([1.0, 10.0, -1.0], requires_grad=True)
    _vllm.round_fp8_reciprocal(x, torch.tensor(2.0)).sum().backward()
    assert x.grad.tolist() == [1.0, 0.0, 1.0]  # |x| <= amax


def test_vllm_rules_have_no_onnx_form(monkeypatch):
    from fakequant.ops import _vllm
    monkeypatch.setattr(torch.onnx, "is_in_onnx_export", lambda: True)
    with pytest.raises(RuntimeError, match="no ONNX form"):
        _vllm.round_int8_rows(torch.randn(2, 4))


# --- compressed-tensors computes the same activations -----------------------------------------


@pytest.mark.parametrize("preset", ["NVFP4", "MXFP8", "MXFP4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_vllm_activations_equal_compressed_tensors(preset, dtype):
    """The input quantizers of the vllm target against compressed-tensors' own dynamic
    activation quantization (compute_dynamic_scales_and_zp, fake_quantize) with the arguments
    and global scale the exporter writes."""
    ct = pytest.importorskip("compressed_tensors.quantization")
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize
    from compressed_tensors.quantization.utils.helpers import compute_dynamic_scales_and_zp, generate_gparam
    if preset == "NVFP4":
        args = ct.QuantizationArgs(num_bits=4, type="float", strategy="tensor_group", group_size=16, symmetric=True,
                                   dynamic="local", scale_dtype=torch.float8_e4m3fn)
    else:
        args = ct.QuantizationArgs(num_bits=4 if preset == "MXFP4" else 8, type="float", strategy="group",
                                   group_size=32, symmetric=True, dynamic=True, scale_dtype=torch.uint8)
    model = fakequant.quantize_model(_llama(dtype), preset=preset, target="vllm")
    quantizer = model.model.layers[0].mlp.down_proj.input_quantizer
    g = torch.Generator().manual_seed(4)
    x = (torch.randn(4, 16, 128, generator=g) * torch.rand(4, 16, 1, generator=g) * 5).to(dtype)
    big = None
    if preset == "NVFP4":
        quantizer.amax = 9.0  # a calibrated per-tensor amax: the exporter's input_global_scale, 2688 / amax
        big = generate_gparam(torch.tensor([-9.0]), torch.tensor([9.0]))
    # compressed-tensors computes in the input's dtype; NVFP4's amax / 6 rounded to bfloat16 is not
    # vLLM's rule (its kernel computes it in float32): NVFP4 is compared on the float32 input
    xc = x.float() if preset == "NVFP4" else x
    with torch.no_grad():
        ours = quantizer(x)
        scale, zero_point = compute_dynamic_scales_and_zp(xc, args, torch.nn.Module(), global_scale=big)
        theirs = fake_quantize(xc, scale, zero_point, args, global_scale=big)
    assert torch.equal(ours, theirs.to(dtype))


def _calibrated(model):
    data = [torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(i)) for i in range(2)]
    fakequant.calibrate(model, data, progress=False, forward_fn=lambda m, ids: m(input_ids=ids))
    return model


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_nvfp4_exports_with_the_vllm_target(tmp_path, dtype):
    """Every layer exports (target "onnx": a float32 model, and this bfloat16 model's k_proj, are
    refused, the search finding no G); what is written is G = 2688 / amax and codes whose
    dequantization by compressed-tensors' own rule, in float32, is the fake-quantized weight bit
    for bit, and for bfloat16 the dequantized load of transformers as well."""
    pytest.importorskip("compressed_tensors")
    from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.lifecycle.forward import dequantize
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, CompressedTensorsConfig
    model = _calibrated(fakequant.quantize_model(_llama(dtype), preset="NVFP4", target="vllm"))
    config = fakequant.export_checkpoint(model, tmp_path)
    assert config["format"] == "nvfp4-pack-quantized"
    written = load_file(tmp_path / "model.safetensors")
    args = QuantizationArgs(num_bits=4, type="float", strategy="tensor_group", group_size=16, symmetric=True,
                            scale_dtype=torch.float8_e4m3fn)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dense = AutoModelForCausalLM.from_pretrained(tmp_path, quantization_config=CompressedTensorsConfig(
            dequantize=True))
    checked = 0
    for name, module in model.named_modules():
        if isinstance(module, fakequant.nn.QuantLinear):
            weight = module.weight.detach()
            big = written[f"{name}.weight_global_scale"]
            assert torch.equal(big, torch.tensor([6 * 448.0]) / weight.float().abs().amax()), name
            codes = unpack_fp4_from_uint8(written[f"{name}.weight_packed"], *weight.shape, dtype=torch.float32)
            theirs = dequantize(codes, written[f"{name}.weight_scale"].float(), args=args, dtype=torch.float32,
                                global_scale=big)
            with torch.no_grad():
                fake = module.weight_quantizer(weight)
            assert bits_equal(theirs.to(dtype), fake), name
            if dtype == torch.bfloat16:  # (compressed-tensors decompresses FP4 weights to bfloat16)
                assert bits_equal(dense.get_submodule(name).weight, fake), name
            checked += 1
    assert checked == 7


def test_exporters_read_the_target(tmp_path):
    """A format refuses a quantizer trained for a target it does not serve, naming both, before
    writing anything: GGUF serves "onnx" only; compressed-tensors serves both."""
    model = _calibrated(fakequant.quantize_model(_llama(), preset="W8A8", target="vllm"))
    with pytest.raises(ValueError, match=r"^model\.layers\.0\.self_attn\.q_proj\._input_quantizer: trained for "
                                         r"target='vllm'.*gguf cannot describe it"):
        fakequant.export_checkpoint(model, tmp_path / "gguf", format="gguf")
    assert not (tmp_path / "gguf").exists()
    assert fakequant.export_checkpoint(model, tmp_path / "ct")["format"] == "int-quantized"


@pytest.mark.parametrize("dynamo", [False, True])
def test_onnx_export_refuses_the_vllm_target(tmp_path, dynamo):
    """fakequant.onnx.export refuses every vllm-target model, INT8's too (whose rules are the same as
    the default target's), before tracing: the target is the model's, not each operator's."""
    for preset in ("W8A8", "INT8"):
        model = torch.nn.Sequential(torch.nn.Linear(32, 16))
        model = fakequant.quantize_model(model, preset=preset, target="vllm").eval()
        fakequant.calibrate(model, [torch.randn(4, 32)], progress=False)
        refused = r"^0\._input_quantizer: trained for target='vllm'.*ONNX cannot describe it"
        with pytest.raises(ValueError, match=refused):
            fakequant.onnx.export(model, (torch.randn(4, 32),), tmp_path / "m.onnx", dynamo=dynamo)
        assert not (tmp_path / "m.onnx").exists()


@pytest.mark.parametrize("preset", ["MXFP8", "MXFP4", "NVFP4"])
def test_vllm_mx_logits_are_the_compressed_loads_bit_for_bit(tmp_path, preset, monkeypatch):
    """Where compressed-tensors' rule is the vllm target's (MX activations; bfloat16, in which its
    compressed load runs MX weights), its compressed load computes fakequant's logits bit for bit,
    given the model built as a load builds it (from_config(dtype=...): the rotary frequencies in
    float32; model.to(torch.bfloat16) would round them, and the attention with them). NVFP4 too,
    once compressed-tensors computes its activations' block maxima in float32 as vLLM's kernel does
    (it computes them in the input's dtype, bfloat16 here): that is the one difference
    (docs/serving.md, the targets table)."""
    pytest.importorskip("compressed_tensors")
    from transformers import AutoModelForCausalLM
    if preset == "NVFP4":
        import compressed_tensors.quantization.utils.helpers as helpers
        original = helpers.calculate_qparams

        def in_float32(min_vals, max_vals, *args, **kwargs):
            return original(min_vals.float(), max_vals.float(), *args, **kwargs)
        for module in list(sys.modules.values()):
            if getattr(module, "calculate_qparams", None) is original:
                monkeypatch.setattr(module, "calculate_qparams", in_float32)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(_llama().config, dtype=torch.bfloat16).eval()
    assert model.model.rotary_emb.inv_freq.dtype == torch.float32
    model = _calibrated(fakequant.quantize_model(model, preset=preset, target="vllm"))
    fakequant.export_checkpoint(model, tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, theirs = model(input_ids=ids).logits, loaded(input_ids=ids).logits
    assert bits_equal(theirs, ours)
