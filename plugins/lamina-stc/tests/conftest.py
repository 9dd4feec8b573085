"""Sample streams shared by the tests (pytest's importlib mode keeps test modules apart)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from lamina.testing.streams import decode_stream, encode_stream
from lamina_hookspecs.protocols import StreamEncoder
from lamina_hookspecs.types import StreamMeta, TokenChunk, TopLogprob, Usage

META = StreamMeta(request_id="r1", model="m", created=1_700_000_000, kind="chat")


@pytest.fixture(scope="session")
def spec_items() -> list[object]:
    """The example stream of SPEC.md."""
    top = ((TopLogprob(token_id=300, text=" there", logprob=-0.5),),)
    return [
        META,
        TokenChunk(request_id="r1", index=0, token_ids=(17,), text="Hi"),
        TokenChunk(request_id="r1", index=1, token_ids=(300,), text=" there", logprobs=(-0.5,), top_logprobs=top),
        TokenChunk(request_id="r1", index=2, finish_reason="stop",
                   usage=Usage(prompt_tokens=5, completion_tokens=2, cached_tokens=3)),
    ]


@pytest.fixture(scope="session")
def encode() -> Callable[[StreamEncoder, Sequence[object]], bytes]:
    """``encode(encoder, [meta, chunk-or-error, ...])``: the stream's bytes."""
    return encode_stream


@pytest.fixture(scope="session")
def decode() -> Callable[..., list[object]]:
    """``decode(decoder, data, step=None)``: every item, fed ``step`` bytes at a time, then ``close()``."""
    return decode_stream
