"""Sample streams shared by the tests (pytest's importlib mode keeps test modules apart)."""

from __future__ import annotations

from collections.abc import Callable

import attrs
import pytest

from lamina.testing.streams import encode_stream
from lamina_hookspecs.types import StreamMeta, TokenChunk, TopLogprob, Usage
from lamina_openai.codec import SseEncoder

CREATED = 1_700_000_000
CHAT_META = StreamMeta(request_id="chatcmpl-1", model="m", created=CREATED, kind="chat")
COMPLETION_META = StreamMeta(request_id="cmpl-1", model="m", created=CREATED, kind="completion")


@pytest.fixture(scope="session")
def chat_items() -> list[object]:
    top = (TopLogprob(token_id=18, text=" there", logprob=-0.5), TopLogprob(token_id=19, text=" you", logprob=-1.25))
    return [
        CHAT_META,
        TokenChunk(request_id="chatcmpl-1", index=0, token_ids=(17,), text="Hi"),
        TokenChunk(request_id="chatcmpl-1", index=1, token_ids=(18,), text=" there", logprobs=(-0.5,), top_logprobs=(top,)),
        TokenChunk(request_id="chatcmpl-1", index=2, finish_reason="length",
                   usage=Usage(prompt_tokens=5, completion_tokens=2, cached_tokens=3)),
    ]


@pytest.fixture(scope="session")
def completion_items() -> list[object]:
    top = (TopLogprob(token_id=1, text="Hello", logprob=-0.25), TopLogprob(token_id=2, text="Hi", logprob=-2.0),
           TopLogprob(token_id=3, text="Hello", logprob=-3.0))
    return [
        COMPLETION_META,
        TokenChunk(request_id="cmpl-1", index=0, token_ids=(1,), text="Hello", logprobs=(-0.25,), top_logprobs=(top,)),
        TokenChunk(request_id="cmpl-1", index=1, token_ids=(2, 3), text=" world", logprobs=(-1.0, -0.5)),
        TokenChunk(request_id="cmpl-1", index=3, token_ids=(4,), text="!", finish_reason="stop",
                   usage=Usage(prompt_tokens=3, completion_tokens=4)),
    ]


@pytest.fixture(scope="session")
def choices_items() -> list[object]:
    """A chat of two choices (``n`` = 2), interleaved as core merges them: choice 1 ends first."""
    def chunk(choice: int, index: int, **fields: object) -> TokenChunk:
        return TokenChunk(request_id="chatcmpl-2", index=index, choice=choice, **fields)

    return [
        attrs.evolve(CHAT_META, request_id="chatcmpl-2", choices=2),
        chunk(0, 0, token_ids=(17,), text="Hi"),
        chunk(1, 0, token_ids=(20,), text="Yo"),
        chunk(1, 1, token_ids=(21,), text="!", finish_reason="stop", more=True),
        chunk(0, 1, token_ids=(18,), text=" there"),
        chunk(0, 2, finish_reason="length", usage=Usage(prompt_tokens=5, completion_tokens=4)),
    ]


@pytest.fixture(scope="session")
def encode() -> Callable[[SseEncoder, list[object]], bytes]:
    """``encode(encoder, [meta, chunk-or-error, ...])``: the stream's bytes."""
    return encode_stream
