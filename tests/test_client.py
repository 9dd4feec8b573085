"""``lamina.tools.client`` against a live echo server: every codec yields the same chunks."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from lamina.tools.client import AsyncLaminaClient, LaminaClient
from lamina_hookspecs import hookimpl
from lamina_hookspecs.errors import ConfigError, InternalError, NotAcceptableError, NotFoundError
from lamina_hookspecs.types import BackendState, ModelInfo, Request, TokenChunk

CODECS = ["sse", "stc", "stc-zstd"]
PROMPT = "the same words through every codec, ünïcödé 漢字 🌍"


@pytest.fixture
def client(live: Any) -> Any:
    server = live({"executor": {"use": "echo"}})
    with LaminaClient(server.url) as c:
        yield c


def summary(chunks: list[TokenChunk]) -> tuple[Any, ...]:
    return (tuple(c.text for c in chunks), tuple(c.token_ids for c in chunks), tuple(c.index for c in chunks),
            chunks[-1].finish_reason, chunks[-1].usage)


@pytest.mark.parametrize("kind", ["prompt", "messages"])
def test_every_codec_yields_the_same_chunks(client: LaminaClient, kind: str) -> None:
    request: dict[str, Any] = ({"prompt": PROMPT} if kind == "prompt"
                               else {"messages": [{"role": "user", "content": PROMPT}]})
    results = {codec: summary(list(client.stream_completion(model="echo", codec=codec, **request)))
               for codec in CODECS}
    assert results["sse"] == results["stc"] == results["stc-zstd"]
    texts, ids, _, finish, usage = results["stc"]
    assert "".join(texts) == PROMPT and len(ids) == 10 and finish == "stop"
    assert usage is not None and usage.completion_tokens == 9


def test_sampling_fields_are_passed_through(client: LaminaClient) -> None:
    chunks = list(client.stream_completion(model="echo", prompt="a b c d", codec="stc", max_tokens=2))
    assert "".join(c.text for c in chunks) == "a b" and chunks[-1].finish_reason == "length"


def test_complete(client: LaminaClient) -> None:
    completion = client.complete(model="echo", messages=[{"role": "user", "content": "one two"}])
    assert (completion.text, completion.finish_reason, completion.usage.total_tokens) == ("one two", "stop", 4)


class Nope:
    """A codec the server does not have."""

    media_type = "application/x-nope"

    def encoder(self) -> Any:
        raise NotImplementedError

    def decoder(self) -> Any:
        raise NotImplementedError


def test_an_unknown_media_type_is_a_clear_406(client: LaminaClient) -> None:
    with pytest.raises(NotAcceptableError, match="no codec produces any of: application/x-nope") as caught:
        next(client.stream_completion(model="echo", prompt="x", codec=Nope()))
    assert caught.value.http_status == 406


def test_server_errors_come_back_as_their_class(client: LaminaClient) -> None:
    with pytest.raises(NotFoundError) as caught:
        client.complete(model="gpt-9", prompt="x")
    assert caught.value.param == "model"
    with pytest.raises(ConfigError, match="no codec named 'sse2'.*installed: .*stc"):
        next(client.stream_completion(model="echo", prompt="x", codec="sse2"))
    with pytest.raises(ValueError, match="exactly one of prompt"):
        client.complete(model="echo")


def test_an_error_inside_a_stream_is_raised(live: Any) -> None:
    class Failing:
        model = ModelInfo(id="failing", context_length=100)

        async def start(self) -> None: ...

        async def stop(self) -> None: ...

        def state(self) -> BackendState:
            return BackendState(name="failing", model="failing")

        async def generate(self, request: Request) -> Any:
            yield TokenChunk(request_id=request.id, index=0, token_ids=(1,), text="ok")
            raise InternalError("device fell over")

        @hookimpl
        def lamina_register_executors(self, register: Any) -> None:
            register("failing", lambda options, context: Failing())

    server = live({"executor": {"use": "failing"}}, ("failing", Failing()))
    with LaminaClient(server.url) as c:
        for codec in CODECS:
            received: list[TokenChunk] = []
            with pytest.raises(InternalError, match="device fell over"):
                received.extend(c.stream_completion(model="failing", prompt="x", codec=codec))
            assert [chunk.text for chunk in received] == ["ok"]


def test_the_async_client(live: Any) -> None:
    server = live({"executor": {"use": "echo"}})

    async def run() -> list[tuple[Any, ...]]:
        async with AsyncLaminaClient(server.url) as c:
            streams = [[chunk async for chunk in c.stream_completion(model="echo", prompt=PROMPT, codec=codec)]
                       for codec in CODECS]
            assert (await c.complete(model="echo", prompt="x y")).text == "x y"
        return [summary(chunks) for chunks in streams]

    first, *rest = asyncio.run(run())
    assert all(other == first for other in rest)
