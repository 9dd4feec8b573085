"""Sample streams shared by the tests (pytest's importlib mode keeps test modules apart)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from lamina_hookspecs.protocols import StreamDecoder, StreamEncoder
from lamina_hookspecs.types import StreamError, StreamMeta, TokenChunk, TopLogprob, Usage

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


def _encode(encoder: StreamEncoder, items: Sequence[object]) -> bytes:
    meta, *rest = items
    assert isinstance(meta, StreamMeta)
    out = encoder.header(meta)
    for item in rest:
        out += encoder.error(item) if isinstance(item, StreamError) else encoder.chunk(item)  # type: ignore[arg-type]
    return out


def _decode(decoder: StreamDecoder, data: bytes, step: int | None = None) -> list[object]:
    step = step or len(data) or 1
    items: list[object] = [item for start in range(0, len(data), step) for item in decoder.feed(data[start:start + step])]
    decoder.close()
    return items


@pytest.fixture(scope="session")
def encode() -> Callable[[StreamEncoder, Sequence[object]], bytes]:
    """``encode(encoder, [meta, chunk-or-error, ...])``: the stream's bytes."""
    return _encode


@pytest.fixture(scope="session")
def decode() -> Callable[..., list[object]]:
    """``decode(decoder, data, step=None)``: every item, fed ``step`` bytes at a time, then ``close()``."""
    return _decode
