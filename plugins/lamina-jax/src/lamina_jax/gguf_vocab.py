"""A Hugging Face ``tokenizers`` tokenizer rebuilt from a GGUF file's ``tokenizer.*`` metadata.

Two vocabulary types, as llama.cpp names them in ``tokenizer.ggml.model``:

- ``gpt2``: byte-level BPE from the token list and merges. The pre-tokenizer follows
  ``tokenizer.ggml.pre`` as llama.cpp's does: the GPT-2 regex; Llama 3's (``llama-bpe`` and its
  aliases: contractions case-insensitive, numbers in runs of up to three digits); Qwen2's (the
  same with single digits, after NFC normalization); or, for SmolLM and the StarCoder family it
  derives from, every digit on its own before the GPT-2 regex.
- ``llama``: a SentencePiece BPE vocabulary (Llama 2, Mistral, TinyLlama) with byte-fallback
  tokens ``<0x00>``…: the merges are derived from the pieces' scores the way transformers'
  ``SentencePieceExtractor`` derives them, a ``▁`` is prepended and spaces become ``▁``, and the
  decoder undoes that and the byte fallback, as transformers' ``LlamaConverter`` sets it up.

Control tokens (and the unknown token) become special added tokens and user-defined ones plain
added tokens, as transformers makes them, so text
written in a prompt (``<|im_start|>``) encodes to their single id.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import tokenizers
from tokenizers import decoders, models, normalizers, pre_tokenizers

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
"""llama.cpp's token types (``tokenizer.ggml.token_type``)."""

LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
GPT2_PRE = frozenset({"gpt2", "default"})
DIGIT_SPLIT_PRE = frozenset({"smollm", "starcoder", "refact", "codeshell"})
LLAMA3_PRE = frozenset({"llama-bpe", "llama3", "llama-v3", "falcon3", "pixtral"})
QWEN2_PRE = frozenset({"qwen2", "deepseek-r1-qwen", "megrez"})
PRE_TOKENIZERS = sorted(GPT2_PRE | DIGIT_SPLIT_PRE | LLAMA3_PRE | QWEN2_PRE)
VOCAB_TYPES = ("gpt2", "llama")


def check(metadata: Mapping[str, Any]) -> None:
    """Refuse a vocabulary type or pre-tokenizer this module cannot rebuild, naming the field."""
    kind = metadata.get("tokenizer.ggml.model")
    if kind not in VOCAB_TYPES:
        raise NotImplementedError(f"unsupported tokenizer.ggml.model {kind!r}: supported are {', '.join(VOCAB_TYPES)}")
    pre = metadata.get("tokenizer.ggml.pre", "default")
    if kind == "gpt2" and pre not in PRE_TOKENIZERS:
        raise NotImplementedError(f"unsupported tokenizer.ggml.pre {pre!r}: supported are {', '.join(PRE_TOKENIZERS)}")


def _byte_level_pre_tokenizer(pre: str) -> tuple[normalizers.Normalizer | None, pre_tokenizers.PreTokenizer]:
    """The normalizer and pre-tokenizer of a ``gpt2`` vocabulary with pre-tokenizer ``pre``."""
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in GPT2_PRE:
        return None, byte_level
    if pre in DIGIT_SPLIT_PRE:
        return None, pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    regex = LLAMA3_REGEX if pre in LLAMA3_PRE else QWEN2_REGEX
    split = pre_tokenizers.Split(tokenizers.Regex(regex), behavior="isolated", invert=False)
    return (normalizers.NFC() if pre in QWEN2_PRE else None,
            pre_tokenizers.Sequence([split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]))


def spm_merges(tokens: Sequence[str], scores: Sequence[float]) -> list[tuple[str, str]]:
    """BPE merges equivalent to SentencePiece's merging by score: every split of a piece into two
    pieces of the vocabulary, the best-scored results first (transformers' ``generate_merges``)."""
    vocab = {token: i for i, token in enumerate(tokens)}
    merges: list[tuple[str, str, float]] = []
    for piece, score in zip(tokens, scores, strict=True):
        local = [(piece[:i], piece[i:], score) for i in range(1, len(piece))
                 if piece[:i] in vocab and piece[i:] in vocab]
        merges.extend(sorted(local, key=lambda m: (vocab[m[0]], vocab[m[1]])))
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(left, right) for left, right, _ in merges]


def _spm(tokens: list[str], metadata: Mapping[str, Any]) -> tokenizers.Tokenizer:
    scores = metadata.get("tokenizer.ggml.scores") or [0.0] * len(tokens)
    unk_id = metadata.get("tokenizer.ggml.unknown_token_id")
    backend = tokenizers.Tokenizer(models.BPE(
        vocab={token: i for i, token in enumerate(tokens)}, merges=spm_merges(tokens, scores),
        unk_token=None if unk_id is None else tokens[int(unk_id)], fuse_unk=True, byte_fallback=True))
    if metadata.get("tokenizer.ggml.add_space_prefix", True):
        backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    else:
        backend.normalizer = normalizers.Replace(" ", "▁")
    backend.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         *([decoders.Strip(" ", 1, 0)]
                                           if metadata.get("tokenizer.ggml.add_space_prefix", True) else [])])
    return backend


def _byte_level(tokens: list[str], metadata: Mapping[str, Any]) -> tokenizers.Tokenizer:
    merges = [tuple(merge.split(" ", 1)) for merge in metadata["tokenizer.ggml.merges"]]
    backend = tokenizers.Tokenizer(
        models.BPE(vocab={token: i for i, token in enumerate(tokens)}, merges=merges, fuse_unk=False))
    normalizer, backend.pre_tokenizer = _byte_level_pre_tokenizer(metadata.get("tokenizer.ggml.pre", "default"))
    if normalizer is not None:
        backend.normalizer = normalizer
    backend.decoder = decoders.ByteLevel()
    return backend


def build(metadata: Mapping[str, Any]) -> tokenizers.Tokenizer:
    """The tokenizer of the file's vocabulary, with no post-processor (BOS is the caller's)."""
    check(metadata)
    tokens: list[str] = list(metadata["tokenizer.ggml.tokens"])
    backend = (_byte_level if metadata["tokenizer.ggml.model"] == "gpt2" else _spm)(tokens, metadata)
    types: Sequence[int] = metadata.get("tokenizer.ggml.token_type", [])
    backend.add_special_tokens([tokenizers.AddedToken(tokens[i], special=True, normalized=False)
                                for i, kind in enumerate(types) if kind in (CONTROL, UNKNOWN)])
    backend.add_tokens([tokenizers.AddedToken(tokens[i], special=False, normalized=False)
                        for i, kind in enumerate(types) if kind == USER_DEFINED])
    return backend


END_OF_GENERATION = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>",
                     "<EOT>", "<|end_of_text|>")
"""Control tokens llama.cpp ends a generation at besides the file's EOS, EOT and EOM ids."""


def end_ids(metadata: Mapping[str, Any]) -> frozenset[int]:
    """Every id that ends a generation: the EOS, EOT and EOM ids the file names, and the control
    tokens among `END_OF_GENERATION`, as llama.cpp's vocabulary loader collects them."""
    ids = {int(metadata[key]) for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                                          "tokenizer.ggml.eom_token_id") if key in metadata}
    tokens, types = metadata["tokenizer.ggml.tokens"], metadata.get("tokenizer.ggml.token_type", [])
    ids |= {i for i, kind in enumerate(types) if kind == CONTROL and tokens[i] in END_OF_GENERATION}
    return frozenset(ids)
