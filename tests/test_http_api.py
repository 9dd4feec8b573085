"""The OpenAI-compatible HTTP API on a live loopback server (echo executor), with the official client."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
from lamina_hookspecs import hookimpl
from lamina_hookspecs.errors import InternalError
from lamina_hookspecs.types import BackendState, ModelInfo, Request, TokenChunk

ECHO = {"executor": {"use": "echo", "context_length": 64}}


@pytest.fixture
def echo(live: Any) -> Any:
    return live(ECHO)


def client(server: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def test_openai_client_chat_and_completions_streaming_and_not(echo: Any) -> None:
    c = client(echo)
    chat = c.chat.completions.create(model="echo", messages=[{"role": "user", "content": "one two three"}])
    assert chat.choices[0].message.content == "one two three" and chat.choices[0].finish_reason == "stop"
    assert (chat.usage.prompt_tokens, chat.usage.completion_tokens, chat.usage.total_tokens) == (3, 3, 6)
    stream = c.chat.completions.create(model="echo", messages=[{"role": "user", "content": "a b c d"}], stream=True,
                                       max_tokens=3, stream_options={"include_usage": True})
    parts, usage, finish = [], None, None
    for event in stream:
        if event.choices:
            parts.append(event.choices[0].delta.content or "")
            finish = event.choices[0].finish_reason or finish
        usage = event.usage or usage
    assert "".join(parts) == "a b c" and finish == "length" and usage.completion_tokens == 3
    completion = c.completions.create(model="echo", prompt="x y", max_tokens=5)
    assert completion.choices[0].text == "x y" and completion.usage.prompt_tokens == 2
    streamed = "".join(e.choices[0].text for e in c.completions.create(model="echo", prompt="p q r", stream=True)
                       if e.choices)
    assert streamed == "p q r"
    assert [m.id for m in c.models.list()] == ["echo"]


def test_request_id_header_and_health_endpoints(echo: Any) -> None:
    response = httpx.post(f"{echo.url}/v1/completions", json={"model": "echo", "prompt": "hi"})
    assert response.headers["x-request-id"].startswith("cmpl-") and response.json()["id"] == response.headers[
        "x-request-id"]
    assert httpx.get(f"{echo.url}/health").json() == {"status": "ok"}
    assert httpx.get(f"{echo.url}/ready").status_code == 200
    metrics = httpx.get(f"{echo.url}/metrics").text
    for name in ("lamina_requests_total", "lamina_time_to_first_token_seconds_bucket", "vllm:num_requests_waiting",
                 "vllm:num_requests_running", "vllm:kv_cache_usage_perc", "lamina_e2e_request_latency_seconds_count",
                 "lamina_generation_tokens_total"):
        assert name in metrics, name


CHAT = {"model": "echo", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(("path", "send", "status", "param"), [
    ("chat/completions", {"content": b"{not json"}, 400, None),
    ("chat/completions", {"json": {**CHAT, "temperature": "hot"}}, 400, "temperature"),
    ("chat/completions", {"json": {**CHAT, "model": "gpt-9"}}, 404, "model"),
    ("chat/completions", {"json": {**CHAT, "messages": []}}, 400, "messages"),
    ("chat/completions", {"json": {**CHAT, "messages": [{"role": "wizard", "content": "x"}]}}, 400,
     "messages[0].role"),
    ("chat/completions", {"json": {**CHAT, "n": 0}}, 400, "n"),
    ("completions", {"json": {"model": "echo", "prompt": "x", "n": 2, "best_of": 3}}, 400, "best_of"),
    ("chat/completions", {"json": {**CHAT, "n": 2, "stream": True},
                          "headers": {"accept": "application/x-lamina-stc"}}, 400, "n"),
    ("chat/completions", {"json": {**CHAT, "max_tokens": 0}}, 400, "max_tokens"),
    ("completions", {"json": {"model": "echo", "prompt": "w " * 60, "max_tokens": 10}}, 400, "messages"),
    ("completions", {"json": {"model": "echo", "prompt": ""}}, 400, "prompt"),
    ("completions", {"content": b"x" * (2 << 20), "headers": {"content-type": "application/json"}}, 413, None),
    ("completions", {"content": b"prompt=hi", "headers": {"content-type": "text/plain"}}, 415, None),
    ("completions", {"json": {"model": "echo", "prompt": "x"}, "headers": {"accept": "application/x-nope"}}, 406,
     None),
    ("chat/completions", {"json": CHAT, "headers": {"x-lamina-max-queue-wait": "soon"}}, 400,
     "x-lamina-max-queue-wait"),
    ("chat/completions", {"json": CHAT, "headers": {"x-lamina-max-queue-wait": "0"}}, 400,
     "x-lamina-max-queue-wait"),
])
def test_bad_input_gets_the_right_status_and_an_openai_error_body(echo: Any, path: str, send: dict[str, Any],
                                                                  status: int, param: str | None) -> None:
    response = httpx.post(f"{echo.url}/v1/{path}", **send)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if param is not None:
        assert error["param"] == param
    assert httpx.post(f"{echo.url}/v1/chat/completions", json=CHAT).status_code == 200, "still serving"


def test_unknown_fields_are_ignored_and_named_unless_the_stack_is_strict(live: Any, lamina_logs: Any) -> None:
    lenient, strict = live(ECHO), live({**ECHO, "server": {"strict_fields": True}})
    body = {**CHAT, "metadata": {"k": "v"}, "store": False, "service_tier": "auto", "reasoning_effort": "low"}
    response = httpx.post(f"{lenient.url}/v1/chat/completions", json=body)
    assert response.status_code == 200 and response.json()["choices"][0]["message"]["content"] == "hi"
    assert response.headers["x-lamina-ignored-fields"] == "metadata,reasoning_effort,service_tier,store"
    assert [e["fields"] for e in lamina_logs if e["event"] == "request_fields_ignored"] == [
        ["metadata", "reasoning_effort", "service_tier", "store"]]
    assert "x-lamina-ignored-fields" not in httpx.post(f"{lenient.url}/v1/chat/completions", json=CHAT).headers
    refused = httpx.post(f"{strict.url}/v1/chat/completions", json=body)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "metadata"
    with openai.OpenAI(base_url=f"{lenient.url}/v1", api_key="unused", max_retries=0) as c:
        reply = c.chat.completions.create(model="echo", messages=[{"role": "developer", "content": "be brief"}],
                                          metadata={"k": "v"}, store=False, parallel_tool_calls=True,
                                          extra_body={"chat_template_kwargs": {"x": 1}})
    assert reply.choices[0].message.content == "be brief"


def test_null_means_not_given_for_every_optional_field(echo: Any) -> None:
    from lamina.server.openai_api import FIELDS

    for path, required in (("chat/completions", CHAT), ("completions", {"model": "echo", "prompt": "x y"})):
        kind = "chat" if path.startswith("chat") else "completion"
        body = {**required, **dict.fromkeys(FIELDS[kind] - set(required))}
        response = httpx.post(f"{echo.url}/v1/{path}", json=body)
        assert response.status_code == 200, response.text


def test_tokenize_needs_an_executor_that_tokenizes(echo: Any) -> None:
    response = httpx.post(f"{echo.url}/tokenize", json={"model": "echo", "prompt": "a b"})
    assert response.status_code == 404 and response.json()["error"]["code"] == "tokenizer_not_available"
    bad = httpx.post(f"{echo.url}/detokenize", json={"model": "echo", "tokens": "a"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"


def test_version(echo: Any) -> None:
    from lamina import __version__

    assert httpx.get(f"{echo.url}/version").json() == {"version": __version__}


def test_unknown_routes_and_methods(echo: Any) -> None:
    assert httpx.get(f"{echo.url}/v2/nothing").json()["error"]["type"] == "not_found_error"
    assert httpx.get(f"{echo.url}/v1/completions").status_code == 405


class Flaky:
    """An executor that fails any request whose prompt says "boom", after one token."""

    model = ModelInfo(id="flaky", context_length=100)

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def state(self) -> BackendState:
        return BackendState(name="flaky", model="flaky")

    async def generate(self, request: Request) -> AsyncIterator[TokenChunk]:
        yield TokenChunk(request_id=request.id, index=0, token_ids=(1,), text="ok")
        if "boom" in (request.prompt or ""):
            raise RuntimeError("device fell over")
        await asyncio.sleep(0.05)
        yield TokenChunk(request_id=request.id, index=1, finish_reason="stop", usage=None)

    @hookimpl
    def lamina_register_executors(self, register: Any) -> None:
        register("flaky", lambda options, context: Flaky())


def test_an_executor_failure_fails_only_that_request(live: Any) -> None:
    server = live({"executor": {"use": "flaky"}}, ("flaky", Flaky()))
    failed = httpx.post(f"{server.url}/v1/completions", json={"model": "flaky", "prompt": "boom"})
    assert failed.status_code == 500 and failed.json()["error"]["type"] == "server_error"
    streamed = httpx.post(f"{server.url}/v1/completions", json={"model": "flaky", "prompt": "boom", "stream": True})
    assert streamed.status_code == 200 and b'"error"' in streamed.content and streamed.content.endswith(
        b"data: [DONE]\n\n")
    assert httpx.post(f"{server.url}/v1/completions", json={"model": "flaky", "prompt": "fine"}).status_code == 200
    assert InternalError.http_status == 500


def test_several_choices_streamed_and_not_through_the_openai_client(echo: Any) -> None:
    c = client(echo)
    chat = c.chat.completions.create(model="echo", messages=[{"role": "user", "content": "one two three"}], n=3,
                                     max_tokens=2)
    assert [(ch.index, ch.message.content, ch.finish_reason) for ch in chat.choices] == [
        (i, "one two", "length") for i in range(3)]
    assert (chat.usage.prompt_tokens, chat.usage.completion_tokens) == (3, 6)
    texts, finishes, usage = ["", ""], [None, None], None
    for event in c.completions.create(model="echo", prompt="p q r", n=2, echo=True, stream=True,
                                      stream_options={"include_usage": True}):
        for choice in event.choices:
            texts[choice.index] += choice.text
            finishes[choice.index] = choice.finish_reason or finishes[choice.index]
        usage = event.usage or usage
    assert texts == ["p q rp q r"] * 2 and finishes == ["stop"] * 2 and usage.completion_tokens == 6


def test_more_stop_strings_than_openai_takes(echo: Any) -> None:
    stops = [f"never{i}" for i in range(9)] + [" c"]
    reply = client(echo).completions.create(model="echo", prompt="a b c d", stop=stops)
    assert reply.choices[0].text == "a b" and reply.choices[0].finish_reason == "stop"


def test_echo_puts_the_prompt_before_the_completion(echo: Any) -> None:
    c = client(echo)
    assert c.completions.create(model="echo", prompt="x y", echo=True).choices[0].text == "x yx y"
    streamed = [e.choices[0].text for e in c.completions.create(model="echo", prompt="p q", echo=True, stream=True)
                if e.choices]
    assert streamed[0] == "p qp" and "".join(streamed) == "p qp q"
    for body, rule in (({"prompt": [5, 7]}, "cannot decode"), ({"prompt": "x", "logprobs": 1}, "logprobs")):
        with pytest.raises(openai.BadRequestError) as refused:
            c.completions.create(model="echo", echo=True, **body)
        assert refused.value.body["param"] == "echo" and rule in refused.value.body["message"]
