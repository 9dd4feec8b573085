"""Helpers for codec tests: write a stream with an encoder, read it back, damage it."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from lamina_hookspecs.protocols import StreamDecoder, StreamEncoder
from lamina_hookspecs.types import StreamError, StreamMeta


def encode_stream(encoder: StreamEncoder, items: Sequence[Any]) -> bytes:
    """The bytes of ``[meta, chunk-or-error, ...]`` written by ``encoder``."""
    meta, *rest = items
    assert isinstance(meta, StreamMeta), "a stream starts with its StreamMeta"
    out = bytearray(encoder.header(meta))
    for item in rest:
        out += encoder.error(item) if isinstance(item, StreamError) else encoder.chunk(item)
    return bytes(out)


def decode_stream(decoder: StreamDecoder, data: bytes, split: int | None = None) -> list[Any]:
    """Every item ``decoder`` reads from ``data`` fed in pieces of ``split`` bytes, then ``close()``."""
    step = split or len(data) or 1
    items: list[Any] = []
    for start in range(0, len(data), step):
        items += decoder.feed(data[start:start + step])
    decoder.close()
    return items


def mutate(data: bytes, mutations: Iterable[tuple[str, int, int]]) -> bytes:
    """``data`` damaged by ``(op, position, byte)`` edits: ``insert``, ``flip``, ``delete`` a byte, or
    ``truncate`` there (positions wrap around the current length)."""
    damaged = bytearray(data)
    for op, position, byte in mutations:
        at = position % (len(damaged) + 1)
        if op == "insert":
            damaged[at:at] = bytes([byte])
        elif op == "truncate":
            del damaged[at:]
        elif at < len(damaged):
            if op == "flip":
                damaged[at] = byte
            else:
                del damaged[at]
    return bytes(damaged)
