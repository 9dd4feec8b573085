"""Structured output: a request's `StructuredOutput` as a grammar matcher, and the tokens it allows next.

The grammars are llguidance's (the maintained Rust engine llama.cpp and vLLM use, with Python
bindings and no torch): it compiles JSON Schemas, regular expressions and Lark or GBNF grammars
against the model's vocabulary, and for each step writes a bitmask of the tokens that keep the text
a prefix of a sentence (``[rows, ceil(vocab / 32)]`` int32, bit ``t % 32`` of word ``t // 32`` set
when token ``t`` may follow), in tens of microseconds per row. The sampler applies the mask on the
device (`sampling.SamplingBatch.allowed`); the output processor advances the matcher by each token.
"""

from __future__ import annotations

import json

import llguidance
import llguidance.numpy
from llguidance.gbnf_to_lark import any_to_lark

from lamina_hookspecs.errors import InvalidRequestError
from lamina_hookspecs.types import StructuredOutput
from lamina_jax.tokenizer import Tokenizer

Matcher = llguidance.LLMatcher

JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
"""JSON as models usually write it (``{"a": 1, "b": 2}``), with no free whitespace to wander in; a
schema's own ``x-guidance`` options override it."""


def mask_words(vocab_size: int) -> int:
    """Words of one row's token bitmask."""
    return (vocab_size + 31) // 32


def _grammar(structured: StructuredOutput) -> str:
    """llguidance's grammar for ``structured``."""
    kind = structured.kind
    if kind == "json":
        return Matcher.grammar_from_json_schema(structured.spec, defaults=JSON_LAYOUT)
    if kind == "json_object":
        return Matcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_LAYOUT)
    if kind == "regex":
        return Matcher.grammar_from_regex(structured.spec)
    if kind == "choice":  # Lark string literals take JSON's escapes
        return Matcher.grammar_from_lark("start: " + " | ".join(json.dumps(c, ensure_ascii=False)
                                                                 for c in structured.choices))
    return Matcher.grammar_from_lark(any_to_lark(structured.spec))


class Grammars:
    """Compiles structured-output constraints against one model's vocabulary.

    :param tokenizer: the model's tokenizer; its end-of-generation ids end a complete sentence.
    :param vocab_size: the model's vocabulary (its logits' width), which may exceed the tokenizer's.
    """

    def __init__(self, tokenizer: Tokenizer, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self._tokenizer = llguidance.LLTokenizer(tokenizer.backend.to_str(), n_vocab=vocab_size,
                                                 eos_token=sorted(tokenizer.eos_ids))

    def matcher(self, structured: StructuredOutput) -> Matcher:
        """A fresh matcher for ``structured``; a 400 naming its field when it does not compile."""
        try:
            grammar = _grammar(structured)
        except ValueError as error:
            raise InvalidRequestError(f"{structured.param}: {error}", param=structured.param) from error
        matcher = Matcher(self._tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise InvalidRequestError(f"{structured.param}: {matcher.get_error().strip()}", param=structured.param)
        return matcher


def fill_mask(matcher: Matcher, masks: llguidance.numpy.NDArray, row: int) -> None:
    """Write the tokens ``matcher`` allows next into row ``row`` of the bitmask ``masks``."""
    llguidance.numpy.fill_next_token_bitmask(matcher, masks, row)


def advance(matcher: Matcher, token: int) -> bool:
    """Take ``token`` (one the mask allowed); True when the text is complete and nothing but the end may follow."""
    if not matcher.consume_token(token):
        raise RuntimeError(f"the grammar refused token {token}, which its mask allowed: {matcher.get_error()}")
    return matcher.is_stopped()
