"""llama.cpp's logits for the GGUF files export_gguf writes, against the fakequant model's.

Needs a llama.cpp source tree and its build (libllama), which the project does not install:

    cmake -S LLAMA_CPP -B BUILD -DBUILD_SHARED_LIBS=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \\
          -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_COMMON=OFF -DLLAMA_CURL=OFF
    cmake --build BUILD --target llama
    python tools/llama_cpp_check.py LLAMA_CPP BUILD

It compiles tools/llama_cpp_logits.c against them, exports a random-init Llama (float, GGUF_Q8_0,
GGUF_Q4_0; the other tensors F32 or F16) and prints the largest logit difference per file.
"""
import os
import pathlib
import subprocess
import sys
import tempfile

import numpy as np
import torch
import transformers

import fakequant
from fakequant.serve.gguf import export_gguf

HERE = pathlib.Path(__file__).parent


def main(source: str, build: str) -> None:
    lib = pathlib.Path(build) / "bin"
    work = pathlib.Path(tempfile.mkdtemp())
    exe = work / "llama_cpp_logits"
    subprocess.run(["cc", "-O1", "-o", str(exe), str(HERE / "llama_cpp_logits.c"), f"-I{source}/include",
                    f"-I{source}/ggml/include", f"-L{lib}", "-lllama", "-lggml", "-lggml-base"], check=True)
    config = transformers.LlamaConfig(hidden_size=256, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4,
                                      vocab_size=512, intermediate_size=512, max_position_embeddings=256)
    ids = torch.randint(0, 512, (1, 24), generator=torch.Generator().manual_seed(3))

    def llama_cpp(path: pathlib.Path) -> np.ndarray:
        out = path.with_suffix(".f32")
        subprocess.run([str(exe), str(path), str(out), *map(str, ids[0].tolist())], check=True, capture_output=True,
                       env={**os.environ, "LD_LIBRARY_PATH": str(lib)})
        return np.fromfile(out, dtype=np.float32).reshape(ids.shape[1], -1)

    print("| model | other tensors | file size | max abs(llama.cpp - fakequant) | against float inputs |")
    print("|---|---|---|---|---|")
    for preset in (None, "GGUF_Q8_0", "GGUF_Q4_0"):
        for float_type in ("f32", "f16"):
            torch.manual_seed(0)
            model = transformers.LlamaForCausalLM(config).eval()
            with torch.no_grad():
                for p in model.parameters():  # weights 4x the init's, so that rounding shows
                    if p.dim() == 2:
                        p.mul_(4)
            if preset:
                fakequant.quantize_model(model, preset=preset)
            path = export_gguf(model, work / f"{preset or 'float'}-{float_type}.gguf", float_type=float_type)
            got = llama_cpp(path)
            with torch.no_grad():
                line = f"| {preset or 'float'} | {float_type.upper()} | {path.stat().st_size:,} B | "
                line += f"{np.abs(got - model(ids).logits[0].numpy()).max():.2e} | "
                if preset:
                    for name, module in model.named_modules():
                        if name.endswith("input_quantizer"):
                            module.disable()
                    line += f"{np.abs(got - model(ids).logits[0].numpy()).max():.2e}"
            print(line + " |", flush=True)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
