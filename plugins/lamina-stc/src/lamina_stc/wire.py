"""The STC wire format's constants and primitives (see ``SPEC.md`` beside the package).

Everything here is a plain function on ``bytes``: unsigned LEB128 varints and
length-prefixed UTF-8 strings, each written minimal and read with bounds, so a reader
never allocates more than the frame it already holds. Every read failure is a
:class:`~lamina_hookspecs.errors.CodecError`.
"""

from __future__ import annotations

from typing import Final, Literal

from lamina_hookspecs.errors import CodecError
from lamina_hookspecs.types import FinishReason

MAGIC: Final = b"LSTC"
VERSION: Final = 2
PREAMBLE: Final = MAGIC + bytes((VERSION,))
"""The first five bytes of every stream written."""
READ_VERSIONS: Final = (1, 2)
"""The versions a reader takes: version 1 is version 2 without tool calls."""

HEADER: Final = 0x01
TOKENS: Final = 0x02
END: Final = 0x03
ERROR: Final = 0x04
FRAME_NAMES: Final = {HEADER: "HEADER", TOKENS: "TOKENS", END: "END", ERROR: "ERROR"}

HAS_TEXT: Final = 0x01
HAS_LOGPROBS: Final = 0x02
HAS_TOP_LOGPROBS: Final = 0x04
HAS_INDEX: Final = 0x08
HAS_USAGE: Final = 0x10
HAS_TOOL_CALLS: Final = 0x20
TOKENS_FLAGS: Final = HAS_TEXT | HAS_LOGPROBS | HAS_TOP_LOGPROBS | HAS_INDEX | HAS_TOOL_CALLS
END_FLAGS: Final = TOKENS_FLAGS | HAS_USAGE

KINDS: Final[tuple[Literal["completion", "chat"], ...]] = ("completion", "chat")
FINISH_REASONS: Final[tuple[FinishReason | None, ...]] = ("stop", "length", "abort", None, "tool_calls")
"""Finish reasons by their code in the END frame; code 3 is reserved (a failed stream ends with an ERROR frame)."""
INCLUDE_USAGE: Final = (None, False, True)
"""``StreamMeta.include_usage`` by its code in the HEADER frame's options byte (bits 0-1)."""
INCLUDE_USAGE_MASK: Final = 0x03

MAX_FRAME_BYTES: Final = 1 << 20
"""Largest frame (type byte and body) a writer may produce and a reader accepts by default."""
MAX_NAME_BYTES: Final = 1024
"""Largest request id, model, error type, error code or alternative token text."""
MAX_MESSAGE_BYTES: Final = 1 << 16
"""Largest error message."""
MAX_TOP_LOGPROBS: Final = 64
"""Most alternatives per token."""
MAX_TOOL_CALLS: Final = 64
"""Most tool-call fragments per chunk."""
MAX_VARINT: Final = (1 << 64) - 1

ONE_BYTE: Final = [bytes((value,)) for value in range(0x80)]
"""``bytes((value,))`` by value, below 0x80: a one-byte varint."""


def varint(value: int) -> bytes:
    """``value`` (0 .. 2**64-1) as a minimal unsigned LEB128 varint."""
    if 0 <= value < 0x4000:  # one or two bytes: token ids, counts and lengths, without a loop
        return ONE_BYTE[value] if value < 0x80 else bytes((value & 0x7F | 0x80, value >> 7))
    if not 0 <= value <= MAX_VARINT:
        raise CodecError(f"stc: {value} is outside the varint range 0 .. 2**64-1")
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def read_varint(data: bytes, at: int) -> tuple[int, int]:
    """The varint at ``data[at]`` and the offset after it. Raises ``IndexError`` when
    ``data`` ends inside it; ``CodecError`` when it is over-long or over 64 bits."""
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            if byte == 0 and shift:
                raise CodecError("stc: over-long varint (a non-minimal encoding)")
            if value > MAX_VARINT:
                raise CodecError("stc: varint over 64 bits")
            return value, at
        shift += 7
        if shift >= 70:
            raise CodecError("stc: varint longer than 10 bytes")


def _utf8(value: str, limit: int, what: str) -> bytes:
    try:
        raw = value.encode()
    except UnicodeEncodeError as exc:
        raise CodecError(f"stc: {what} is not encodable as UTF-8: {exc.reason}") from None
    if len(raw) > limit:
        raise CodecError(f"stc: {what} is {len(raw)} bytes; the limit is {limit}")
    return raw


def _read_utf8(data: bytes, at: int, size: int, limit: int, what: str) -> tuple[str, int]:
    if size > limit:
        raise CodecError(f"stc: {what} is {size} bytes; the limit is {limit}")
    end = at + size
    if end > len(data):
        raise IndexError(what)
    try:
        return data[at:end].decode(), end
    except UnicodeDecodeError as exc:
        raise CodecError(f"stc: {what} is not valid UTF-8: {exc.reason}") from None


def string(value: str, limit: int, what: str) -> bytes:
    """``value`` as a varint byte length and its UTF-8 bytes, at most ``limit`` bytes."""
    raw = _utf8(value, limit, what)
    return varint(len(raw)) + raw


def read_string(data: bytes, at: int, limit: int, what: str) -> tuple[str, int]:
    """The string at ``data[at]`` (see :func:`string`) and the offset after it."""
    size, at = read_varint(data, at)
    return _read_utf8(data, at, size, limit, what)


def optional_string(value: str | None, limit: int, what: str) -> bytes:
    """``None`` as varint 0; a string as its byte length + 1 and its UTF-8 bytes."""
    if value is None:
        return ONE_BYTE[0]
    raw = _utf8(value, limit, what)
    return varint(len(raw) + 1) + raw


def read_optional_string(data: bytes, at: int, limit: int, what: str) -> tuple[str | None, int]:
    """The optional string at ``data[at]`` (see :func:`optional_string`) and the offset after it."""
    size, at = read_varint(data, at)
    if size == 0:
        return None, at
    return _read_utf8(data, at, size - 1, limit, what)


def frame_length(data: bytes, at: int, limit: int) -> tuple[int, int] | None:
    """The length prefix of the frame at ``data[at]`` and the offset of its type byte, or
    ``None`` while ``data`` ends inside the prefix. Raises ``CodecError`` for a zero length
    or one over ``limit``, as soon as the prefix shows it (before the body is buffered)."""
    value = shift = 0
    while True:
        if at >= len(data):
            if value > limit:
                raise CodecError(f"stc: frame longer than the limit of {limit} bytes")
            return None
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if value > limit:
            raise CodecError(f"stc: frame of at least {value} bytes; the limit is {limit}")
        if byte < 0x80:
            if byte == 0 and shift:
                raise CodecError("stc: over-long varint (a non-minimal encoding) in a frame length")
            if value == 0:
                raise CodecError("stc: empty frame (length 0)")
            return value, at
        shift += 7
        if shift >= 70:
            raise CodecError("stc: frame length varint longer than 10 bytes")
