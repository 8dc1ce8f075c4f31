"""GGUF export (llama.cpp, Ollama): a model trained with the GGUF presets, written as llama.cpp
loads it.

Quantized Linear weights become the Q8_0 or Q4_0 blocks their quantizer trained on
(``GGUF_Q8_0`` / ``GGUF_Q4_0``: :func:`fakequant.ops.fake_quantize_ggml`); every other tensor is
written in the model's own float type by default (F32, F16 or BF16: what was trained), or as F16
or F32 on request. Tensor names and metadata keys are gguf's own (``gguf.TensorNameMap``,
``gguf.Keys`` through ``gguf.GGUFWriter``), blocks are made by ``gguf.quants.quantize``, and
the export checks, tensor by tensor, that ``gguf.quants.dequantize`` of what it writes is the
model's fake-quantized weight bit for bit. docs/serving_gguf.md has the mapping and the
llama.cpp command to run next.

The model is walked into its quantized Linear layers by what every format shares
(``_plan.py``); this module is the format, ``GGUF`` (registered as ``"gguf"``): how it
stores one planned layer (its blocks), and the file.
"""
from __future__ import annotations

import json
import os
import pathlib
import tempfile
import warnings
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np
import torch

from .._core import GGML_BLOCK_TYPES, BlockScales
from ..nn import TensorQuantizer
from ._base import ServingFormat, format_named, register
from ._plan import plan_model

__all__ = ["export_gguf", "ARCHITECTURES"]

#: transformers ``config.model_type`` -> (gguf ``MODEL_ARCH`` member name, whether the q/k
#: projections are stored with llama.cpp's row order for its RoPE). Mistral is converted as
#: Llama by llama.cpp's converter; Qwen2's q/k rows are stored as transformers has them.
ARCHITECTURES: Dict[str, Tuple[str, bool]] = {
    "llama": ("LLAMA", True),
    "mistral": ("LLAMA", True),
    "qwen2": ("QWEN2", False),
}

FLOAT_TYPES = ("auto", "f16", "f32")
#: float_type="auto": the GGML type that holds a tensor of each torch dtype exactly
_EXACT_TYPE = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}
BLOCK = 32  # the block length of Q8_0 and Q4_0 (gguf.GGML_QUANT_SIZES)


def _ggml_type(q: TensorQuantizer, role: str) -> Optional[str]:
    """The GGML block type ("Q8_0"/"Q4_0") that quantizer ``q`` of a Linear's ``role`` ("weight",
    "input") computes, from its public configuration; None if it computes something else."""
    axes = ({-1: BLOCK}, {1: BLOCK}) if role == "weight" else ({-1: BLOCK},)
    if (q.scale_format is not BlockScales.GGML or q.block_sizes not in axes or not q.dynamic or not q.fake_quant
            or q.pre_quant_scale is not None or q.num_bits not in GGML_BLOCK_TYPES):
        return None
    assert isinstance(q.num_bits, int)  # (a key of GGML_BLOCK_TYPES)
    kind = GGML_BLOCK_TYPES[q.num_bits]
    if role == "input" and kind != "Q8_0":
        return None  # llama.cpp rounds the inputs of Q8_0/Q4_0 matmuls to Q8_0
    return kind


@register
class GGUF(ServingFormat):
    """GGUF (llama.cpp): each layer's weight as the Q8_0 or Q4_0 blocks of ``gguf.quants``; its
    inputs, Q8_0 blocks where quantized (what llama.cpp computes), have nothing to write."""

    name = "gguf"
    package = "gguf"
    distribution = "gguf"

    def _kind(self, where: str, q: TensorQuantizer, role: str) -> str:
        kind = _ggml_type(q, role)
        if kind is None:
            raise self.refuse(where, f"({q.extra_repr()}) has no GGUF form: GGUF holds the weights of Linear "
                                     "layers quantized with the GGUF_Q8_0 or GGUF_Q4_0 preset (their input quantizers "
                                     "Q8_0 blocks of 32, as llama.cpp computes); disable() it or re-quantize the model")
        return kind

    def weight(self, where: str, q: Any, weight: torch.Tensor
               ) -> Tuple[Dict[str, Any], Dict[str, torch.Tensor], torch.Tensor]:
        """({"type": "Q8_0" or "Q4_0"}, {"weight": the blocks, uint8 (out, bytes per row)},
        ``gguf.quants.dequantize`` of the blocks)."""
        kind = self._kind(where, q, "weight")
        if weight.shape[1] % BLOCK:
            raise self.refuse(where, f"in_features={weight.shape[1]}, not a multiple of {BLOCK}: {kind} rows are "
                                     f"whole blocks of {BLOCK}")
        gguf = self.library()
        qtype = gguf.GGMLQuantizationType[kind]
        blocks = gguf.quants.quantize(weight.detach().cpu().float().numpy(), qtype)
        dequantized = torch.from_numpy(gguf.quants.dequantize(blocks, qtype))
        return {"type": kind}, {"weight": torch.from_numpy(blocks)}, dequantized

    def input(self, where: str, q: Any) -> Tuple[Optional[Dict[str, Any]], Dict[str, torch.Tensor]]:
        return (None if not q.is_enabled else {"type": self._kind(where, q, "input")}), {}

    def export(self, model: torch.nn.Module, directory: Any, **kwargs: Any) -> pathlib.Path:
        return export_gguf(model, directory, **kwargs)


def _rope(config: Any) -> Tuple[float, Optional[float]]:
    """(RoPE base, linear scaling factor or None) of a transformers config (transformers 5's
    ``rope_parameters`` or the older ``rope_theta`` / ``rope_scaling``)."""
    params = dict(getattr(config, "rope_parameters", None) or {})
    scaling = dict(getattr(config, "rope_scaling", None) or {})
    theta = params.get("rope_theta", getattr(config, "rope_theta", None))
    if theta is None:
        raise ValueError("export_gguf: the model's config has no RoPE base (rope_theta)")
    kind = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    if kind == "default":
        return float(theta), None
    factor = params.get("factor", scaling.get("factor"))
    if kind == "linear" and factor is not None:
        return float(theta), float(factor)
    raise ValueError(f"export_gguf: RoPE type {kind!r} is not written by this exporter (it writes 'default' "
                     "and 'linear'); llama.cpp's convert_hf_to_gguf.py converts the others")


def _llama_rows(t: torch.Tensor, heads: int) -> torch.Tensor:
    """q/k projection rows (or bias) in llama.cpp's order: within each head, the two halves of
    the rotary dimensions interleaved (transformers rotates halves, llama.cpp adjacent pairs)."""
    half = t.shape[0] // heads // 2
    return t.reshape(heads, 2, half, *t.shape[1:]).transpose(1, 2).reshape(t.shape)


def _merge_scores(tokenizer_json: Dict[str, Any], tokens: List[bytes]) -> Tuple[List[float], List[str]]:
    """The ``tokenizer.ggml.scores`` of a Llama-style (SentencePiece BPE, byte fallback)
    ``tokenizer.json`` for llama.cpp's ``llama`` tokenizer, which merges, again and again, the
    adjacent pair whose concatenation is the vocabulary token of highest score (leftmost on ties):
    the token that merge number ``rank`` of ``model.merges`` makes scores ``-rank`` (its first,
    the merges being in priority order), so that llama.cpp applies the merges in the
    tokenizer's order; a token no merge makes (characters, bytes, special tokens) scores below
    every merge. Also returns the pairs that llama.cpp would merge and the tokenizer would not
    (two tokens whose concatenation is a token, with no merge for them: none in a tokenizer
    converted from SentencePiece, whose merges are every such pair)."""
    model = tokenizer_json["model"]
    vocab: Dict[str, int] = model["vocab"]
    floor = float(-len(model.get("merges") or ()))
    scores = [floor] * len(tokens)
    pairs = set()
    for rank, merge in enumerate(model.get("merges") or ()):
        left, right = merge.split(" ", 1) if isinstance(merge, str) else merge
        pairs.add((left, right))
        made = vocab.get(left + right)
        if made is None or made >= len(tokens) or tokens[made] != (left + right).encode("utf-8"):
            raise ValueError(f"export_gguf: the tokenizer's merge {left!r} + {right!r} makes no token of its "
                             "vocabulary (tokenizer.json's model.merges)")
        if scores[made] == floor:
            scores[made] = float(-rank)
    unmerged = []
    for text in vocab:
        for cut in range(1, len(text)):
            if text[:cut] in vocab and text[cut:] in vocab and (text[:cut], text[cut:]) not in pairs:
                unmerged.append(f"{text[:cut]!r} + {text[cut:]!r}")
    return scores, unmerged


def _vocab(gguf: Any, tokenizer: Any, n_vocab: int) -> Tuple[str, List[bytes], List[float], List[int], Any]:
    """(tokenizer model, tokens, scores, token types, gguf.SpecialVocab) of a transformers tokenizer,
    read by gguf's own vocab classes from the tokenizer's saved files; padded to the model's
    vocabulary with unused tokens. A Llama-style tokenizer's scores are its merges'
    (:func:`_merge_scores`): gguf's ``LlamaHfVocab`` writes -1000 for every token, with which
    llama.cpp merges left to right instead of in the tokenizer's order."""
    if not hasattr(tokenizer, "save_pretrained"):
        raise TypeError(f"export_gguf: tokenizer must be a transformers tokenizer (save_pretrained), "
                        f"got {type(tokenizer).__name__}")
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save_pretrained(tmp)
        base = pathlib.Path(tmp)
        vocab = None
        errors = []
        for cls in (gguf.vocab.BpeVocab, gguf.vocab.LlamaHfVocab):
            try:
                vocab = cls(base)
                break
            except (FileNotFoundError, ValueError, TypeError, KeyError) as e:
                errors.append(f"{cls.__name__}: {e}")
        if vocab is None:
            raise ValueError("export_gguf: gguf's vocab classes cannot read this tokenizer (" + "; ".join(errors) + ")")
        tokens, scores, types = [], [], []
        for text, score, kind in vocab.all_tokens():
            tokens.append(text if isinstance(text, bytes) else str(text).encode("utf-8"))
            scores.append(float(score))
            types.append(int(kind))
        if vocab.tokenizer_model == "llama":
            with open(base / "tokenizer.json", encoding="utf-8") as f:
                scores, unmerged = _merge_scores(json.load(f), tokens)
            if unmerged:
                warnings.warn(f"export_gguf: llama.cpp merges any two adjacent tokens whose concatenation is a token; "
                              f"the tokenizer has no merge for {len(unmerged)} such pairs ({', '.join(unmerged[:3])}"
                              f"{', ...' if len(unmerged) > 3 else ''}), so llama.cpp may tokenize some text "
                              "differently from it (a tokenizer converted from SentencePiece has them all)",
                              stacklevel=3)
        if len(tokens) > n_vocab:
            raise ValueError(f"export_gguf: the tokenizer has {len(tokens)} tokens, the model's vocab_size is {n_vocab}")
        for i in range(len(tokens), n_vocab):
            tokens.append(f"[PAD{i}]".encode("utf-8"))
            scores.append(-1000.0)
            types.append(int(gguf.TokenType.UNUSED))
        special = gguf.vocab.SpecialVocab(base, load_merges=vocab.tokenizer_model == "gpt2", n_vocab=n_vocab)
    # whether llama.cpp adds BOS / EOS as the tokenizer does (llama.cpp's default, where the file
    # says nothing, is to add BOS for a "llama" tokenizer): from what the tokenizer does
    plain = list(tokenizer("a", add_special_tokens=False)["input_ids"])
    full = list(tokenizer("a")["input_ids"])
    for kind, at in (("bos", slice(None, 1)), ("eos", slice(-1, None))):
        token_id = getattr(tokenizer, f"{kind}_token_id", None)
        special.add_special_token[kind] = token_id is not None and full[at] == [token_id] and plain[at] != [token_id]
    return vocab.tokenizer_model, tokens, scores, types, special


def export_gguf(model: torch.nn.Module, path: Union[str, "os.PathLike[str]"], tokenizer: Any = None, *,
                float_type: str = "auto", name: Optional[str] = None, tokenizer_pre: Optional[str] = None) -> pathlib.Path:
    """Writes ``model`` (a transformers ``LlamaForCausalLM``, ``MistralForCausalLM`` or
    ``Qwen2ForCausalLM``, float or quantized with ``GGUF_Q8_0`` / ``GGUF_Q4_0``) as one GGUF file.

    Args:
        model: the model. Its enabled quantizers must be those of a GGUF preset: the weight
            quantizers of Linear layers (Q8_0 or Q4_0 blocks of 32 along the input dimension,
            ``in_features`` a multiple of 32) and their input quantizers (Q8_0 blocks, what
            llama.cpp computes anyway). Anything else raises ValueError naming the quantizer,
            before anything is written.
        path: a ``.gguf`` file, or a directory (created) that receives ``model.gguf``.
        tokenizer: a transformers tokenizer (byte-level BPE, or Llama's SentencePiece-style
            ``tokenizer.json``), written with gguf's vocab classes. None writes the tokenizer model
            ``"none"`` with the vocabulary size: llama.cpp loads the file and runs token ids, but
            cannot tokenize text.
        float_type: the type of the other 2-D tensors (embeddings, an unquantized ``lm_head``):
            ``"auto"`` (default) the parameter's own, which holds what was trained exactly (F32
            for float32, F16 for float16, BF16 for bfloat16; F32 for float64); ``"f16"`` (half the
            size of F32, but a rounding the model never saw: llama.cpp's logits then differ from
            the trained model's) or ``"f32"``. Norms and biases are F32.
        name: ``general.name``; default the config's ``_name_or_path`` when it has one.
        tokenizer_pre: ``tokenizer.ggml.pre`` for a BPE tokenizer (llama.cpp's pre-tokenizer name,
            e.g. ``"llama-bpe"``, ``"qwen2"``); default ``"default"``.

    Returns:
        the path of the file written.

    Each quantized weight is blocked by ``gguf.quants.quantize`` from the float weight, and its
    ``gguf.quants.dequantize`` is checked to equal the model's fake-quantized weight bit for bit
    (in the model's dtype) before the file is opened.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"export_gguf: model must be a torch.nn.Module, got {type(model).__name__}")
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in ARCHITECTURES:
        raise ValueError(f"export_gguf: model must be a transformers causal LM of type {sorted(ARCHITECTURES)} "
                         f"(config.model_type), got {model_type!r} ({type(model).__name__})")
    if float_type not in FLOAT_TYPES:
        raise ValueError(f"export_gguf: float_type must be one of {FLOAT_TYPES}, got {float_type!r}")
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"export_gguf: path must be a str or a path, got {type(path).__name__}")
    if name is not None and not isinstance(name, str):
        raise TypeError(f"export_gguf: name must be a str or None, got {type(name).__name__}")
    if tokenizer_pre is not None and not isinstance(tokenizer_pre, str):
        raise TypeError(f"export_gguf: tokenizer_pre must be a str or None, got {type(tokenizer_pre).__name__}")
    fmt = format_named(GGUF.name)
    gguf = fmt.library()
    assert config is not None  # (model_type was read from it)
    arch_member, llama_rows = ARCHITECTURES[model_type]
    arch = gguf.MODEL_ARCH[arch_member]

    n_layers = int(config.num_hidden_layers)
    hidden = int(config.hidden_size)
    n_head = int(config.num_attention_heads)
    n_kv = int(getattr(config, "num_key_value_heads", None) or n_head)
    head_dim = int(getattr(config, "head_dim", None) or hidden // n_head)
    n_vocab = int(config.vocab_size)
    rope_base, rope_linear = _rope(config)
    plans = plan_model(model, fmt).plans

    # --- the tensors, in memory: nothing is written before every one is made and checked ---
    names = gguf.get_tensor_name_map(arch, n_layers)
    tensors: List[Tuple[str, np.ndarray, Any]] = []  # (gguf name, data, raw GGML type or None)
    kinds = set()
    quantizers = tuple(name + "." for name, m in model.named_modules() if isinstance(m, TensorQuantizer))
    for pname, param in model.named_parameters():  # (a tied lm_head is the embedding: not repeated)
        if pname.startswith(quantizers):
            continue  # a (disabled) quantizer's own state, e.g. a learned range: not the model's
        gname = names.get_name(pname, try_suffixes=(".weight", ".bias"))
        if gname is None:
            raise ValueError(f"export_gguf: the parameter {pname} has no {arch_member} tensor in gguf's tables")
        owner, _, leaf = pname.rpartition(".")
        rows = n_head if owner.endswith("q_proj") else n_kv if owner.endswith("k_proj") else None
        # q/k rows in llama.cpp's order; a quantized weight's blocks (each within a row) move with their rows
        permute = (lambda t: _llama_rows(t, rows)) if llama_rows and rows is not None else (lambda t: t)
        if owner in plans and leaf == "weight":
            kind = plans[owner].weights["type"]
            tensors.append((gname, permute(plans[owner].tensors["weight"]).numpy(), gguf.GGMLQuantizationType[kind]))
            kinds.add(kind)
            continue
        with torch.no_grad():
            array = permute(param.detach().cpu().float()).numpy()
        if array.ndim > 1:
            ftype = _EXACT_TYPE.get(param.dtype, "F32") if float_type == "auto" else float_type.upper()
            kinds.add(ftype)
            if ftype == "BF16":  # (exact: the values are bfloat16's)
                tensors.append((gname, gguf.quants.quantize(array, gguf.GGMLQuantizationType.BF16),
                                gguf.GGMLQuantizationType.BF16))
                continue
            if ftype == "F16":
                array = array.astype(np.float16)
        tensors.append((gname, np.ascontiguousarray(array), None))

    vocab = None if tokenizer is None else _vocab(gguf, tokenizer, n_vocab)

    if "Q4_0" in kinds:
        file_type = gguf.LlamaFileType.MOSTLY_Q4_0
    elif "Q8_0" in kinds:
        file_type = gguf.LlamaFileType.MOSTLY_Q8_0
    elif "BF16" in kinds:
        file_type = gguf.LlamaFileType.MOSTLY_BF16
    elif "F16" in kinds:
        file_type = gguf.LlamaFileType.MOSTLY_F16
    else:
        file_type = gguf.LlamaFileType.ALL_F32

    target = pathlib.Path(path)
    if target.suffix != ".gguf":
        target.mkdir(parents=True, exist_ok=True)
        target = target / "model.gguf"
    writer = gguf.GGUFWriter(target, gguf.MODEL_ARCH_NAMES[arch])
    title = name if name is not None else getattr(config, "_name_or_path", "") or None
    if title:
        writer.add_name(title)
    writer.add_context_length(int(config.max_position_embeddings))
    writer.add_embedding_length(hidden)
    writer.add_block_count(n_layers)
    writer.add_feed_forward_length(int(config.intermediate_size))
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_kv)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(rope_base)
    if rope_linear is not None:
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(rope_linear)
    writer.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    writer.add_vocab_size(n_vocab)
    writer.add_file_type(int(file_type))
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    if vocab is None:
        writer.add_tokenizer_model("none")
    else:
        model_name, tokens, scores, types, special = vocab
        writer.add_tokenizer_model(model_name)
        if model_name == "gpt2":
            writer.add_tokenizer_pre(tokenizer_pre or "default")
        writer.add_token_list(tokens)
        writer.add_token_scores(scores)
        writer.add_token_types(types)
        special.add_to_gguf(writer, quiet=True)
    for gname, array, raw in tensors:
        writer.add_tensor(gname, array, raw_dtype=raw)
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()
    return target
