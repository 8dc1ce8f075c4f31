"""A small Llama tokenizer of the kind transformers holds for a model whose tokenizer was a
SentencePiece BPE model (tests/test_serve_gguf.py, tools/llama_cpp_check.py): tokenizer.json
with a BPE model with byte fallback, ``<unk>``, ``<s>``, ``</s>``, the 256 byte tokens, then the
pieces; its merges are every pair of pieces that makes a piece, ordered by the piece made, as
transformers' own ``generate_merges`` orders them when it converts a SentencePiece model. The
pieces are learnt by the tokenizers library's BPE trainer from words with shared parts (so that
the order of the merges matters), digits, punctuation and non-ASCII letters."""
import numpy as np

PARTS = ["na", "me", "es", "am", "s", "ti", "on", "re", "in", "er", "an", "de", "ar", "st", "ou", "el", "é", "ü",
         "ß", "lo", "ka", "4", "2", ",", "."]


def corpus(n_words=3000, seed=0):
    """Lines of 12 words, each 1 to 4 of PARTS."""
    rng = np.random.default_rng(seed)
    words = ["".join(rng.choice(PARTS, rng.integers(1, 5))) for _ in range(n_words)]
    return [" ".join(words[i:i + 12]) for i in range(0, len(words), 12)]


def sentencepiece_style_tokenizer(vocab_size=600, add_bos_token=True):
    import tokenizers
    import transformers
    from transformers.tokenization_utils_base import generate_merges
    trainer = tokenizers.Tokenizer(tokenizers.models.BPE(byte_fallback=True))
    trainer.pre_tokenizer = tokenizers.pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    trainer.train_from_iterator(corpus(), tokenizers.trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False))
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{b:02X}>": 3 + b for b in range(256)}}
    for piece, _ in sorted(trainer.get_vocab().items(), key=lambda item: item[1]):
        vocab.setdefault(piece, len(vocab))
    return transformers.LlamaTokenizer(vocab=vocab, merges=generate_merges(vocab), add_bos_token=add_bos_token)
