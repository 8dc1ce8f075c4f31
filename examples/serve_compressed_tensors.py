"""Export a random-init Llama in every compressed-tensors preset and reload it through
transformers + compressed-tensors: the table of docs/serving.md (format, file size against
the bfloat16 checkpoint, largest weight difference of the dequantized and of the compressed
load, logits difference of the compressed load against fakequant's eval-mode model).

    python examples/serve_compressed_tensors.py [--hidden 512 --layers 4 --vocab 1024] [--target vllm] [--out DIR]

``--target`` is ``quantize_model``'s (default ``onnx``): with ``vllm`` the fake quantization
follows vLLM's rules (docs/serving.md, "Targets"), and an NVFP4 float32 model is tried too.

Needs ``pip install 'fakequant[serve]'``. Runs on the CPU in about a minute at hidden 512.
"""
import argparse
import logging
import os
import tempfile
import warnings

os.environ.setdefault("TQDM_DISABLE", "1")  # (compressed-tensors' progress bars)

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM, CompressedTensorsConfig  # noqa: E402

import fakequant  # noqa: E402

# (preset, model dtype): FP4 and MX formats in bfloat16 (compressed-tensors decompresses them to it)
RUNS = [("W8A8", torch.float32), ("W8A8", torch.bfloat16), ("INT8", torch.float32), ("INT8", torch.bfloat16),
        ("W4A8", torch.float32), ("W4A16", torch.float32), ("W4A16", torch.bfloat16), ("FP8", torch.float32),
        ("FP8", torch.bfloat16), ("FP8_PER_CHANNEL", torch.float32), ("FP8_PER_CHANNEL", torch.bfloat16),
        ("NVFP4", torch.bfloat16), ("MXFP8", torch.bfloat16), ("MXFP4", torch.bfloat16)]
# the vllm target's NVFP4 global scale is compressed-tensors' own: a float32 model is tried as well
VLLM_RUNS = RUNS[:11] + [("NVFP4", torch.float32)] + RUNS[11:]


def to_dtype(model, dtype):
    """``model.to(dtype)`` with its rotary frequencies (the ``inv_freq`` buffers) kept as they were,
    float32: what a load with ``from_pretrained(..., dtype=...)`` has (transformers computes them
    in float32 and a checkpoint does not store them). ``model.to(torch.bfloat16)`` alone rounds them
    to bfloat16, and the model's RoPE with them: its attention then differs from the loaded
    model's, whatever the quantization."""
    kept = {name: b for name, b in model.named_buffers()
            if name.rpartition(".")[2] in ("inv_freq", "original_inv_freq")}
    model.to(dtype)
    for name, b in kept.items():
        owner, _, attr = name.rpartition(".")
        setattr(model.get_submodule(owner), attr, b)
    return model


def make(args, dtype, hidden):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=args.layers,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=args.vocab, bos_token_id=0, eos_token_id=0,
        pad_token_id=0)
    return to_dtype(transformers.LlamaForCausalLM(config), dtype).eval()


def size(directory):
    return sum(os.path.getsize(os.path.join(directory, f)) for f in os.listdir(directory) if f.endswith(".safetensors"))


def largest_diff(model, other):
    worst = 0.0
    for name, module in model.named_modules():
        if isinstance(module, fakequant.nn.QuantLinear):
            with torch.no_grad():
                fake = module.weight_quantizer(module.weight)
            worst = max(worst, (other.get_submodule(name).weight.float() - fake.float()).abs().max().item())
    return worst


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--target", default="onnx", choices=("onnx", "vllm"),
                        help="quantize_model's target (default onnx)")
    parser.add_argument("--out", default=None, help="where to write the checkpoints (default: a temporary folder)")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    transformers.utils.logging.disable_progress_bar()
    out = args.out or tempfile.mkdtemp(prefix="fakequant-serve-")
    base_sizes = {}

    def base_size(hidden):  # the bfloat16 checkpoint of the same model
        if hidden not in base_sizes:
            base = os.path.join(out, f"bf16-{hidden}")
            make(args, torch.bfloat16, hidden).save_pretrained(base)
            base_sizes[hidden] = size(base)
            print(f"bf16 checkpoint: {size(base)} bytes (hidden {hidden}, {args.layers} layers, vocabulary {args.vocab})")
        return base_sizes[hidden]

    base_size(args.hidden)
    print("| preset | model dtype | format | safetensors bytes (x bf16) | weights, dequantized load | "
          "weights, compressed load | logits, compressed load (of the largest) |")
    print("|---|---|---|---|---|---|---|")
    print(f"target: {args.target}")
    for preset, dtype in (VLLM_RUNS if args.target == "vllm" else RUNS):
        # W4A16's groups of 128 input features: its model is at least 128 wide
        hidden = -(-args.hidden // 128) * 128 if preset == "W4A16" else args.hidden
        model = fakequant.quantize_model(make(args, dtype, hidden), preset=preset, target=args.target)
        data = [torch.randint(0, args.vocab, (2, 8), generator=torch.Generator().manual_seed(i)) for i in range(2)]
        fakequant.calibrate(model, data, progress=False, forward_fn=lambda m, ids: m(input_ids=ids))
        directory = os.path.join(out, f"{preset}-{str(dtype).split('.')[1]}")
        try:
            config = fakequant.export_checkpoint(model, directory)
        except ValueError as e:
            print(f"| {preset} | {str(dtype).split('.')[1]} | refused: {str(e)[:160]} | | | | |", flush=True)
            continue
        dense = AutoModelForCausalLM.from_pretrained(directory, quantization_config=CompressedTensorsConfig(dequantize=True))
        compressed = AutoModelForCausalLM.from_pretrained(directory)
        ids = torch.randint(0, args.vocab, (2, 16), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            ours = model(input_ids=ids).logits
            try:
                theirs = compressed(input_ids=ids).logits  # (decompresses the weights first)
            except RuntimeError as e:  # (compressed-tensors 0.20 runs FP4 weights in bfloat16 only)
                print(f"| {preset} | {str(dtype).split('.')[1]} | {config['format']} | {size(directory)} | "
                      f"{largest_diff(model, dense):.3g} | | the compressed load fails: {str(e)[:100]} |", flush=True)
                continue
        diff = (theirs.float() - ours.float()).abs().max().item()
        exact = " (bit for bit)" if torch.equal(theirs, ours) else ""
        print(f"| {preset}{'' if hidden == args.hidden else f' (hidden {hidden})'} | {str(dtype).split('.')[1]} | "
              f"{config['format']} | {size(directory)} ({size(directory) / base_size(hidden):.2f}x) | {largest_diff(model, dense):.3g} | "
              f"{largest_diff(model, compressed):.3g} | {diff:.3g} ({diff / ours.float().abs().max().item():.2%}){exact} |",
              flush=True)


if __name__ == "__main__":
    main()
