"""llama.cpp, through llama-cpp-python, on GGUF files: run by tools/llama_cpp_check.py with the
Python of the virtualenv that `make llama-check` builds (.venv-llama: llama-cpp-python and numpy,
nothing of fakequant's).

    python tools/llama_cpp_run.py JOB.json

JOB.json: {"files": [...], "ids": [token ids], "strings": [...], "out": DIR}. For each file it
writes DIR/<file stem>.npz: ``logits``, every position's logits for ``ids`` (one thread, float32
KV cache, no flash attention), and ``tokens_<i>``, llama.cpp's tokenization of ``strings[i]``
(``llama_tokenize`` with add_special: BOS where the file says so).
"""
import json
import pathlib
import sys

import numpy as np
from llama_cpp import Llama

GGML_TYPE_F32 = 0


def main(job_path: str) -> None:
    job = json.loads(pathlib.Path(job_path).read_text())
    out = pathlib.Path(job["out"])
    ids = [int(i) for i in job["ids"]]
    for path in job["files"]:
        llm = Llama(model_path=path, n_ctx=max(64, len(ids)), n_batch=max(64, len(ids)), n_ubatch=max(64, len(ids)),
                    n_threads=1, n_threads_batch=1, logits_all=True, flash_attn=False,
                    type_k=GGML_TYPE_F32, type_v=GGML_TYPE_F32, verbose=False)
        llm.eval(ids)
        result = {"logits": np.array(llm.scores[: len(ids)], dtype=np.float32)}
        for i, text in enumerate(job["strings"]):
            result[f"tokens_{i}"] = np.array(llm.tokenize(text.encode("utf-8"), add_bos=True, special=False),
                                             dtype=np.int64)
        np.savez(out / (pathlib.Path(path).stem + ".npz"), **result)
        del llm


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
