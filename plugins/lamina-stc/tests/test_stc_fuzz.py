"""Hypothesis: random streams round-trip exactly; random, mutated and split input only ever raises ``CodecError``."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from lamina.testing.streams import mutate
from hypothesis import given, settings
from hypothesis import strategies as st

from lamina_hookspecs.errors import CodecError
from lamina_hookspecs.types import StreamError, StreamMeta, TokenChunk, TopLogprob, Usage
from lamina_stc.codec import StcCodec
from lamina_stc.compression import StcZstdCodec

CODECS: dict[str, StcCodec | StcZstdCodec] = {"stc": StcCodec(), "stc-zstd": StcZstdCodec()}
FUZZ = settings(max_examples=300, deadline=timedelta(seconds=2))
Encode = Callable[..., bytes]

token_ids = st.integers(min_value=0, max_value=2**40)
float32s = st.floats(width=32, allow_nan=False)  # NaN != NaN would fail an equality check, not the codec
texts = st.text(max_size=20)


@st.composite
def chunks(draw: st.DrawFn, index: int, final: bool) -> TokenChunk:
    ids = tuple(draw(st.lists(token_ids, max_size=4)))
    with_logprobs = draw(st.booleans())
    return TokenChunk(
        request_id="req", index=draw(st.sampled_from([index, index + draw(st.integers(1, 9))])), token_ids=ids,
        text=draw(texts),
        logprobs=tuple(draw(float32s) for _ in ids) if with_logprobs else None,
        top_logprobs=tuple(tuple(TopLogprob(token_id=draw(token_ids), text=draw(texts), logprob=draw(float32s))
                                 for _ in range(draw(st.integers(0, 3)))) for _ in ids)
        if with_logprobs and draw(st.booleans()) else None,
        finish_reason=draw(st.sampled_from(["stop", "length", "abort", "tool_calls"])) if final else None,
        usage=draw(st.none() | st.builds(Usage, prompt_tokens=st.integers(0, 2**32), completion_tokens=st.integers(0, 99),
                                         cached_tokens=st.integers(0, 9))) if final else None,
    )


@st.composite
def streams(draw: st.DrawFn) -> list[Any]:
    meta = StreamMeta(request_id="req", model=draw(texts), created=draw(st.integers(0, 2**63)),
                      kind=draw(st.sampled_from(["chat", "completion"])),
                      include_usage=draw(st.sampled_from([None, False, True])))
    items: list[Any] = [meta]
    index = 0
    for _ in range(draw(st.integers(0, 5))):
        chunk = draw(chunks(index, final=False))
        items.append(chunk)
        index = chunk.index + len(chunk.token_ids)
    items.append(draw(chunks(index, final=True)) if draw(st.booleans()) else
                 StreamError(message=draw(texts), type=draw(texts), code=draw(st.none() | texts)))
    return items


def pieces(data: bytes, cuts: list[int]) -> list[bytes]:
    bounds = [0, *sorted(c % (len(data) + 1) for c in cuts), len(data)]
    return [data[start:end] for start, end in itertools.pairwise(bounds)]


def decode(name: str, parts: list[bytes]) -> list[Any]:
    decoder = CODECS[name].decoder(max_frame_bytes=4096)
    items = [item for part in parts for item in decoder.feed(part)]
    decoder.close()
    return items


def only_codec_errors(name: str, data: bytes, cuts: list[int]) -> None:
    try:
        for item in decode(name, pieces(data, cuts)):
            assert isinstance(item, StreamMeta | TokenChunk | StreamError)
    except CodecError:
        pass


@pytest.mark.parametrize("name", CODECS)
@FUZZ
@given(items=streams(), cuts=st.lists(st.integers(min_value=0), max_size=20))
def test_random_streams_round_trip_exactly_in_any_split(name: str, items: list[Any], cuts: list[int],
                                                        encode: Encode) -> None:
    data = encode(CODECS[name].encoder(), items)
    assert decode(name, pieces(data, cuts)) == items


@pytest.mark.parametrize("name", CODECS)
@FUZZ
@given(data=st.binary(max_size=4000), cuts=st.lists(st.integers(min_value=0), max_size=20))
def test_random_bytes(name: str, data: bytes, cuts: list[int]) -> None:
    only_codec_errors(name, data, cuts)


@FUZZ
@given(body=st.binary(max_size=400), cuts=st.lists(st.integers(min_value=0), max_size=20))
def test_random_frames_after_a_valid_preamble(body: bytes, cuts: list[int]) -> None:
    only_codec_errors("stc", b"LSTC\x01" + body, cuts)


mutation = st.tuples(st.sampled_from(["flip", "insert", "delete", "truncate"]), st.integers(min_value=0),
                     st.integers(min_value=0, max_value=255))


@pytest.mark.parametrize("name", CODECS)
@FUZZ
@given(items=streams(), mutations=st.lists(mutation, min_size=1, max_size=8),
       cuts=st.lists(st.integers(min_value=0), max_size=20))
def test_mutated_valid_streams(name: str, items: list[Any], mutations: list[tuple[str, int, int]], cuts: list[int],
                               encode: Encode) -> None:
    data = mutate(encode(CODECS[name].encoder(), items), mutations)
    only_codec_errors(name, data, cuts)

