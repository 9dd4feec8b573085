"""The key ``prefix-affinity`` hashes: a request's tenant and the start of its prompt.

The tenant salts the hash, so one tenant's prompts are placed independently of another's:
a prompt many tenants share does not pile them all onto one backend, and where one tenant's
prefix lands says nothing about where another's does (each tenant's KV is cached apart
anyway, see :class:`~lamina_hookspecs.protocols.PrefixCache`'s ``salt``). The prompt part is, for token ids, the first
``prefix_blocks`` whole blocks of ``block_tokens`` ids (all of them when not even one block
is whole): a partial block is never cached, so leaving it out keeps requests that share
their cacheable prefix together. For text, it is the first ``prefix_blocks * block_tokens
* 4`` UTF-8 bytes (about 4 bytes a token) of the prompt, or of the chat messages rendered
one after another as role and content, so conversations sharing a system prompt and early
turns share a key.
"""

from __future__ import annotations

from collections.abc import Sequence
from hashlib import blake2b

from lamina_hookspecs.estimate import BYTES_PER_TOKEN
from lamina_hookspecs.types import ChatMessage, Request


def prefix_key(request: Request, *, prefix_blocks: int, block_tokens: int) -> int:
    """The request's 64-bit position on the ring."""
    digest = blake2b(digest_size=8)
    tenant = request.tenant.encode()
    digest.update(len(tenant).to_bytes(4, "big"))
    digest.update(tenant)
    if request.prompt_token_ids is not None:
        ids = request.prompt_token_ids
        whole = min(prefix_blocks, len(ids) // block_tokens) * block_tokens
        digest.update(b"ids:" + repr(ids[:whole or len(ids)]).encode())
    else:
        digest.update(b"text:" + _leading_bytes(request, prefix_blocks * block_tokens * BYTES_PER_TOKEN))
    return int.from_bytes(digest.digest(), "big")


def _leading_bytes(request: Request, size: int) -> bytes:
    """The first ``size`` UTF-8 bytes of the prompt or rendered messages, encoding no more
    than that many characters of each."""
    if request.prompt is not None:
        return request.prompt[:size].encode()[:size]
    return _render(request.messages or (), size)[:size]


def _render(messages: Sequence[ChatMessage], size: int) -> bytes:
    parts: list[bytes] = []
    total = 0
    for message in messages:
        part = f"{message.role}\n{message.content[:size]}\n".encode()
        parts.append(part)
        total += len(part)
        if total >= size:
            break
    return b"".join(parts)
