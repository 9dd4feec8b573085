"""An upstream's OpenAI stream events as Lamina :class:`~lamina_hookspecs.types.TokenChunk`\\ s.

One content event becomes one chunk: its text, and the ids of its tokens from
``choices[].token_ids`` (Lamina, vLLM) or from its logprobs entries' ``id`` (llama-server).
Logprobs are read in the chat format (``logprobs.content``, which llama-server also uses for
completions) and in the legacy completions format (``tokens`` / ``token_logprobs`` /
``top_logprobs``), and passed on only when the client asked for them. The finish reason and
usage come from the events that close the stream; the final chunk carries both.

A text-only upstream (SGLang, TGI, ``generic``) is read for its text alone (``text_only``): its
chunks carry no ids, and each content event counts as one token (engines stream one token per
event) where it reports no usage.

An engine may hold a token's text back (a possible stop string, a split UTF-8 character) and
send it later inside another token's event; such text arrives with that event's one id, or,
at the very end, with none. The chunk indexes then lag the engine's own count by those
tokens, and ``usage.completion_tokens`` is the engine's count.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from lamina_hookspecs.errors import InternalError, InvalidRequestError, LaminaError, ServiceUnavailableError
from lamina_hookspecs.types import FinishReason, TokenChunk, TopLogprob, Usage

_FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "abort"}
"""Upstream finish reasons kept as they are; any other (``tool_calls``, ``content_filter``) ends as ``stop``."""

_ERROR_TYPES: dict[str, type[LaminaError]] = {
    "invalid_request_error": InvalidRequestError,
    "service_unavailable": ServiceUnavailableError,
}


def error_from_event(error: object) -> LaminaError:
    """The Lamina error an upstream's ``{"error": {...}}`` stream event stands for."""
    fields = error if isinstance(error, Mapping) else {"message": str(error)}
    cls = _ERROR_TYPES.get(str(fields.get("type")), InternalError)
    return cls(f"upstream: {fields.get('message') or 'error without a message'}",
               code=str(fields["code"]) if fields.get("code") is not None else None)


class UpstreamStream:
    """Reads one upstream stream's events in order; :meth:`final` after the last."""

    def __init__(self, request_id: str, *, chat: bool, logprobs: bool, prompt_tokens: int,
                 text_only: bool = False) -> None:
        self.request_id, self.chat, self.logprobs, self.text_only = request_id, chat, logprobs, text_only
        self.prompt_tokens = prompt_tokens
        """The prompt's estimated tokens, reported when the upstream reports no usage."""
        self.emitted = 0
        self.finish: FinishReason | None = None
        self.usage: Mapping[str, Any] | None = None

    def event(self, payload: Mapping[str, Any]) -> TokenChunk | None:
        """The content chunk one event carries, or ``None`` (role, finish or usage only)."""
        if "error" in payload:
            raise error_from_event(payload["error"])
        if isinstance(payload.get("usage"), Mapping):
            self.usage = payload["usage"]
        choices = payload.get("choices") or ()
        if not choices or not isinstance(choices[0], Mapping):
            return None
        choice = choices[0]
        if choice.get("finish_reason") is not None:
            self.finish = _FINISH.get(choice["finish_reason"], "stop")
        if self.chat:
            text = (choice.get("delta") or {}).get("content") or ""
        else:
            text = choice.get("text") or ""
        ids, logprobs, tops = ((), None, None) if self.text_only else _token_fields(choice)
        if not text and not ids:
            return None
        chunk = TokenChunk(request_id=self.request_id, index=self.emitted, token_ids=ids, text=text,
                           logprobs=logprobs if self.logprobs else None, top_logprobs=tops if self.logprobs else None)
        self.emitted += 1 if self.text_only else len(ids)
        return chunk

    def final(self) -> TokenChunk:
        """The closing chunk: finish reason and usage (the prompt estimated if the upstream gave none)."""
        if self.finish is None:
            raise ServiceUnavailableError("upstream: the stream ended without a finish reason")
        usage = self.usage or {}
        details = usage.get("prompt_tokens_details") or {}
        return TokenChunk(request_id=self.request_id, index=self.emitted, finish_reason=self.finish, usage=Usage(
            prompt_tokens=int(usage.get("prompt_tokens", self.prompt_tokens)),
            completion_tokens=int(usage.get("completion_tokens", self.emitted)),
            cached_tokens=int(details.get("cached_tokens") or 0)))


def _token_fields(choice: Mapping[str, Any]
                  ) -> tuple[tuple[int, ...], tuple[float, ...] | None, tuple[tuple[TopLogprob, ...], ...] | None]:
    """The chunk's token ids, and its logprobs and alternatives when there is one per id."""
    raw = choice.get("logprobs")
    entries: Sequence[Mapping[str, Any]] = ()
    logprobs: list[float] = []
    tops: list[tuple[TopLogprob, ...]] = []
    top_ids = choice.get("top_token_ids") or ()
    if isinstance(raw, Mapping) and isinstance(raw.get("content"), list):
        entries = raw["content"]
        if all("logprob" in e for e in entries):  # not llama-server's post-sampling "prob"s
            logprobs = [float(e["logprob"]) for e in entries]
            tops = [tuple(TopLogprob(token_id=int(a.get("id", _alternative_id(top_ids, i, j))),
                                     text=str(a.get("token", "")), logprob=float(a["logprob"]))
                          for j, a in enumerate(e.get("top_logprobs") or ())) for i, e in enumerate(entries)]
    elif isinstance(raw, Mapping) and isinstance(raw.get("token_logprobs"), list):
        logprobs = [float(v) for v in raw["token_logprobs"]]
        alternatives = raw.get("top_logprobs") or [{} for _ in logprobs]
        tops = [tuple(TopLogprob(token_id=_alternative_id(top_ids, i, j), text=str(text), logprob=float(lp))
                      for j, (text, lp) in enumerate((alts or {}).items())) for i, alts in enumerate(alternatives)]
    if isinstance(choice.get("token_ids"), list):
        ids = tuple(int(t) for t in choice["token_ids"])
    else:
        ids = tuple(int(e["id"]) for e in entries if "id" in e)
    if len(logprobs) != len(ids) or len(tops) != len(ids):
        return ids, None, None
    return ids, tuple(logprobs), tuple(tops)


def _alternative_id(top_ids: Sequence[Sequence[int]], token: int, alternative: int) -> int:
    """The id of a token's ``alternative``-th alternative from ``top_token_ids``, or ``-1`` when not given."""
    try:
        return int(top_ids[token][alternative])
    except (IndexError, TypeError, ValueError):
        return -1
