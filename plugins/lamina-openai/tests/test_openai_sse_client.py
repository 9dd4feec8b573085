"""The official ``openai`` client reads what the encoder writes (skipped when it is not installed)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from lamina_hookspecs.types import StreamError
from lamina_openai.codec import OpenAISseCodec, SseEncoder

openai = pytest.importorskip("openai")
try:  # the HTTP library of the installed client: httpx2 from openai 3, httpx before
    import httpx2 as http
except ImportError:
    import httpx as http

Encode = Callable[[SseEncoder, list[object]], bytes]


@contextmanager
def client(body: bytes) -> Iterator[Any]:
    def respond(request: Any) -> Any:
        return http.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    with http.Client(transport=http.MockTransport(respond)) as transport:
        yield openai.OpenAI(api_key="test", base_url="http://lamina.test/v1", http_client=transport)


def test_chat_stream(chat_items: list[object], encode: Encode) -> None:
    body = encode(OpenAISseCodec(include_usage=True).encoder(), chat_items)
    with client(body) as c:
        chunks = list(c.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}],
                                                stream=True, stream_options={"include_usage": True}))
    assert [ch.id for ch in chunks] == ["chatcmpl-1"] * 4
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == "Hi there"
    logprob = chunks[1].choices[0].logprobs.content[0]
    assert (logprob.token, logprob.logprob, [t.token for t in logprob.top_logprobs]) == (" there", -0.5, [" there", " you"])
    assert chunks[2].choices[0].finish_reason == "length"
    assert chunks[3].choices == [] and chunks[3].usage.total_tokens == 7
    assert chunks[3].usage.prompt_tokens_details.cached_tokens == 3


def test_stream_of_several_choices(choices_items: list[object], encode: Encode) -> None:
    body = encode(OpenAISseCodec().encoder(), choices_items)
    with client(body) as c:
        chunks = list(c.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], n=2,
                                                stream=True))
    texts, finishes = ["", ""], [None, None]
    for ch in chunks:
        for choice in ch.choices:
            texts[choice.index] += choice.delta.content or ""
            finishes[choice.index] = choice.finish_reason or finishes[choice.index]
    assert texts == ["Hi there", "Yo!"] and finishes == ["length", "stop"]


def test_completion_stream(completion_items: list[object], encode: Encode) -> None:
    body = encode(OpenAISseCodec().encoder(), completion_items)
    with client(body) as c:
        chunks = list(c.completions.create(model="m", prompt="x", stream=True))
    assert "".join(ch.choices[0].text for ch in chunks) == "Hello world!"
    assert chunks[0].choices[0].logprobs.top_logprobs == [{"Hello": -0.25, "Hi": -2.0}]
    assert chunks[1].choices[0].logprobs.text_offset == [5, 11]
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_error_raises_api_error(chat_items: list[object], encode: Encode) -> None:
    body = encode(OpenAISseCodec().encoder(), [*chat_items[:2], StreamError(message="backend died", code="oops")])
    with client(body) as c, pytest.raises(openai.APIError, match="backend died"):
        list(c.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], stream=True))
