"""``openai-upstream`` against real servers on loopback: ``lamina serve`` (echo) as the upstream,
and a second ``lamina serve`` in front of it, driven by the official ``openai`` client."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import openai
import pytest
from lamina.tools.bench.servers import StackServer
from lamina.kernel.options import build_options
from lamina.kernel.plugins import load_plugins
from lamina.testing.contracts import ExecutorContract
from lamina.testing.streams import decode_stream
from lamina_hookspecs import layers
from lamina_hookspecs.registration import BuildContext
from lamina_hookspecs.errors import BackendLostError, ConfigError, ServiceUnavailableError, TokenizerNotAvailableError
from lamina_hookspecs.types import Request, SamplingParams, StreamError, TokenChunk

from lamina_upstream.executor import UpstreamExecutor
from lamina_upstream.options import UpstreamOptions

SLOW_ECHO = """
[stack]
name = "slow-echo"
[executor]
use = "echo"
model = "echo-up"
token_delay_s = 0.05
"""


class TestUpstreamContract(ExecutorContract):
    registered_name = "openai-upstream"

    @pytest.fixture
    def component(self, echo_upstream: StackServer) -> UpstreamExecutor:
        return UpstreamExecutor(UpstreamOptions(url=echo_upstream.url, poll_interval_s=0.1))


def _client(server: StackServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def _metric(server: StackServer, name: str) -> float:
    """The sum of a metric's samples in a Lamina server's /metrics."""
    total = 0.0
    for line in httpx.get(f"{server.url}/metrics", timeout=5).text.splitlines():
        if line.startswith(name) and line[len(name)] in " {":
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_chat_and_completions_through_the_front_match_the_upstream(
        echo_upstream: StackServer, front: Callable[..., StackServer]) -> None:
    server = front(echo_upstream.url, served_name="front-model")
    client, direct = _client(server), _client(echo_upstream)
    assert [m.id for m in client.models.list().data] == ["front-model"]
    messages = [{"role": "user", "content": "the quick brown fox jumps"}]
    chat = client.chat.completions.create(model="front-model", messages=messages, max_tokens=3)
    upstream = direct.chat.completions.create(model="echo-up", messages=messages, max_tokens=3)
    assert chat.choices[0].message.content == upstream.choices[0].message.content == "the quick brown"
    assert chat.choices[0].finish_reason == "length"
    assert (chat.usage.prompt_tokens, chat.usage.completion_tokens) == (5, 3)
    stream = client.chat.completions.create(model="front-model", messages=messages, stream=True,
                                            stream_options={"include_usage": True})
    events = list(stream)
    assert "".join(e.choices[0].delta.content or "" for e in events if e.choices) == "the quick brown fox jumps"
    assert [e.choices[0].finish_reason for e in events if e.choices][-1] == "stop"
    assert events[-1].usage.completion_tokens == 5
    text = client.completions.create(model="front-model", prompt="one two three", max_tokens=2, stop=[" three"])
    assert text.choices[0].text == "one two" and text.choices[0].finish_reason == "length"
    stopped = client.completions.create(model="front-model", prompt="one two three", max_tokens=9, stop=[" three"])
    assert stopped.choices[0].text == "one two" and stopped.choices[0].finish_reason == "stop"


def test_the_token_ids_of_the_upstream_reach_the_client_over_stc(
        echo_upstream: StackServer, front: Callable[..., StackServer]) -> None:
    server = front(echo_upstream.url)
    body = {"model": "echo-up", "prompt": "alpha beta gamma delta", "stream": True}
    sse = httpx.post(f"{echo_upstream.url}/v1/completions", json=body, timeout=10).text
    expected = [event["choices"][0]["token_ids"] for event in _sse_events(sse) if event["choices"][0].get("token_ids")]
    response = httpx.post(f"{server.url}/v1/completions", json=body, headers={"Accept": "application/x-lamina-stc"},
                          timeout=10)
    assert response.status_code == 200 and response.headers["content-type"].startswith("application/x-lamina-stc")
    found = load_plugins().registry.get((layers.CODEC,), "stc", layers.CODEC.key)
    codec = found.factory(build_options(found.options, {}, "codec"), BuildContext(stack_name="test"))
    items = decode_stream(codec.decoder(), response.content)
    chunks = [item for item in items if isinstance(item, TokenChunk)]
    assert [list(c.token_ids) for c in chunks if c.token_ids] == expected and len(expected) == 4
    assert "".join(c.text for c in chunks) == "alpha beta gamma delta"
    assert chunks[-1].finish_reason == "stop" and chunks[-1].usage.completion_tokens == 4
    assert not any(isinstance(item, StreamError) for item in items)


def _sse_events(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


def test_an_upstream_400_keeps_its_status_and_message(echo_upstream: StackServer,
                                                       front: Callable[..., StackServer]) -> None:
    server = front(echo_upstream.url, context_length=100_000)  # the front lets through what the upstream refuses
    with pytest.raises(openai.BadRequestError) as refused:
        _client(server).completions.create(model="echo-up", prompt="a b c", max_tokens=5000)
    assert refused.value.status_code == 400
    assert "exceeds the context length 4096" in refused.value.message
    assert refused.value.code == "context_length_exceeded"
    assert httpx.get(f"{server.url}/ready", timeout=5).status_code == 200


def test_an_upstream_that_cannot_tokenize_answers_tokenize_with_its_404(echo_upstream: StackServer,
                                                                        front: Callable[..., StackServer]) -> None:
    server = front(echo_upstream.url)
    response = httpx.post(f"{server.url}/tokenize", json={"model": "echo-up", "prompt": "a b"}, timeout=10)
    assert response.status_code == 404
    assert response.json()["error"]["code"] == TokenizerNotAvailableError.CODE


def test_a_client_that_leaves_cancels_the_upstream_request(serve: Callable[[str], StackServer],
                                                           front: Callable[..., StackServer]) -> None:
    upstream = serve(SLOW_ECHO)
    server = front(upstream.url)
    body = {"model": "echo-up", "prompt": "word " * 200, "stream": True, "max_tokens": 200}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=10) as response:
        lines = response.iter_lines()
        assert any(line.startswith("data: {") for line in lines)
    deadline = time.monotonic() + 5  # the stream had 9 s left to run
    while (_metric(upstream, 'lamina_request_aborts_total{reason="client_gone"}') < 1
           or _metric(upstream, "lamina_num_requests_running") > 0 or _metric(server, "lamina_num_requests_running") > 0):
        assert time.monotonic() < deadline, "the upstream request outlived its client"
        time.sleep(0.05)


def test_an_upstream_killed_mid_stream_fails_the_stream_and_later_requests_get_503(
        serve: Callable[[str], StackServer], front: Callable[..., StackServer]) -> None:
    upstream = serve(SLOW_ECHO)
    server = front(upstream.url)
    body = {"model": "echo-up", "prompt": "word " * 100, "stream": True, "max_tokens": 100}
    events: list[str] = []
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=10) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(line)
                if len(events) == 3:
                    upstream.process.kill()
    assert events[-1] == "data: [DONE]" and '"error"' in events[-2]
    assert '"service_unavailable"' in events[-2]
    later = httpx.post(f"{server.url}/v1/completions", json={"model": "echo-up", "prompt": "hi"}, timeout=10)
    assert later.status_code == 503 and later.json()["error"]["type"] == "service_unavailable"


def test_prefix_affinity_keeps_a_prefix_on_one_of_two_upstreams(
        serve: Callable[[str], StackServer]) -> None:
    upstreams = [serve(SLOW_ECHO.replace("0.05", "0.0")) for _ in range(2)]
    backends = "".join(f'[[backends]]\nname = "up-{i}"\nexecutor = {{ use = "openai-upstream", url = "{u.url}" }}\n'
                       for i, u in enumerate(upstreams))
    server = serve(f'[stack]\nname = "pool"\n[router]\nuse = "prefix-affinity"\n{backends}')
    client = _client(server)

    def served() -> list[float]:
        return [_metric(u, "lamina_requests_total") for u in upstreams]

    shared = "You are a helpful assistant who answers in one short sentence. " * 4
    for i in range(8):
        client.completions.create(model="echo-up", prompt=f"{shared} question {i}", max_tokens=2)
    after_shared = served()
    assert sorted(after_shared) == [0, 8]
    for i in range(24):
        client.completions.create(model="echo-up", prompt=f"{i} different opening words here " * 8, max_tokens=2)
    spread = [b - a for a, b in zip(after_shared, served(), strict=True)]
    assert min(spread) >= 4 and sum(spread) == 24


def test_requests_over_max_in_flight_wait_here_within_their_bound(serve: Callable[[str], StackServer]) -> None:
    upstream = serve(SLOW_ECHO)

    def request(i: int) -> Request:
        return Request(id=f"r{i}", model="echo-up", prompt="word " * 50,
                       sampling=SamplingParams(max_tokens=50, ignore_eos=True))

    async def run() -> None:
        executor = UpstreamExecutor(UpstreamOptions(url=upstream.url, max_in_flight=1, max_queue_wait_s=0.3,
                                                    poll_interval_s=0.1))
        await executor.start()
        try:
            first = executor.generate(request(1))
            assert (await anext(first)).token_ids
            second = asyncio.ensure_future(_collect(executor.generate(request(2))))
            await asyncio.sleep(0.1)
            state = executor.state()
            assert (state.outstanding_requests, state.queue_depth) == (2, 1)
            with pytest.raises(ServiceUnavailableError) as waited:
                await second
            assert waited.value.code == "queue_timeout" and waited.value.retry_after
            await first.aclose()
            assert executor.state().outstanding_requests == 0
        finally:
            await executor.stop()

    asyncio.run(run())


async def _collect(stream: AsyncIterator[TokenChunk]) -> list[TokenChunk]:
    return [chunk async for chunk in stream]


def test_a_missing_api_key_variable_is_a_config_error_naming_the_option() -> None:
    executor = UpstreamExecutor(UpstreamOptions(url="http://127.0.0.1:9", api_key_env="LAMINA_TEST_UNSET_KEY"))
    with pytest.raises(ConfigError, match="api_key_env: environment variable LAMINA_TEST_UNSET_KEY is not set"):
        asyncio.run(executor.start())


def test_a_start_that_fails_closes_its_connections() -> None:
    executor = UpstreamExecutor(UpstreamOptions(url="http://127.0.0.1:9", start_timeout_s=0.2, poll_interval_s=0.05))
    with pytest.raises(BackendLostError, match="/v1/models"):
        asyncio.run(executor.start())
    assert executor._http is not None and executor._http.closed


def test_finished_streams_give_their_connections_back_and_count_no_abort(
        echo_upstream: StackServer, front: Callable[..., StackServer]) -> None:
    server = front(echo_upstream.url, max_in_flight=2)  # a pool of 6 connections to the upstream
    client = _client(server)
    for i in range(20):
        events = list(client.completions.create(model="echo-up", prompt=f"request {i} here", stream=True))
        assert "".join(e.choices[0].text for e in events) == f"request {i} here"
    assert _metric(server, "lamina_request_aborts_total") == 0


def test_a_generic_upstream_serves_text_usage_and_stc_without_token_ids(
        echo_upstream: StackServer, front: Callable[..., StackServer]) -> None:
    """``engine = "generic"`` reads an upstream as any OpenAI-compatible server: text and usage, no ids;
    the client gets the same text in OpenAI's format and over STC, TTFT is measured, and what needs
    the upstream's tokenizer or ids is refused by name."""
    server = front(echo_upstream.url, engine="generic")
    client = _client(server)
    messages = [{"role": "user", "content": "the quick brown fox jumps"}]
    chat = client.chat.completions.create(model="echo-up", messages=messages, max_tokens=3)
    assert chat.choices[0].message.content == "the quick brown" and chat.choices[0].finish_reason == "length"
    assert (chat.usage.prompt_tokens, chat.usage.completion_tokens) == (5, 3), "the upstream's usage"
    body = {"model": "echo-up", "prompt": "alpha beta gamma delta", "stream": True}
    sse = httpx.post(f"{server.url}/v1/completions", json=body, timeout=10).text
    assert not any(event["choices"][0].get("token_ids") for event in _sse_events(sse) if event["choices"])
    response = httpx.post(f"{server.url}/v1/completions", json=body, headers={"Accept": "application/x-lamina-stc"},
                          timeout=10)
    found = load_plugins().registry.get((layers.CODEC,), "stc", layers.CODEC.key)
    codec = found.factory(build_options(found.options, {}, "codec"), BuildContext(stack_name="test"))
    chunks = [item for item in decode_stream(codec.decoder(), response.content) if isinstance(item, TokenChunk)]
    assert "".join(c.text for c in chunks) == "alpha beta gamma delta" and not any(c.token_ids for c in chunks)
    assert chunks[-1].finish_reason == "stop" and chunks[-1].usage.completion_tokens == 4
    assert _metric(server, "lamina_time_to_first_token_seconds_count") == 3
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="echo-up", messages=messages, max_tokens=2, logprobs=True)
    assert "logprobs" in refused.value.message
    tokenize = httpx.post(f"{server.url}/tokenize", json={"model": "echo-up", "prompt": "a b"}, timeout=10)
    assert tokenize.status_code == 404 and tokenize.json()["error"]["code"] == TokenizerNotAvailableError.CODE


def test_an_upstream_is_known_by_its_owner_and_one_of_unknown_owner_is_read_as_generic(
        echo_upstream: StackServer) -> None:
    executor = UpstreamExecutor(UpstreamOptions(url=echo_upstream.url, poll_interval_s=0.1))

    async def engine(owned_by: str) -> str | None:
        entry = {"id": "echo-up", "owned_by": owned_by, "max_model_len": 4096}

        async def listed(deadline: float) -> dict[str, object]:
            return entry

        executor.engine = None
        executor._model_entry = listed  # type: ignore[method-assign]
        await executor.start()
        try:
            return executor.engine
        finally:
            await executor.stop()

    assert asyncio.run(engine("sglang")) == "sglang"
    assert asyncio.run(engine("lamina")) == "lamina"
    assert asyncio.run(engine("meta-llama/Llama-3.1-8B-Instruct")) == "generic"  # TGI's owner is its model
