"""Admission through the live HTTP server: API keys → tenants, 401/429/503 bodies and headers,
the openai client with a key, tenants in metrics, and keys kept out of the logs."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
from lamina_hookspecs import hookimpl
from lamina_hookspecs.errors import InternalError
from lamina_hookspecs.types import BackendState, ModelInfo, Request, RequestContext, TokenChunk, Usage

KEY = "sk-test-4f1d9c0a7b"
CHAT = {"model": "echo", "messages": [{"role": "user", "content": "hello there"}]}


@pytest.fixture
def keys_env(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("LAMINA_TEST_KEYS", f"acme={KEY},globex=sk-other")
    return "LAMINA_TEST_KEYS"


class RoutedCounter:
    """Counts requests that reached a backend."""

    def __init__(self) -> None:
        self.routed = 0

    @hookimpl
    def lamina_request_routed(self, ctx: RequestContext) -> None:
        self.routed += 1


def test_api_keys_map_to_tenants_through_the_openai_client(live: Any, keys_env: str, lamina_logs: Any) -> None:
    server = live({"executor": {"use": "echo"}, "admission": [{"use": "api-keys", "keys_env": keys_env}]})
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0) as client:
        reply = client.chat.completions.create(model="echo", messages=[{"role": "user", "content": "a b"}])
    assert reply.choices[0].message.content == "a b"
    with (openai.OpenAI(base_url=f"{server.url}/v1", api_key="sk-wrong", max_retries=0) as client,
          pytest.raises(openai.AuthenticationError) as info):
        client.chat.completions.create(model="echo", messages=[{"role": "user", "content": "a"}])
    assert info.value.status_code == 401 and info.value.code == "invalid_api_key"
    missing = httpx.post(f"{server.url}/v1/chat/completions", json=CHAT)
    assert missing.status_code == 401 and missing.json()["error"]["code"] == "missing_api_key"
    assert missing.json()["error"]["type"] == "authentication_error"
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0) as client:
        assert [m.id for m in client.models.list()] == ["echo"]
    models = httpx.get(f"{server.url}/v1/models")
    assert models.status_code == 401 and models.json()["error"]["code"] == "missing_api_key"
    assert httpx.get(f"{server.url}/v1/models", headers={"authorization": "Bearer sk-wrong"}).status_code == 401
    metrics = httpx.get(f"{server.url}/metrics").text
    assert 'lamina_requests_total{arm="",endpoint="chat",status="200",tenant="acme"} 1.0' in metrics
    assert 'lamina_generation_tokens_total{arm="",tenant="acme"} 2.0' in metrics
    assert lamina_logs, "the server logged its requests"
    assert not any(KEY in repr(entry) for entry in lamina_logs), "an API key reached the logs"


def test_a_rate_limited_request_gets_429_with_retry_after_and_never_reaches_a_backend(live: Any) -> None:
    counter = RoutedCounter()
    server = live({"executor": {"use": "echo"},
                   "admission": [{"use": "token-bucket", "capacity": 2, "rate": 0.01, "key_by": "client"}]},
                  ("counter", counter))
    statuses = [httpx.post(f"{server.url}/v1/chat/completions", json=CHAT) for _ in range(3)]
    assert [r.status_code for r in statuses] == [200, 200, 429]
    refused = statuses[-1]
    assert int(refused.headers["retry-after"]) >= 99
    assert refused.json()["error"]["type"] == "rate_limit_error" and refused.json()["error"]["code"] == \
        "rate_limit_exceeded"
    assert counter.routed == 2


def test_invalid_bodies_are_named_by_the_compiled_validator(live: Any) -> None:
    server = live({"executor": {"use": "echo"}, "admission": [{"use": "openai-schema"}]})
    response = httpx.post(f"{server.url}/v1/chat/completions",
                          json={**CHAT, "messages": [{"role": "wizard", "content": "x"}]})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "messages[0].role"
    assert error["message"] == "messages[0].role: must be one of system, user, assistant, tool, developer"


class Flaky:
    """An executor that fails every prompt starting with 'fail'."""

    model = ModelInfo(id="echo", context_length=64)

    async def start(self) -> None:
        """Nothing to load."""

    async def stop(self) -> None:
        """Nothing to free."""

    def state(self) -> BackendState:
        return BackendState(name="flaky", model="echo")

    def generate(self, request: Request) -> AsyncIterator[TokenChunk]:
        if (request.messages[-1].content if request.messages else "").startswith("fail"):
            raise InternalError("the backend fell over")
        return self._ok(request)

    async def _ok(self, request: Request) -> AsyncIterator[TokenChunk]:
        yield TokenChunk(request_id=request.id, index=0, token_ids=(1,), text="ok", finish_reason="stop",
                         usage=Usage(prompt_tokens=1, completion_tokens=1))


class FlakyPlugin:
    @hookimpl
    def lamina_register_executors(self, register: Any) -> None:
        register("flaky", lambda options, context: Flaky())


def test_an_open_circuit_answers_503_with_retry_after(live: Any) -> None:
    server = live({"executor": {"use": "flaky"},
                   "admission": [{"use": "error-rate", "min_requests": 3, "failure_rate": 0.6, "cooldown_s": 30}]},
                  ("flaky", FlakyPlugin()))

    def send(content: str) -> httpx.Response:
        return httpx.post(f"{server.url}/v1/chat/completions",
                          json={"model": "echo", "messages": [{"role": "user", "content": content}]})

    assert send("hi").status_code == 200
    assert [send("fail").status_code for _ in range(2)] == [500, 500]
    refused = send("hi")
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "circuit_open"
    assert 1 <= int(refused.headers["retry-after"]) <= 30


def test_serving_beyond_loopback_without_keys_warns(keys_env: str, capsys: pytest.CaptureFixture[str]) -> None:
    from lamina.kernel.plugins import load_plugins
    from lamina.server.serve import warn_if_open
    from lamina.kernel.stack import Stack
    from lamina.kernel.stack_config import StackConfig

    plugins = load_plugins()

    def stack(admission: list[dict[str, Any]]) -> Stack:
        return Stack(StackConfig.from_dict({"executor": {"use": "echo"}, "admission": admission}, plugins.registry),
                     plugins)

    open_stack = stack([])
    assert not warn_if_open(open_stack, "127.0.0.1") and not warn_if_open(open_stack, "::1")
    assert not warn_if_open(open_stack, "localhost")
    assert warn_if_open(open_stack, "0.0.0.0")
    assert "without authentication" in capsys.readouterr().err
    assert not warn_if_open(stack([{"use": "api-keys", "keys_env": keys_env}]), "0.0.0.0")
