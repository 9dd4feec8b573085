"""The ``stc`` codec: token streams as length-prefixed binary frames (``SPEC.md``).

One :class:`~lamina_hookspecs.types.TokenChunk` is one frame, whatever the number of its
tokens: a TOKENS frame, or an END frame for the final chunk, which carries its tokens
(usually none), the finish reason and the usage, and so decodes as one item. The
request id travels once, in the HEADER frame; each chunk's index is implied by the
tokens before it unless it differs. A reader never resynchronises: the first malformed
byte is a :class:`~lamina_hookspecs.errors.CodecError`.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Final

from lamina_hookspecs.errors import CodecError, InvalidRequestError
from lamina_hookspecs.protocols import StreamItem
from lamina_hookspecs.registration import BuildContext
from lamina_hookspecs.types import StreamError, StreamMeta, TokenChunk, ToolCallDelta, TopLogprob, Usage
from lamina_stc import wire
from lamina_stc.wire import (
    END, END_FLAGS, HAS_INDEX, HAS_LOGPROBS, HAS_TEXT, HAS_TOOL_CALLS, HAS_TOP_LOGPROBS, HAS_USAGE, MAX_FRAME_BYTES,
    ONE_BYTE,
    TOKENS, TOKENS_FLAGS, read_varint, varint,
)

_FLOAT = struct.Struct("<f")
_FINISH_CODES = {reason: code for code, reason in enumerate(wire.FINISH_REASONS) if reason is not None}
_INCLUDE_USAGE_CODES = {value: code for code, value in enumerate(wire.INCLUDE_USAGE)}
_CHUNK_FRAMES = {False: "TOKENS", True: "END"}

# The common frame: one token with its text at the implied index, not final, no logprobs.
# Nearly every frame of a stream is one, so both sides handle it apart from the general
# code (which stays the reference for every other frame and for every error).
_COMMON: Final = bytes((TOKENS, HAS_TEXT, 1))
"""The type, flags and count bytes that start a common frame's body."""
_COMMON_HEADS: dict[int, bytes] = {}
"""``_COMMON`` and the token id's varint, by token id: the part of a common frame that does not depend on its text."""
_MAX_COMMON_HEADS: Final = 1 << 18
"""Enough for any vocabulary's ids; past it, heads are built per frame rather than cached."""


def _frame(body: bytearray) -> bytes:
    if len(body) > MAX_FRAME_BYTES:
        raise CodecError(f"stc: a frame of {len(body)} bytes is over the limit of {MAX_FRAME_BYTES}")
    return varint(len(body)) + body


def _text(text: str) -> bytes:
    """A chunk's text as a string field; its size is bounded by the frame's."""
    try:
        raw = text.encode()
    except UnicodeEncodeError as exc:
        raise CodecError(f"stc: chunk text is not encodable as UTF-8: {exc.reason}") from None
    return varint(len(raw)) + raw


def _floats(values: Sequence[float], what: str) -> bytes:
    try:
        return struct.pack(f"<{len(values)}f", *values)
    except (OverflowError, struct.error) as exc:
        raise CodecError(f"stc: {what} cannot be written as float32: {exc}") from None


class StcEncoder:
    """Encodes one stream: the preamble with the first frame, then one frame per call."""

    def __init__(self) -> None:
        self._started = False
        self._ended = False
        self._position = 0  # the index the next chunk has unless its frame says otherwise

    def header(self, meta: StreamMeta) -> bytes:
        """The HEADER frame; a stream of several choices is refused (STC frames carry one)."""
        if meta.choices > 1:
            raise InvalidRequestError(f"n: the stc codec streams one choice, and this request asks for "
                                      f"{meta.choices}; stream it as text/event-stream, or send it unstreamed",
                                      param="n")
        body = bytearray((wire.HEADER, wire.KINDS.index(meta.kind), _INCLUDE_USAGE_CODES[meta.include_usage]))
        body += wire.string(meta.request_id, wire.MAX_NAME_BYTES, "request id")
        body += wire.string(meta.model, wire.MAX_NAME_BYTES, "model")
        body += varint(meta.created)
        return self._start() + _frame(body)

    def chunk(self, chunk: TokenChunk) -> bytes:
        """A TOKENS frame, or the END frame for the final chunk (``finish_reason`` set)."""
        ids, text = chunk.token_ids, chunk.text
        if (len(ids) == 1 and text and chunk.index == self._position and chunk.finish_reason is None
                and chunk.logprobs is None and chunk.top_logprobs is None and not chunk.tool_calls and self._started
                and not self._ended):
            frame = _common_frame(ids[0], text)
            if frame is not None:
                self._position += 1
                return frame
        return self._chunk(chunk)

    def _chunk(self, chunk: TokenChunk) -> bytes:
        """Any chunk, field by field; it also raises every error of :meth:`chunk`."""
        if not self._started:
            raise CodecError("stc: chunk() before header()")
        if self._ended:
            raise CodecError("stc: chunk() after the stream ended")
        final = chunk.finish_reason is not None
        ids = chunk.token_ids
        body = bytearray((END if final else TOKENS, 0))  # type, flags (set below)
        body += varint(len(ids))
        flags = 0
        if chunk.index != self._position:
            flags = HAS_INDEX
            body += varint(chunk.index)
        for token_id in ids:
            body += varint(token_id)
        if chunk.text:
            flags |= HAS_TEXT
            body += _text(chunk.text)
        if chunk.logprobs is not None:
            flags |= HAS_LOGPROBS
            if len(chunk.logprobs) != len(ids):
                raise CodecError(f"stc: {len(chunk.logprobs)} logprobs for {len(ids)} tokens; one per token")
            body += _floats(chunk.logprobs, "logprobs")
        if chunk.top_logprobs is not None:
            flags |= HAS_TOP_LOGPROBS
            body += _alternatives(chunk.top_logprobs, len(ids))
        if chunk.tool_calls:
            flags |= HAS_TOOL_CALLS
            body += _tool_calls(chunk.tool_calls)
        if final:
            body += varint(_FINISH_CODES[chunk.finish_reason])  # type: ignore[index]
            if chunk.usage is not None:
                flags |= HAS_USAGE
                usage = chunk.usage
                body += varint(usage.prompt_tokens) + varint(usage.completion_tokens) + varint(usage.cached_tokens)
            self._ended = True
        body[1] = flags
        self._position = chunk.index + len(ids)
        return _frame(body)

    def error(self, error: StreamError) -> bytes:
        """An ERROR frame (with the preamble if nothing was written yet); it ends the stream."""
        body = bytearray((wire.ERROR,))
        body += wire.string(error.message, wire.MAX_MESSAGE_BYTES, "error message")
        body += wire.string(error.type, wire.MAX_NAME_BYTES, "error type")
        body += wire.optional_string(error.code, wire.MAX_NAME_BYTES, "error code")
        self._ended = True
        return self._start() + _frame(body)

    def _start(self) -> bytes:
        if self._started:
            return b""
        self._started = True
        return wire.PREAMBLE


def _common_frame(token_id: int, text: str) -> bytes | None:
    """The fast path: the common frame of one token and its (non-empty) text, the general
    code's bytes; ``None`` where the general code must write it: an id that is not an
    ``int`` of at most three varint bytes, text that is long or not UTF-8 (the general code
    raises the error)."""
    if type(token_id) is not int:  # a look-up would find 5.0, which the general code refuses, as 5
        return None
    head = _COMMON_HEADS.get(token_id)
    if head is None:
        if not 0 <= token_id < 1 << 21:
            return None
        head = _COMMON + varint(token_id)
        if len(_COMMON_HEADS) < _MAX_COMMON_HEADS:
            _COMMON_HEADS[token_id] = head
    try:
        raw = text.encode()
    except UnicodeEncodeError:
        return None
    size = len(raw)
    length = len(head) + 1 + size
    if length >= 0x80:  # the frame's length prefix (and so the text's size) would take two bytes
        return None
    return b"".join((ONE_BYTE[length], head, ONE_BYTE[size], raw))


def _alternatives(top_logprobs: Sequence[Sequence[TopLogprob]], count: int) -> bytes:
    if len(top_logprobs) != count:
        raise CodecError(f"stc: {len(top_logprobs)} top_logprobs entries for {count} tokens; one per token")
    out = bytearray()
    for alternatives in top_logprobs:
        if len(alternatives) > wire.MAX_TOP_LOGPROBS:
            raise CodecError(f"stc: {len(alternatives)} alternatives for one token; the limit is {wire.MAX_TOP_LOGPROBS}")
        out += varint(len(alternatives))
        for alternative in alternatives:
            out += varint(alternative.token_id)
            out += _floats((alternative.logprob,), "a top logprob")
            out += wire.string(alternative.text, wire.MAX_NAME_BYTES, "alternative text")
    return bytes(out)


class StcDecoder:
    """Decodes one stream from bytes split anywhere; holds at most one incomplete frame.

    :param max_frame_bytes: the largest frame accepted (at most the format's 1 MiB); a
        length prefix over it fails before its body is buffered.
    """

    def __init__(self, *, max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        if not 1 <= max_frame_bytes <= MAX_FRAME_BYTES:
            raise ValueError(f"max_frame_bytes must be between 1 and {MAX_FRAME_BYTES}")
        self.max_frame_bytes = max_frame_bytes
        self._buffer = bytearray()
        self._needed = 0  # bytes the pending frame needs before it is worth parsing
        self._started = False
        self._meta: StreamMeta | None = None
        self._ended = False
        self._position = 0

    def feed(self, data: bytes) -> list[StreamItem]:
        if self._ended:
            if data:
                raise CodecError("stc: data after the end of the stream")
            return []
        if self._buffer:  # an incomplete frame is pending: parse only once it can be whole
            self._buffer += data
            if len(self._buffer) < self._needed:
                return []
            data = bytes(self._buffer)
            self._buffer.clear()
        at = 0
        if not self._started:
            head = data[:len(wire.PREAMBLE)]
            if not any((wire.MAGIC + bytes((v,))).startswith(head) for v in wire.READ_VERSIONS):
                raise CodecError(_bad_preamble(head))
            if len(head) < len(wire.PREAMBLE):
                self._buffer += data
                self._needed = len(wire.PREAMBLE)
                return []
            self._started = True
            at = len(wire.PREAMBLE)
        items: list[StreamItem] = []
        size, limit = len(data), self.max_frame_bytes
        while at < size:
            if self._ended:
                raise CodecError("stc: data after the end of the stream")
            length = data[at]
            if 0 < length < 0x80 and length <= limit:  # a one-byte length prefix, acceptable
                start = at + 1
            else:
                found = wire.frame_length(data, at, limit)
                if found is None:
                    self._needed = size - at + 1
                    break
                length, start = found
            end = start + length
            if end > size:
                self._needed = end - at
                break
            chunk = self._common_chunk(data, start, end)
            items.append(self._frame(data[start:end]) if chunk is None else chunk)
            at = end
        if at < size:
            self._buffer += data[at:]
        return items

    def close(self) -> None:
        if not self._ended:
            where = f" with {len(self._buffer)} bytes of an incomplete frame" if self._buffer else ""
            raise CodecError(f"stc: the stream was cut short: it ended before its END or ERROR frame{where}")

    def _common_chunk(self, data: bytes, start: int, end: int) -> TokenChunk | None:
        """The fast path: the common frame (see ``_COMMON``) in ``data[start:end]``, read in place;
        ``None`` for any other frame, and for a malformed one, which :meth:`_frame` reads (and rejects)."""
        meta = self._meta
        # 5 bytes: type, flags, count, id, text size. Under 0x80, the text's size is one byte too.
        if meta is None or not 5 <= end - start < 0x80 or data[start:start + 3] != _COMMON:
            return None
        at = start + 3
        token_id = data[at]
        if token_id < 0x80:
            at += 1
        else:  # a minimal two- or three-byte varint; the frame holds at least one byte after the first
            second = data[at + 1]
            if 0 < second < 0x80:
                token_id = token_id & 0x7F | second << 7
                at += 2
            elif second >= 0x80 and at + 2 < end and 0 < data[at + 2] < 0x80:
                token_id = token_id & 0x7F | (second & 0x7F) << 7 | data[at + 2] << 14
                at += 3
            else:
                return None
        if at >= end or data[at] != end - at - 1:  # the text's size must be the rest of the frame
            return None
        try:
            text = data[at + 1:end].decode()
        except UnicodeDecodeError:
            return None
        index = self._position
        self._position = index + 1
        return TokenChunk(request_id=meta.request_id, index=index, token_ids=(token_id,), text=text)

    def _frame(self, body: bytes) -> StreamItem:
        kind = body[0]
        try:
            if kind == TOKENS or kind == END:
                return self._chunk(body, kind == END)
            if kind == wire.HEADER:
                return self._header(body)
            if kind == wire.ERROR:
                return self._error(body)
        except IndexError:
            raise CodecError(f"stc: {wire.FRAME_NAMES[kind]} frame ends inside a field") from None
        except UnicodeDecodeError as exc:
            raise CodecError(f"stc: {wire.FRAME_NAMES[kind]} frame: text is not valid UTF-8: {exc.reason}") from None
        raise CodecError(f"stc: unknown frame type 0x{kind:02x}")

    def _header(self, body: bytes) -> StreamMeta:
        if self._meta is not None:
            raise CodecError("stc: a second HEADER frame")
        kind, options = body[1], body[2]
        if kind >= len(wire.KINDS):
            raise CodecError(f"stc: HEADER frame: unknown kind {kind}")
        if options & ~wire.INCLUDE_USAGE_MASK or options == wire.INCLUDE_USAGE_MASK:
            raise CodecError(f"stc: HEADER frame: unknown options 0x{options:02x}")
        request_id, at = wire.read_string(body, 3, wire.MAX_NAME_BYTES, "request id")
        model, at = wire.read_string(body, at, wire.MAX_NAME_BYTES, "model")
        created, at = read_varint(body, at)
        _check_consumed(body, at, "HEADER")
        self._meta = StreamMeta(request_id=request_id, model=model, created=created, kind=wire.KINDS[kind],
                                include_usage=wire.INCLUDE_USAGE[options])
        return self._meta

    def _chunk(self, body: bytes, final: bool) -> TokenChunk:
        """A TOKENS or END frame; the hot path, so the common fields are read inline."""
        meta = self._meta
        if meta is None:
            raise CodecError(f"stc: {_CHUNK_FRAMES[final]} frame before the HEADER frame")
        flags = body[1]
        if flags & ~(END_FLAGS if final else TOKENS_FLAGS):
            raise CodecError(f"stc: {_CHUNK_FRAMES[final]} frame: unknown flags 0x{flags:02x}")
        count = body[2]
        at = 3
        if count >= 0x80:
            count, at = read_varint(body, 2)
        if count > len(body) - at:
            raise CodecError(f"stc: {_CHUNK_FRAMES[final]} frame: {count} tokens do not fit in {len(body)} bytes")
        index = self._position
        if flags & HAS_INDEX:
            index, at = read_varint(body, at)
        ids = []
        for _ in range(count):
            token_id = body[at]
            if token_id < 0x80:
                at += 1
            else:
                token_id, at = read_varint(body, at)
            ids.append(token_id)
        text = ""
        if flags & HAS_TEXT:
            size = body[at]
            if size < 0x80:
                at += 1
            else:
                size, at = read_varint(body, at)
            end = at + size
            if end > len(body):
                raise IndexError("text")
            text = body[at:end].decode()  # UnicodeDecodeError: see _frame
            at = end
        logprobs = None
        if flags & HAS_LOGPROBS:
            end = at + 4 * count
            if end > len(body):
                raise IndexError("logprobs")
            logprobs = struct.unpack_from(f"<{count}f", body, at)
            at = end
        top_logprobs = None
        if flags & HAS_TOP_LOGPROBS:
            top_logprobs, at = _read_alternatives(body, at, count)
        tool_calls: tuple[ToolCallDelta, ...] = ()
        if flags & HAS_TOOL_CALLS:
            tool_calls, at = _read_tool_calls(body, at)
        finish_reason = usage = None
        if final:
            code = body[at]
            finish_reason = wire.FINISH_REASONS[code] if code < len(wire.FINISH_REASONS) else None
            if finish_reason is None:
                raise CodecError(f"stc: END frame: unknown finish reason {code}")
            at += 1
            if flags & HAS_USAGE:
                prompt, at = read_varint(body, at)
                completion, at = read_varint(body, at)
                cached, at = read_varint(body, at)
                usage = Usage(prompt_tokens=prompt, completion_tokens=completion, cached_tokens=cached)
            self._ended = True
        if at != len(body):
            raise CodecError(f"stc: {_CHUNK_FRAMES[final]} frame has {len(body) - at} bytes after its last field")
        self._position = index + count
        return TokenChunk(request_id=meta.request_id, index=index, token_ids=tuple(ids), text=text, logprobs=logprobs,
                          top_logprobs=top_logprobs, finish_reason=finish_reason, usage=usage, tool_calls=tool_calls)

    def _error(self, body: bytes) -> StreamError:
        message, at = wire.read_string(body, 1, wire.MAX_MESSAGE_BYTES, "error message")
        type_, at = wire.read_string(body, at, wire.MAX_NAME_BYTES, "error type")
        code, at = wire.read_optional_string(body, at, wire.MAX_NAME_BYTES, "error code")
        _check_consumed(body, at, "ERROR")
        self._ended = True
        return StreamError(message=message, type=type_, code=code)


def _read_alternatives(body: bytes, at: int, count: int) -> tuple[tuple[tuple[TopLogprob, ...], ...], int]:
    rows = []
    for _ in range(count):
        size, at = read_varint(body, at)
        if size > wire.MAX_TOP_LOGPROBS:
            raise CodecError(f"stc: {size} alternatives for one token; the limit is {wire.MAX_TOP_LOGPROBS}")
        row = []
        for _ in range(size):
            token_id, at = read_varint(body, at)
            if at + 4 > len(body):
                raise IndexError("top logprob")
            (logprob,) = _FLOAT.unpack_from(body, at)
            text, at = wire.read_string(body, at + 4, wire.MAX_NAME_BYTES, "alternative text")
            row.append(TopLogprob(token_id=token_id, text=text, logprob=logprob))
        rows.append(tuple(row))
    return tuple(rows), at


def _tool_calls(deltas: Sequence[ToolCallDelta]) -> bytes:
    if len(deltas) > wire.MAX_TOOL_CALLS:
        raise CodecError(f"stc: {len(deltas)} tool-call fragments in one chunk; the limit is {wire.MAX_TOOL_CALLS}")
    out = bytearray(varint(len(deltas)))
    for delta in deltas:
        out += varint(delta.index)
        out += wire.optional_string(delta.id, wire.MAX_NAME_BYTES, "tool call id")
        out += wire.optional_string(delta.name, wire.MAX_NAME_BYTES, "tool name")
        out += wire.string(delta.arguments, MAX_FRAME_BYTES, "tool call arguments")
    return bytes(out)


def _read_tool_calls(body: bytes, at: int) -> tuple[tuple[ToolCallDelta, ...], int]:
    size, at = read_varint(body, at)
    if not 1 <= size <= wire.MAX_TOOL_CALLS:
        raise CodecError(f"stc: {size} tool-call fragments in one chunk; 1 to {wire.MAX_TOOL_CALLS} are allowed")
    deltas = []
    for _ in range(size):
        index, at = read_varint(body, at)
        call_id, at = wire.read_optional_string(body, at, wire.MAX_NAME_BYTES, "tool call id")
        name, at = wire.read_optional_string(body, at, wire.MAX_NAME_BYTES, "tool name")
        arguments, at = wire.read_string(body, at, MAX_FRAME_BYTES, "tool call arguments")
        deltas.append(ToolCallDelta(index=index, id=call_id, name=name, arguments=arguments))
    return tuple(deltas), at


def _check_consumed(body: bytes, at: int, name: str) -> None:
    if at != len(body):
        raise CodecError(f"stc: {name} frame has {len(body) - at} bytes after its last field")


def _bad_preamble(start: bytes) -> str:
    if start[:len(wire.MAGIC)] == wire.MAGIC:
        return (f"stc: unsupported version {start[len(wire.MAGIC)]}; this reader knows versions "
                f"{', '.join(map(str, wire.READ_VERSIONS))}")
    return f"stc: not an STC stream: it starts with {start.hex(' ')}, not {wire.PREAMBLE.hex(' ')}"


class StcCodec:
    """STC, Lamina's compact binary token stream (``application/x-lamina-stc``)."""

    media_type = "application/x-lamina-stc"

    def encoder(self) -> StcEncoder:
        return StcEncoder()

    def decoder(self, *, max_frame_bytes: int = MAX_FRAME_BYTES) -> StcDecoder:
        """A fresh decoder; frames over ``max_frame_bytes`` raise ``CodecError``."""
        return StcDecoder(max_frame_bytes=max_frame_bytes)


def build_stc(options: None, context: BuildContext) -> StcCodec:
    """Compact binary token frames (STC): a few bytes per token instead of an SSE event."""
    return StcCodec()
