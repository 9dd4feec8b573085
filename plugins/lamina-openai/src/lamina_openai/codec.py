"""The ``openai-sse`` codec: token streams as OpenAI's streaming API writes them.

A chat stream is ``chat.completion.chunk`` events, a completion stream ``text_completion``
events, each ``data: {json}`` followed by a blank line: content chunks, one chunk with an
empty delta (or text) and the ``finish_reason``, optionally a usage chunk (``"choices": []``),
then ``data: [DONE]``. An error mid-stream is ``data: {"error": {...}}`` then ``data: [DONE]``.
The official ``openai`` client parses it unchanged. A final ``TokenChunk`` that still carries
tokens is written as a content chunk followed by the finish chunk (and decodes as two). With
several choices (``n``), their chunks interleave, each naming its choice's ``index``, and every
choice has its own finish chunk; the usage chunk and ``[DONE]`` come once, at the end.

Two choice fields that OpenAI's format lacks (and its clients ignore) let the decoder
round-trip a :class:`~lamina_hookspecs.types.TokenChunk`:

- ``token_ids``: the ids of the chunk's tokens (absent when it has none);
- ``top_token_ids``: per token, the ids of its ``top_logprobs`` alternatives, in order
  (absent without top logprobs). Decoding a stream without it gives alternatives id ``-1``.

Tool calls are ``delta.tool_calls`` entries as OpenAI streams them: ``index``, then ``id``,
``type`` and ``function.name`` on a call's first entry, and ``function.arguments`` fragments
(``delta.content`` is ``null`` in a chunk that carries only calls).

OpenAI gives each token its own text, a ``TokenChunk`` one text for all its tokens: the
encoder gives the chunk's text to its first token and ``""`` to the others, so the token
texts still join to the chunk's text. A completion's ``text_offset`` counts characters
from the start of the generated text; its ``top_logprobs`` map keeps the first
alternative of each text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, get_args

import attrs

# orjson, not json: the design's choice for the per-token hot path (several times faster,
# and it writes compact UTF-8 bytes directly).
import orjson

from lamina_hookspecs.errors import CodecError
from lamina_hookspecs.protocols import StreamItem
from lamina_hookspecs.registration import BuildContext
from lamina_hookspecs.types import (FinishReason, StreamError, StreamMeta, TokenChunk, ToolCallDelta, TopLogprob,
                                    Usage)
from lamina_openai.sse import MAX_EVENT_BYTES, SseParser

Kind = Literal["completion", "chat"]

_OBJECT: dict[Kind, str] = {"chat": "chat.completion.chunk", "completion": "text_completion"}
_KIND: dict[str, Kind] = {obj: kind for kind, obj in _OBJECT.items()}
_FINISH_REASONS: frozenset[str] = frozenset(get_args(FinishReason))
_DONE = b"data: [DONE]\n\n"
_MISSING: Any = object()


@attrs.frozen(kw_only=True)
class SseOptions:
    """Stack-file options of ``openai-sse``."""

    include_usage: bool = attrs.field(default=False, metadata={
        "help": "end each stream with a usage chunk, like OpenAI's stream_options.include_usage "
                "(the default for streams whose request does not say)"})


def _event(payload: object) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def _first_per_text(alternatives: Sequence[TopLogprob]) -> list[TopLogprob]:
    """The alternatives that survive as keys of a ``{text: logprob}`` map."""
    kept: dict[str, TopLogprob] = {}
    for alternative in alternatives:
        kept.setdefault(alternative.text, alternative)
    return list(kept.values())


class SseEncoder:
    """Encodes one stream; ``include_usage`` adds the usage chunk (and ``"usage": null``
    on every other chunk, as OpenAI does)."""

    def __init__(self, *, include_usage: bool = False) -> None:
        self.include_usage = include_usage
        self._meta: StreamMeta | None = None
        self._envelope = b""  # 'data: {"id":...,"model":...,"choices":' — the same in every chunk
        self._role_sent: set[int] = set()  # the choices whose first chat chunk is written
        self._offsets: dict[int, int] = {}  # per choice, characters of text written so far (completion text_offset)

    def header(self, meta: StreamMeta) -> bytes:
        """Nothing: SSE repeats the metadata in every chunk, so it is only remembered (with the
        client's ``include_usage`` choice, when it made one) and its JSON is built once here."""
        self._meta = meta
        if meta.include_usage is not None:
            self.include_usage = meta.include_usage
        constant = orjson.dumps({"id": meta.request_id, "object": _OBJECT[meta.kind], "created": meta.created,
                                 "model": meta.model})
        self._envelope = b"data: " + constant[:-1] + b',"choices":'
        return b""

    def chunk(self, chunk: TokenChunk) -> bytes:
        meta = self._meta
        if meta is None:
            raise CodecError("openai-sse: chunk() before header()")
        out = bytearray()
        carries = chunk.text or chunk.token_ids or chunk.logprobs is not None or chunk.tool_calls
        ends = chunk.finish_reason is not None
        if not ends or carries or (meta.kind == "chat" and chunk.choice not in self._role_sent):
            choice = self._chat_choice(chunk) if meta.kind == "chat" else self._completion_choice(chunk)
            out += self._chunk_event([choice])
        if ends:
            body: dict[str, Any] = {"delta": {}} if meta.kind == "chat" else {"text": ""}
            out += self._chunk_event([{"index": chunk.choice, **body, "logprobs": None,
                                       "finish_reason": chunk.finish_reason}])
        if chunk.is_final:
            if self.include_usage and chunk.usage is not None:
                out += self._chunk_event([], usage=chunk.usage)
            out += _DONE
        return bytes(out)

    def error(self, error: StreamError) -> bytes:
        body = {"message": error.message, "type": error.type, "param": None, "code": error.code}
        return _event({"error": body}) + _DONE

    def _chunk_event(self, choices: list[dict[str, Any]], usage: Usage | None = None) -> bytes:
        """One chunk event: the pre-built envelope, then only what changes (choices, usage)."""
        if not self.include_usage:
            return self._envelope + orjson.dumps(choices) + b"}\n\n"
        usage_json = b"null" if usage is None else orjson.dumps({
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.total_tokens,
            "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
        })
        return self._envelope + orjson.dumps(choices) + b',"usage":' + usage_json + b"}\n\n"

    def _chat_choice(self, chunk: TokenChunk) -> dict[str, Any]:
        delta: dict[str, Any] = {} if chunk.choice in self._role_sent else {"role": "assistant"}
        self._role_sent.add(chunk.choice)
        delta["content"] = chunk.text or (None if chunk.tool_calls else "")
        if chunk.tool_calls:
            delta["tool_calls"] = [_tool_call(d) for d in chunk.tool_calls]
        logprobs = None
        tops = _alternatives(chunk)
        if chunk.logprobs is not None:
            logprobs = {"content": [
                {"token": text, "logprob": logprob, "bytes": list(text.encode()),
                 "top_logprobs": [{"token": a.text, "logprob": a.logprob, "bytes": list(a.text.encode())}
                                  for a in alts]}
                for text, logprob, alts in zip(_token_texts(chunk), chunk.logprobs, tops, strict=True)
            ]}
        return _with_ids({"index": chunk.choice, "delta": delta, "logprobs": logprobs, "finish_reason": None},
                         chunk, tops)

    def _completion_choice(self, chunk: TokenChunk) -> dict[str, Any]:
        logprobs = None
        tops = [_first_per_text(alts) for alts in _alternatives(chunk)]
        if chunk.logprobs is not None:
            texts = _token_texts(chunk)
            offsets, offset = [], self._offsets.get(chunk.choice, 0)
            for text in texts:
                offsets.append(offset)
                offset += len(text)
            logprobs = {
                "tokens": texts,
                "token_logprobs": list(chunk.logprobs),
                "top_logprobs": None if chunk.top_logprobs is None
                else [{a.text: a.logprob for a in alts} for alts in tops],
                "text_offset": offsets,
            }
        self._offsets[chunk.choice] = self._offsets.get(chunk.choice, 0) + len(chunk.text)
        return _with_ids({"index": chunk.choice, "text": chunk.text, "logprobs": logprobs, "finish_reason": None},
                         chunk, tops)


def _tool_call(delta: ToolCallDelta) -> dict[str, Any]:
    """One ``delta.tool_calls`` entry: the first of a call has its id, type and name."""
    function: dict[str, Any] = {"arguments": delta.arguments}
    entry: dict[str, Any] = {"index": delta.index, "function": function}
    if delta.id is not None:
        entry["id"], entry["type"] = delta.id, "function"
    if delta.name is not None:
        function["name"] = delta.name
    return entry


def _read_tool_calls(entries: list[Any]) -> tuple[ToolCallDelta, ...]:
    deltas = []
    for entry in _objects(entries, "delta.tool_calls"):
        function = _field(entry, "function", dict, "tool call", {})
        deltas.append(ToolCallDelta(index=_field(entry, "index", int, "tool call"),
                                    id=_field(entry, "id", (str, type(None)), "tool call", None),
                                    name=_field(function, "name", (str, type(None)), "tool call function", None),
                                    arguments=_field(function, "arguments", str, "tool call function", "")))
    return tuple(deltas)


def _token_texts(chunk: TokenChunk) -> list[str]:
    count = len(chunk.logprobs or ())
    return [chunk.text, *[""] * (count - 1)] if count else []


def _alternatives(chunk: TokenChunk) -> Sequence[Sequence[TopLogprob]]:
    """One (possibly empty) tuple of alternatives per logprob."""
    count = len(chunk.logprobs or ())
    if chunk.top_logprobs is None:
        return [()] * count
    if len(chunk.top_logprobs) != count:
        raise CodecError(f"openai-sse: {len(chunk.top_logprobs)} top_logprobs for {count} logprobs")
    return chunk.top_logprobs


def _with_ids(choice: dict[str, Any], chunk: TokenChunk, tops: Sequence[Sequence[TopLogprob]]) -> dict[str, Any]:
    if chunk.token_ids:
        choice["token_ids"] = chunk.token_ids
    if chunk.top_logprobs is not None:
        choice["top_token_ids"] = [[a.token_id for a in alts] for alts in tops]
    return choice


class SseDecoder:
    """Decodes one stream: ``StreamMeta`` from the first chunk, then ``TokenChunk``s and
    ``StreamError``s. A finish chunk is held until the next event: a usage chunk or ``[DONE]``
    makes it the final ``TokenChunk`` (with the usage), a chunk of another choice makes it the end of
    its choice only (``more``)."""

    def __init__(self, *, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        self._parser = SseParser(max_event_bytes=max_event_bytes)
        self._meta: StreamMeta | None = None
        self._indexes: dict[int, int] = {}  # per choice, the tokens decoded so far
        self._final: TokenChunk | None = None
        self._done = False

    def feed(self, data: bytes) -> list[StreamItem]:
        items: list[StreamItem] = []
        for event in self._parser.feed(data):
            items += self._event(event)
        return items

    def close(self) -> None:
        self._parser.close()
        if not self._done:
            raise CodecError("openai-sse: stream ended before 'data: [DONE]'")

    def _flush(self) -> list[StreamItem]:
        final, self._final = self._final, None
        return [] if final is None else [final]

    def _event(self, data: str) -> list[StreamItem]:
        if self._done:
            raise CodecError("openai-sse: event after 'data: [DONE]'")
        if data == "[DONE]":
            self._done = True
            return self._flush()
        try:
            payload = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise CodecError(f"openai-sse: event data is not JSON: {exc}") from None
        if not isinstance(payload, dict):
            raise CodecError("openai-sse: event data is not a JSON object")
        if "error" in payload:
            return [*self._flush(), _stream_error(_field(payload, "error", dict, "event"))]
        items: list[StreamItem] = []
        if self._meta is None:
            self._meta = _stream_meta(payload)
            items.append(self._meta)
        choices = _field(payload, "choices", list, "chunk")
        if not choices:
            usage = _field(payload, "usage", (dict, type(None)), "chunk", None)
            if usage is None:
                return items
            if self._final is None:
                raise CodecError("openai-sse: usage chunk before the finish chunk")
            self._final = attrs.evolve(self._final, usage=_usage(usage))
            return [*items, *self._flush()]
        if len(choices) != 1 or not isinstance(choices[0], dict):
            raise CodecError("openai-sse: a chunk must carry one choice")
        chunk = self._chunk(choices[0])
        if self._final is not None:
            if self._final.choice == chunk.choice:
                raise CodecError("openai-sse: chunk after the finish chunk of its choice")
            items.append(attrs.evolve(self._final, more=True))
            self._final = None
        self._indexes[chunk.choice] = chunk.index + len(chunk.token_ids)
        if chunk.finish_reason is not None:
            self._final = chunk
        elif chunk.text or chunk.token_ids or chunk.logprobs is not None or chunk.tool_calls:
            items.append(chunk)
        return items

    def _chunk(self, choice: dict[str, Any]) -> TokenChunk:
        meta = self._meta
        assert meta is not None  # set by the first chunk
        calls: tuple[ToolCallDelta, ...] = ()
        if meta.kind == "chat":
            delta = _field(choice, "delta", dict, "choice")
            text = _field(delta, "content", (str, type(None)), "delta", None) or ""
            calls = _read_tool_calls(_field(delta, "tool_calls", (list, type(None)), "delta", None) or [])
            logprobs, alternatives = _chat_logprobs(_field(choice, "logprobs", (dict, type(None)), "choice", None))
        else:
            text = _field(choice, "text", str, "choice")
            logprobs, alternatives = _completion_logprobs(_field(choice, "logprobs", (dict, type(None)), "choice", None))
        finish = _field(choice, "finish_reason", (str, type(None)), "choice", None)
        if finish is not None and finish not in _FINISH_REASONS:
            raise CodecError(f"openai-sse: unknown finish_reason {finish!r}")
        top_ids = _field(choice, "top_token_ids", (list, type(None)), "choice", None)
        number = _field(choice, "index", int, "choice")
        if number < 0:
            raise CodecError(f"openai-sse: choice index {number} is negative")
        return TokenChunk(
            request_id=meta.request_id,
            index=self._indexes.get(number, 0),
            choice=number,
            token_ids=_ints(_field(choice, "token_ids", list, "choice", []), "token_ids"),
            text=text,
            logprobs=logprobs,
            top_logprobs=_top_logprobs(alternatives, top_ids),
            finish_reason=finish,
            tool_calls=calls,
        )


def _field(obj: Mapping[str, Any], key: str, types: type | tuple[type, ...], where: str,
           default: Any = _MISSING) -> Any:
    """``obj[key]``, checked against ``types``; ``default`` when absent (else an error)."""
    value = obj.get(key, default)
    if value is _MISSING:
        raise CodecError(f"openai-sse: {where} lacks field {key!r}")
    if value is not default and not isinstance(value, types):
        raise CodecError(f"openai-sse: {where} field {key!r} has the wrong type ({type(value).__name__})")
    return value


def _number(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise CodecError(f"openai-sse: {what} must be a number, got {type(value).__name__}")
    return float(value)


def _ints(values: list[Any], what: str) -> tuple[int, ...]:
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise CodecError(f"openai-sse: {what} must be a list of integers")
    return tuple(values)


def _stream_meta(payload: dict[str, Any]) -> StreamMeta:
    obj = _field(payload, "object", str, "chunk")
    if obj not in _KIND:
        raise CodecError(f"openai-sse: unknown object {obj!r}; expected one of {sorted(_KIND)}")
    return StreamMeta(request_id=_field(payload, "id", str, "chunk"), model=_field(payload, "model", str, "chunk"),
                      created=_field(payload, "created", int, "chunk"), kind=_KIND[obj])


def _stream_error(error: dict[str, Any]) -> StreamError:
    return StreamError(message=_field(error, "message", str, "error"),
                       type=_field(error, "type", str, "error", "server_error"),
                       code=_field(error, "code", (str, type(None)), "error", None))


def _usage(usage: dict[str, Any]) -> Usage:
    details = _field(usage, "prompt_tokens_details", (dict, type(None)), "usage", None) or {}
    return Usage(prompt_tokens=_field(usage, "prompt_tokens", int, "usage"),
                 completion_tokens=_field(usage, "completion_tokens", int, "usage"),
                 cached_tokens=_field(details, "cached_tokens", int, "prompt_tokens_details", 0))


Alternatives = list[list[tuple[str, float]]]


def _chat_logprobs(logprobs: dict[str, Any] | None) -> tuple[tuple[float, ...] | None, Alternatives]:
    entries = None if logprobs is None else _field(logprobs, "content", (list, type(None)), "logprobs", None)
    if entries is None:
        return None, []
    values, alternatives = [], []
    for entry in _objects(entries, "logprobs.content"):
        values.append(_number(_field(entry, "logprob", object, "logprobs entry"), "logprob"))
        alternatives.append([
            (_field(alt, "token", str, "top_logprobs entry"), _number(_field(alt, "logprob", object, "top_logprobs entry"), "logprob"))
            for alt in _objects(_field(entry, "top_logprobs", list, "logprobs entry", []), "top_logprobs")
        ])
    return tuple(values), alternatives


def _completion_logprobs(logprobs: dict[str, Any] | None) -> tuple[tuple[float, ...] | None, Alternatives]:
    if logprobs is None:
        return None, []
    values = tuple(_number(v, "token_logprobs entry") for v in _field(logprobs, "token_logprobs", list, "logprobs"))
    tops = _field(logprobs, "top_logprobs", (list, type(None)), "logprobs", None) or []
    alternatives = [[(text, _number(value, "top logprob")) for text, value in top.items()]
                    for top in _objects(tops, "top_logprobs")]
    return values, alternatives


def _objects(values: list[Any], what: str) -> list[dict[str, Any]]:
    if not all(isinstance(v, dict) for v in values):
        raise CodecError(f"openai-sse: {what} entries must be objects")
    return values


def _top_logprobs(alternatives: Alternatives, ids: list[Any] | None) -> tuple[tuple[TopLogprob, ...], ...] | None:
    """Alternatives with their ids from ``top_token_ids`` (``-1`` without it); ``None`` when there are none."""
    if not any(alternatives):
        return None
    if ids is None:
        ids = [[-1] * len(alts) for alts in alternatives]
    elif len(ids) != len(alternatives) or not all(
            isinstance(row, list) and len(row) == len(alts) for row, alts in zip(ids, alternatives)):
        raise CodecError("openai-sse: top_token_ids does not match top_logprobs")
    return tuple(
        tuple(TopLogprob(token_id=token_id, text=text, logprob=logprob)
              for token_id, (text, logprob) in zip(_ints(row, "top_token_ids"), alts))
        for row, alts in zip(ids, alternatives)
    )


class OpenAISseCodec:
    """OpenAI's server-sent-event stream format (``text/event-stream``)."""

    media_type = "text/event-stream"

    def __init__(self, *, include_usage: bool = False) -> None:
        self.include_usage = include_usage

    def encoder(self) -> SseEncoder:
        """A fresh encoder; the stream's ``StreamMeta.include_usage`` overrides the default."""
        return SseEncoder(include_usage=self.include_usage)

    def decoder(self, *, max_event_bytes: int = MAX_EVENT_BYTES) -> SseDecoder:
        """A fresh decoder; lines and events over ``max_event_bytes`` raise ``CodecError``."""
        return SseDecoder(max_event_bytes=max_event_bytes)


def build_openai_sse(options: SseOptions, context: BuildContext) -> OpenAISseCodec:
    """Streams as OpenAI's API writes them: server-sent events the openai client reads."""
    return OpenAISseCodec(include_usage=options.include_usage)
