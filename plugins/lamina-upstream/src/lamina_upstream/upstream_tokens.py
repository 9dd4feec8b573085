"""An upstream's ``/tokenize`` and ``/detokenize``, in its engine's shapes.

vLLM and Lamina take vLLM's bodies: a completion's ``prompt`` or a chat's ``messages``, with
``add_special_tokens`` and ``add_generation_prompt``; they answer ``tokens``, and ``prompt`` for
a detokenization. llama-server tokenizes text only (``content``, ``add_special``; it answers
``tokens``) and detokenizes to ``content``; a chat is rendered first by its ``/apply-template``
(answering ``prompt``), and that text is tokenized with special tokens added, as its chat
completions tokenize it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from lamina_hookspecs.errors import BackendLostError
from lamina_hookspecs.types import Request
from lamina_upstream.options import Engine
from lamina_upstream.upstream_body import upstream_messages

TOKENIZE_PATH = "/tokenize"
DETOKENIZE_PATH = "/detokenize"
TEMPLATE_PATH = "/apply-template"
"""llama-server's chat template alone: ``messages`` in, the rendered ``prompt`` out."""


def template_body(request: Request, add_generation_prompt: bool) -> dict[str, Any]:
    """What llama-server's `TEMPLATE_PATH` renders ``request``'s messages from."""
    return {"messages": upstream_messages(request), "add_generation_prompt": add_generation_prompt}


def tokenize_body(request: Request, model: str, engine: Engine, *, add_special_tokens: bool,
                  add_generation_prompt: bool, rendered: str | None = None) -> dict[str, Any]:
    """The `TOKENIZE_PATH` body for ``request``'s prompt text or messages; for llama-server, a chat's
    ``rendered`` template text (from `TEMPLATE_PATH`)."""
    if engine == "llama-server":
        if request.messages is not None:
            assert rendered is not None
            return {"content": rendered, "add_special": True}
        return {"content": request.prompt or "", "add_special": add_special_tokens}
    body: dict[str, Any] = {"model": model, "add_special_tokens": add_special_tokens}
    if request.messages is not None:
        body |= {"messages": upstream_messages(request), "add_generation_prompt": add_generation_prompt}
    else:
        body["prompt"] = request.prompt or ""
    return body


def detokenize_body(token_ids: Sequence[int], model: str, engine: Engine) -> dict[str, Any]:
    ids = list(token_ids)
    return {"tokens": ids} if engine == "llama-server" else {"model": model, "tokens": ids}


def answer(payload: Mapping[str, Any], key: str, kind: type, url: str) -> Any:
    """``payload[key]``, checked to be a ``kind`` (a list of ids, a string)."""
    value = payload.get(key)
    if not isinstance(value, kind) or (kind is list and not all(isinstance(t, int) for t in value)):
        raise BackendLostError(f"upstream {url} answered without {key!r} as a {kind.__name__}")
    return value
