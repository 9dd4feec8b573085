"""The one estimate of a request's tokens before any tokenizer has seen it: what token rate limits
charge, route trees test (``prompt_tokens``), a gateway counts against its remote backends and
prefix-affinity routing hashes. Token-id prompts count exactly; text counts ~4 UTF-8 bytes a token
(the usual rule of thumb for English BPE vocabularies), and each chat message adds what a chat
template puts around it."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

BYTES_PER_TOKEN = 4
"""UTF-8 bytes of text per token, roughly."""
MESSAGE_OVERHEAD_TOKENS = 4
"""Chat-template tokens added per message (role markers, separators), roughly."""


def text_tokens(text: str) -> int:
    """The estimated tokens of ``text``."""
    return -(-len(text.encode()) // BYTES_PER_TOKEN)


def prompt_tokens(*, text: str | None = None, token_ids: Sequence[int] | None = None,
                  messages: Iterable[str] | None = None) -> int:
    """The estimated tokens of one prompt: its ``token_ids``, its ``text``, or its chat ``messages``'
    contents (the first of them given)."""
    if token_ids is not None:
        return len(token_ids)
    if text is not None:
        return text_tokens(text)
    return sum(MESSAGE_OVERHEAD_TOKENS + text_tokens(content) for content in messages or ())


def request_tokens(prompt: int, max_tokens: int | None, context_length: int, choices: int = 1) -> int:
    """The most tokens a request may cost: its ``prompt`` tokens, plus ``max_tokens`` for each of its
    ``choices`` (without a limit, each may run to the end of the context)."""
    return prompt + choices * (max_tokens if max_tokens is not None else max(context_length - prompt, 0))
