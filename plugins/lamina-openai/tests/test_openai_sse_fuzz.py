"""Hypothesis: random and mutated input, split anywhere, only ever raises ``CodecError``."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from datetime import timedelta

import pytest
from lamina.testing.streams import mutate
from hypothesis import given, settings
from hypothesis import strategies as st

from lamina_hookspecs.errors import CodecError
from lamina_hookspecs.types import StreamError, StreamMeta, TokenChunk
from lamina_openai.codec import OpenAISseCodec, SseEncoder

CODEC = OpenAISseCodec()
FUZZ = settings(max_examples=300, deadline=timedelta(seconds=2))


@pytest.fixture(scope="module")
def valid(chat_items: list[object], completion_items: list[object],
          encode: Callable[[SseEncoder, list[object]], bytes]) -> list[bytes]:
    """Streams the encoder wrote: chat with usage, completion, chat cut short by an error."""
    return [
        encode(OpenAISseCodec(include_usage=True).encoder(), chat_items),
        encode(CODEC.encoder(), completion_items),
        encode(CODEC.encoder(), [*chat_items[:2], StreamError(message="x")]),
    ]


def feed_in_pieces(data: bytes, cuts: list[int]) -> None:
    """Decode ``data`` split at ``cuts``; anything but a ``CodecError`` fails the test."""
    decoder = CODEC.decoder(max_event_bytes=4096)
    bounds = [0, *sorted(c % (len(data) + 1) for c in cuts), len(data)]
    try:
        for start, end in itertools.pairwise(bounds):
            for item in decoder.feed(data[start:end]):
                assert isinstance(item, StreamMeta | TokenChunk | StreamError)
        decoder.close()
    except CodecError:
        pass


@FUZZ
@given(st.binary(max_size=4000), st.lists(st.integers(min_value=0), max_size=20))
def test_random_bytes(data: bytes, cuts: list[int]) -> None:
    feed_in_pieces(data, cuts)


@FUZZ
@given(st.binary(max_size=400).map(lambda b: b.replace(b"\r", b"\n")), st.lists(st.integers(min_value=0), max_size=20))
def test_random_sse_shaped_bytes(body: bytes, cuts: list[int]) -> None:
    feed_in_pieces(b"data: " + body + b"\n\n", cuts)


mutation = st.tuples(st.sampled_from(["flip", "insert", "delete", "truncate"]), st.integers(min_value=0),
                     st.integers(min_value=0, max_value=255))


@FUZZ
@given(st.integers(0, 2), st.lists(mutation, min_size=1, max_size=8), st.lists(st.integers(min_value=0), max_size=20))
def test_mutated_valid_streams(valid: list[bytes], which: int, mutations: list[tuple[str, int, int]],
                               cuts: list[int]) -> None:
    data = mutate(valid[which], mutations)
    feed_in_pieces(data, cuts)


@FUZZ
@given(st.integers(0, 2), st.lists(st.integers(min_value=0), max_size=40))
def test_valid_streams_decode_the_same_in_any_split(valid: list[bytes], which: int, cuts: list[int]) -> None:
    data = valid[which]
    whole = CODEC.decoder()
    expected = whole.feed(data)
    whole.close()
    pieces = CODEC.decoder()
    bounds = [0, *sorted(c % (len(data) + 1) for c in cuts), len(data)]
    got = [item for start, end in itertools.pairwise(bounds) for item in pieces.feed(data[start:end])]
    pieces.close()
    assert got == expected
