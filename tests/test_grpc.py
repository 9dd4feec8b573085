"""The gRPC API (``lamina.v1.Inference``) on a loopback server (echo executor), with a ``grpc.aio`` client."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import attrs
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families
from lamina.kernel import tool_calls
from lamina.kernel.plugins import load_plugins
from lamina.pool.remote import RemoteExecutor
from lamina.server import grpc_service
from lamina.server.metrics import Metrics
from lamina.wire import convert
from lamina.server.grpc_service import InferenceService, start_grpc
from lamina.server.openai_api import parse_chat, parse_completion
from lamina.wire.proto.lamina.v1 import inference_pb2 as pb
from lamina.wire.proto.lamina.v1 import inference_pb2_grpc as pb_grpc
from lamina.wire.error_trailers import ERROR_CLASS, error_from_trailers, error_trailers
from lamina.wire.queue_wait import MAX_QUEUE_WAIT_HEADER
from lamina.kernel.stack import Stack
from lamina.kernel.stack_config import StackConfig
from lamina_hookspecs import hookimpl
from lamina_hookspecs.errors import (BackendLostError, ContextLengthError, InvalidRequestError, LaminaError,
                                     RateLimitError, ServiceUnavailableError)
from lamina_hookspecs.types import BackendState, ModelInfo, Request, SamplingParams, TokenChunk, ToolCallDelta

ECHO = {"executor": {"use": "echo", "context_length": 64}}
SLOW = {"executor": {"use": "echo", "context_length": 64, "token_delay_s": 0.05}}
WORDS = " ".join(f"w{i}" for i in range(30))


class Live:
    """A started stack served over gRPC on a free loopback port, and a channel to it."""

    def __init__(self, stack: Stack, service: InferenceService, channel: grpc.aio.Channel, address: str) -> None:
        self.stack, self.service, self.channel, self.address = stack, service, channel, address
        self.stub = pb_grpc.InferenceStub(channel)

    def running(self) -> int:
        """Requests the executors hold (and so their KV cache)."""
        return sum(executor.state().outstanding_requests for executor in self.stack.backends.values())

    async def settled(self) -> None:
        """Wait until no request is held anywhere."""
        deadline = time.monotonic() + 2
        while self.running() or self.service.in_flight:
            assert time.monotonic() < deadline, (self.running(), self.service.in_flight)
            await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def serving(config: dict[str, Any], *extra: tuple[str, object]) -> AsyncIterator[Live]:
    plugins = load_plugins(extra=extra)
    stack = Stack(StackConfig.from_dict(config, plugins.registry), plugins)
    await stack.start()
    service = InferenceService(stack)
    server, port = await start_grpc(service, "127.0.0.1", 0)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield Live(stack, service, channel, f"127.0.0.1:{port}")
    finally:
        await service.drain()
        await server.stop(None)
        await stack.stop()


def run(config: dict[str, Any], scenario: Callable[[Live], Awaitable[None]], *extra: tuple[str, object]) -> None:
    async def main() -> None:
        async with serving(config, *extra) as live:
            await scenario(live)

    asyncio.run(main())


async def read_rest(call: Any) -> list[pb.GenerateChunk]:
    """The chunks of a call read with ``read()`` (it cannot be iterated then)."""
    chunks = []
    while (chunk := await call.read()) is not grpc.aio.EOF:
        chunks.append(chunk)
    return chunks


def text(prompt: str, **sampling: Any) -> pb.GenerateRequest:
    return pb.GenerateRequest(model="echo", text=prompt, sampling=pb.SamplingParams(**sampling))


def test_generate_streams_tokens_and_ends_with_usage() -> None:
    async def scenario(live: Live) -> None:
        call = live.stub.Generate(text("one two three"))
        request_id = dict(await call.initial_metadata())["x-request-id"]
        chunks = [chunk async for chunk in call]
        assert [c.text for c in chunks] == ["one", " two", " three", ""]
        assert [c.index for c in chunks] == [0, 1, 2, 3] and all(len(c.token_ids) == 1 for c in chunks[:3])
        assert {c.request_id for c in chunks} == {request_id} and request_id.startswith("gen-")
        final = chunks[-1]
        assert final.finish_reason == "stop" and all(not c.finish_reason for c in chunks[:-1])
        assert (final.usage.prompt_tokens, final.usage.completion_tokens) == (3, 3)
        assert not any(c.HasField("usage") for c in chunks[:-1])

        chunks = [c async for c in live.stub.Generate(text("a b c d", max_tokens=2, stop=["zzz"]))]
        assert "".join(c.text for c in chunks) == "a b" and chunks[-1].finish_reason == "length"
        chat = pb.GenerateRequest(request_id="mine-1", model="echo", chat=pb.Chat(messages=[
            pb.ChatMessage(role="system", content="be brief"), pb.ChatMessage(role="user", content="hi there")]))
        chunks = [c async for c in live.stub.Generate(chat)]
        assert "".join(c.text for c in chunks) == "hi there" and {c.request_id for c in chunks} == {"mine-1"}
        ids = pb.GenerateRequest(model="echo", token_ids=pb.TokenIds(ids=[5, 7]))
        chunks = [c async for c in live.stub.Generate(ids)]
        assert "".join(c.text for c in chunks) == " <5> <7>" and chunks[-1].usage.prompt_tokens == 2
        await live.settled()

    run(ECHO, scenario)


BAD = [
    (pb.GenerateRequest(model="gpt-9", text="hi"), grpc.StatusCode.NOT_FOUND, "gpt-9"),
    (pb.GenerateRequest(model="", text="hi"), grpc.StatusCode.INVALID_ARGUMENT, "model"),
    (text(""), grpc.StatusCode.INVALID_ARGUMENT, "prompt"),
    (pb.GenerateRequest(model="echo"), grpc.StatusCode.INVALID_ARGUMENT, "prompt"),
    (pb.GenerateRequest(model="echo", token_ids=pb.TokenIds()), grpc.StatusCode.INVALID_ARGUMENT, "prompt"),
    (pb.GenerateRequest(model="echo", chat=pb.Chat()), grpc.StatusCode.INVALID_ARGUMENT, "messages"),
    (pb.GenerateRequest(model="echo", chat=pb.Chat(messages=[pb.ChatMessage(role="wizard", content="x")])),
     grpc.StatusCode.INVALID_ARGUMENT, "messages[0].role"),
    (text("hi", max_tokens=0), grpc.StatusCode.INVALID_ARGUMENT, "max_tokens"),
    (text("hi", temperature=2.5), grpc.StatusCode.INVALID_ARGUMENT, "temperature"),
    (text("hi", top_p=0), grpc.StatusCode.INVALID_ARGUMENT, "top_p"),
    (text("hi", stop=["a"] * 65), grpc.StatusCode.INVALID_ARGUMENT, "stop"),
    (text("hi", top_logprobs=3), grpc.StatusCode.INVALID_ARGUMENT, "top_logprobs"),
    (text("w " * 60, max_tokens=10), grpc.StatusCode.INVALID_ARGUMENT, "context length"),
    (pb.GenerateRequest(request_id="bad id\n", model="echo", text="hi"), grpc.StatusCode.INVALID_ARGUMENT,
     "request_id"),
    (pb.GenerateRequest(model="echo", chat=pb.Chat(messages=[pb.ChatMessage(role="user", content="x")],
                                                   tools=[pb.Tool(name="f", parameters="{")])),
     grpc.StatusCode.INVALID_ARGUMENT, "tools[0].parameters"),
    (pb.GenerateRequest(model="echo", chat=pb.Chat(messages=[pb.ChatMessage(role="user", content="x")],
                                                   tools=[pb.Tool(name="f")], tool_function="g")),
     grpc.StatusCode.INVALID_ARGUMENT, "tool_choice"),
]


def test_bad_input_gets_the_status_of_its_error() -> None:
    async def scenario(live: Live) -> None:
        for request, code, mentions in BAD:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                [c async for c in live.stub.Generate(request)]
            assert caught.value.code() == code, (request, caught.value)
            assert mentions in (caught.value.details() or ""), (request, caught.value.details())
        assert [c.text async for c in live.stub.Generate(text("still ok"))][-2] == " ok"
        await live.settled()

    run(ECHO, scenario)


def test_list_models_health_reflection_and_drain() -> None:
    async def scenario(live: Live) -> None:
        models = await live.stub.ListModels(pb.ListModelsRequest())
        assert [(m.id, m.context_length, m.owned_by) for m in models.models] == [("echo", 64, "lamina")]

        health = health_pb2_grpc.HealthStub(live.channel)
        for service in ("", "lamina.v1.Inference"):
            reply = await health.Check(health_pb2.HealthCheckRequest(service=service))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING

        reflect = reflection_pb2_grpc.ServerReflectionStub(live.channel)
        asks = [reflection_pb2.ServerReflectionRequest(list_services=""),
                reflection_pb2.ServerReflectionRequest(file_containing_symbol="lamina.v1.Inference")]
        listed, described = [reply async for reply in reflect.ServerReflectionInfo(iter(asks))]
        assert {s.name for s in listed.list_services_response.service} == {
            "lamina.v1.Inference", "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"}
        assert described.file_descriptor_response.file_descriptor_proto

        await live.service.drain()
        reply = await health.Check(health_pb2.HealthCheckRequest(service="lamina.v1.Inference"))
        assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            [c async for c in live.stub.Generate(text("hi"))]
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        assert dict(caught.value.trailing_metadata())["retry-after"] == "5"

    run(ECHO, scenario)


def test_abort_ends_the_stream_with_finish_reason_abort_and_frees_the_request() -> None:
    async def scenario(live: Live) -> None:
        call = live.stub.Generate(pb.GenerateRequest(request_id="long-1", model="echo", text=WORDS))
        first = await call.read()
        assert first.text == "w0" and live.running() == 1
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            [c async for c in live.stub.Generate(pb.GenerateRequest(request_id="long-1", model="echo", text="x"))]
        assert caught.value.code() == grpc.StatusCode.ALREADY_EXISTS, "the id is taken while it runs"

        await live.stub.Abort(pb.AbortRequest(request_id="long-1"))
        rest = await read_rest(call)
        assert rest and rest[-1].finish_reason == "abort" and not rest[-1].HasField("usage")
        assert rest[-1].index == 1 + sum(len(c.token_ids) for c in rest)
        assert len(rest) < 10 and await call.code() == grpc.StatusCode.OK
        await live.settled()

        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await live.stub.Abort(pb.AbortRequest(request_id="long-1"))
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
        assert [c.text async for c in live.stub.Generate(text("after"))][0] == "after"

    run(SLOW, scenario)


def test_the_drain_aborts_what_is_still_running_when_it_runs_out_of_time() -> None:
    async def scenario(live: Live) -> None:
        call = live.stub.Generate(pb.GenerateRequest(request_id="long-2", model="echo", text=WORDS))
        assert (await call.read()).text == "w0"
        await live.service.drain()
        assert live.service.abort_in_flight() == ["long-2"]
        rest = await read_rest(call)
        assert rest and rest[-1].finish_reason == "abort" and len(rest) < 10
        assert await call.code() == grpc.StatusCode.OK
        await live.settled()

    run(SLOW, scenario)


def test_a_client_that_cancels_frees_its_request() -> None:
    async def scenario(live: Live) -> None:
        call = live.stub.Generate(text(WORDS))
        assert (await call.read()).text == "w0" and live.running() == 1
        call.cancel()
        await live.settled()
        assert await call.code() == grpc.StatusCode.CANCELLED

    run(SLOW, scenario)


class Flaky:
    """An executor that fails after one token, and reports the health it is told."""

    model = ModelInfo(id="flaky", context_length=100)
    healthy = True

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def state(self) -> BackendState:
        return BackendState(name="flaky", model="flaky", healthy=self.healthy, queue_depth=2, kv_blocks_used=3,
                            kv_blocks_total=8, tokens_per_s=12.5, preemptions=4, draft_tokens=30,
                            accepted_draft_tokens=21)

    async def generate(self, request: Request) -> AsyncIterator[TokenChunk]:
        yield TokenChunk(request_id=request.id, index=0, token_ids=(1,), text="ok")
        raise RuntimeError("device fell over")

    @hookimpl
    def lamina_register_executors(self, register: Any) -> None:
        register("flaky", lambda options, context: self)


def test_an_executor_failure_after_tokens_ends_the_stream_with_internal() -> None:
    async def scenario(live: Live) -> None:
        call = live.stub.Generate(pb.GenerateRequest(model="flaky", text="hi"))
        assert (await call.read()).text == "ok"
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call.read()
        assert caught.value.code() == grpc.StatusCode.INTERNAL and "RuntimeError" in (caught.value.details() or "")

    run({"executor": {"use": "flaky"}}, scenario, ("flaky", Flaky()))


def test_health_follows_the_executors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(grpc_service, "HEALTH_POLL_S", 0.01)
    flaky = Flaky()
    flaky.healthy = False

    async def status(live: Live) -> int:
        request = health_pb2.HealthCheckRequest(service="lamina.v1.Inference")
        return (await health_pb2_grpc.HealthStub(live.channel).Check(request)).status

    async def scenario(live: Live) -> None:
        assert await status(live) == health_pb2.HealthCheckResponse.NOT_SERVING
        flaky.healthy = True
        deadline = time.monotonic() + 2
        while await status(live) != health_pb2.HealthCheckResponse.SERVING:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)

    run({"executor": {"use": "flaky"}}, scenario, ("flaky", flaky))


def test_one_health_poller_runs_until_drain() -> None:
    def pollers() -> list[asyncio.Task[Any]]:
        return [t for t in asyncio.all_tasks() if t.get_coro().__name__ == "_poll_health"]  # type: ignore[union-attr]

    async def scenario(live: Live) -> None:
        await live.service.watch_health()  # start_grpc watches already: a second call adds no poller
        assert len(pollers()) == 1
        await live.service.drain()
        await asyncio.sleep(0)
        assert not [t for t in pollers() if not t.done()]

    run({"executor": {"use": "echo"}}, scenario)


class Recording:
    """An executor that answers one token and keeps the requests it was given."""

    model = ModelInfo(id="recording", context_length=100)

    def __init__(self) -> None:
        self.requests: list[Request] = []

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def state(self) -> BackendState:
        return BackendState(name="recording", model="recording")

    async def generate(self, request: Request) -> AsyncIterator[TokenChunk]:
        self.requests.append(request)
        yield TokenChunk(request_id=request.id, index=0, token_ids=(1,), text="ok", finish_reason="stop")

    @hookimpl
    def lamina_register_executors(self, register: Any) -> None:
        register("recording", lambda options, context: self)


def test_the_clients_queue_wait_bound_reaches_the_executor_and_a_gateways_workers() -> None:
    """``x-lamina-max-queue-wait`` metadata becomes the request's ``max_queue_wait_s``; a remote
    backend forwards it; a value that is not a positive number is INVALID_ARGUMENT naming it."""
    recording = Recording()

    async def scenario(live: Live) -> None:
        call = live.stub.Generate(pb.GenerateRequest(model="recording", text="hi"),
                                  metadata=((MAX_QUEUE_WAIT_HEADER, "2.5"),))
        assert [c.text async for c in call] == ["ok"]
        assert [c.text async for c in live.stub.Generate(pb.GenerateRequest(model="recording", text="hi"))] == ["ok"]
        assert [r.max_queue_wait_s for r in recording.requests] == [2.5, None]
        with pytest.raises(grpc.aio.AioRpcError) as bad:
            [c async for c in live.stub.Generate(pb.GenerateRequest(model="recording", text="hi"),
                                                 metadata=((MAX_QUEUE_WAIT_HEADER, "-1"),))]
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT and MAX_QUEUE_WAIT_HEADER in bad.value.details()
        remote = RemoteExecutor("w", live.address, connect_timeout_s=5)
        await remote.start()
        try:
            request = Request(id="r1", model="recording", prompt="hi", max_queue_wait_s=0.75)
            assert [c.text async for c in remote.generate(request)] == ["ok"]
        finally:
            await remote.stop()
        assert recording.requests[-1].max_queue_wait_s == 0.75

    run({"executor": {"use": "recording"}}, scenario, ("recording", recording))


class Refusing(Recording):
    """An executor that refuses every request with ``error``."""

    def __init__(self, error: LaminaError) -> None:
        super().__init__()
        self.error = error

    async def generate(self, request: Request) -> AsyncIterator[TokenChunk]:
        raise self.error
        yield  # an async generator, as executors are


@pytest.mark.parametrize("error", [
    ServiceUnavailableError("the server is overloaded", code="overloaded", retry_after=7.0),
    ServiceUnavailableError("waited past the bound", code="queue_timeout", retry_after=1.0),
    RateLimitError("tenant over its token rate", code="rate_limit_exceeded", retry_after=3.0),
    ContextLengthError("too long for the context", param="prompt"),
    InvalidRequestError("bad temperature", param="temperature"),
], ids=lambda error: error.code or type(error).__name__)
def test_a_workers_error_reaches_the_gateway_as_the_same_error(error: LaminaError) -> None:
    """A worker's refusal keeps its class, code, param and Retry-After through the gateway: a 503
    ``overloaded`` stays one (not a lost backend to retry), as a single server would answer."""
    refusing = Refusing(error)

    async def scenario(live: Live) -> None:
        remote = RemoteExecutor("w", live.address, connect_timeout_s=5)
        await remote.start()
        try:
            with pytest.raises(LaminaError) as caught:
                [c async for c in remote.generate(Request(id="r1", model="recording", prompt="hi"))]
        finally:
            await remote.stop()
        got = caught.value
        assert (type(got), got.message, got.code, got.param, got.retry_after) == \
            (type(error), error.message, error.code, error.param, error.retry_after)
        assert not isinstance(got, BackendLostError)

    run({"executor": {"use": "recording"}}, scenario, ("recording", refusing))


def test_a_peer_without_lamina_trailers_is_read_by_its_status() -> None:
    """A gRPC error without Lamina's trailers (a worker lost, a proxy's refusal) maps by its status."""
    assert error_from_trailers("gone", ()) is None
    assert error_from_trailers("gone", ((ERROR_CLASS, "NoSuchError"),)) is None
    assert error_trailers(ServiceUnavailableError("x", code="réservé")) == (
        (ERROR_CLASS, "ServiceUnavailableError"),)  # a value metadata cannot hold is left out


def through_a_gateway(sampling: SamplingParams, request: Request | None = None) -> Request:
    """The request a worker's executor receives for one a gateway sends it (``request``, by default a
    prompt) with ``sampling``."""
    recording = Recording()

    async def scenario(live: Live) -> None:
        remote = RemoteExecutor("w", live.address, connect_timeout_s=5)
        await remote.start()
        try:
            sent = attrs.evolve(request or Request(id="r1", model="recording", prompt="hi"), sampling=sampling)
            assert [c.text async for c in remote.generate(sent)] == ["ok"]
        finally:
            await remote.stop()

    run({"executor": {"use": "recording"}}, scenario, ("recording", recording))
    return recording.requests[-1]


def test_a_choice_forked_at_a_gateway_names_its_parent_at_the_worker() -> None:
    forked = Request(id="r1-2", model="recording", prompt="hi", fork_of="r1")
    assert through_a_gateway(SamplingParams(seed=3), forked).fork_of == "r1"
    assert through_a_gateway(SamplingParams(seed=3)).fork_of is None


def test_sampling_controls_cross_grpc_and_a_gateway_unchanged() -> None:
    """Penalties, logit_bias, min_p and min_tokens parsed from an OpenAI body reach the executor the
    same whether the request came over gRPC directly or through a gateway's remote backend."""
    body = {"model": "recording", "prompt": "hi", "max_tokens": 8, "presence_penalty": 0.5,
            "frequency_penalty": -1, "repetition_penalty": 1.2, "logit_bias": {"5": -100, "9": 3.5},
            "min_p": 0.05, "min_tokens": 2}
    sampling = parse_completion(body, "r0", "t").sampling
    assert (sampling.presence_penalty, sampling.frequency_penalty, sampling.repetition_penalty, sampling.logit_bias,
            sampling.min_p, sampling.min_tokens) == (0.5, -1.0, 1.2, ((5, -100.0), (9, 3.5)), 0.05, 2)
    assert through_a_gateway(sampling).sampling == sampling
    with pytest.raises(InvalidRequestError, match="min_tokens: must be at most max_tokens"):
        parse_completion({**body, "min_tokens": 9}, "r2", "t")
    with pytest.raises(InvalidRequestError, match="logit_bias: keys must be token ids"):
        parse_completion({**body, "logit_bias": {"x": 1}}, "r3", "t")


@pytest.mark.parametrize("field", [
    {"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}}},
    {"response_format": {"type": "json_object"}},
    {"structured_outputs": {"regex": "[a-z]+"}},
    {"guided_choice": ["yes", "no"]},
    {"structured_outputs": {"grammar": 'root ::= "a"'}},
])
def test_structured_output_crosses_grpc_and_a_gateway(field: dict) -> None:
    """The constraint reaches a gateway's worker as it was parsed (named there by its
    ``structured_outputs`` key, whichever field the client used)."""
    sampling = parse_chat({"model": "recording", "messages": [{"role": "user", "content": "hi"}], **field},
                          "r0", "t").sampling
    received = through_a_gateway(sampling).sampling.structured
    assert received == attrs.evolve(sampling.structured, param=f"structured_outputs.{received.kind}")


def test_a_chat_with_tools_reaches_a_gateways_worker_as_text_and_a_grammar() -> None:
    """The gateway reads the calls itself: its worker gets the parser's instructions and the earlier
    calls as text, each tool turn with the call it answers, and a required call as its grammar."""
    plugins = load_plugins()
    parser = Stack(StackConfig.from_dict({"executor": {"use": "echo"}}, plugins.registry), plugins).tool_parser
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    body = {"model": "recording", "tools": [weather], "tool_choice": "required", "messages": [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]}
    request = tool_calls.prepare(parser, parse_chat(body, "r1", "t"))
    received = through_a_gateway(request.sampling, request)
    assert received.sampling.structured == attrs.evolve(request.sampling.structured, param="structured_outputs.grammar")
    assert [(m.role, m.content, m.tool_call_id) for m in received.messages] == [
        ("system", parser.instructions(request.tools), None), ("user", "Weather?", None),
        ("assistant", parser.render(request.messages[1].tool_calls), None), ("tool", "sunny", "c1")]


def test_tool_calls_come_as_typed_fragments() -> None:
    """A chat with tools over gRPC: the echo executor answers with the call its message writes, which
    comes as tool_calls, not text; a history with calls and their results is taken."""
    call = '<tool_call> {"name": "get_weather", "arguments": {"city": "Paris"}} </tool_call>'
    chat = pb.Chat(tools=[pb.Tool(name="get_weather", parameters='{"type": "object"}')], messages=[
        pb.ChatMessage(role="user", content="Weather?"),
        pb.ChatMessage(role="assistant", tool_calls=[pb.ToolCall(id="c1", name="get_weather", arguments="{}")]),
        pb.ChatMessage(role="tool", content="sunny", tool_call_id="c1"), pb.ChatMessage(role="user", content=call)])

    async def scenario(live: Live) -> None:
        chunks = [c async for c in live.stub.Generate(pb.GenerateRequest(model="echo", chat=chat))]
        deltas = [d for c in chunks for d in c.tool_calls]
        assert [(d.index, d.name, json.loads(d.arguments)) for d in deltas] == [(0, "get_weather", {"city": "Paris"})]
        assert deltas[0].id.startswith("call_") and not "".join(c.text for c in chunks).strip()
        assert chunks[-1].finish_reason == "tool_calls"
        (carrying,) = [convert.from_proto(c) for c in chunks if c.tool_calls]
        assert carrying.tool_calls == (ToolCallDelta(index=0, id=deltas[0].id, name="get_weather",
                                                     arguments=deltas[0].arguments),)
        none = pb.Chat(messages=chat.messages, tools=chat.tools, tool_mode="none")
        text = "".join([c.text async for c in live.stub.Generate(pb.GenerateRequest(model="echo", chat=none))])
        assert text == call

    run({"executor": {"use": "echo"}}, scenario)


def test_get_state_reports_the_executors_state() -> None:
    """Through GetState to a gateway's view of the worker, and the worker's counters in its /metrics."""
    async def scenario(live: Live) -> None:
        state = await live.stub.GetState(pb.GetStateRequest())
        assert (state.healthy, state.queue_depth, state.kv_blocks_used, state.kv_blocks_total) == (True, 2, 3, 8)
        assert (state.tokens_per_s, state.preemptions) == (12.5, 4)
        assert (state.draft_tokens, state.accepted_draft_tokens) == (30, 21)
        remote = RemoteExecutor("w", live.address, connect_timeout_s=5)
        await remote.start()
        try:
            seen = remote.state()
        finally:
            await remote.stop()
        assert (seen.kv_blocks_used, seen.preemptions, seen.draft_tokens, seen.accepted_draft_tokens) == (3, 4, 30, 21)
        exported = {s.name: s.value for family in text_string_to_metric_families(Metrics(live.stack).render().decode())
                    for s in family.samples}
        assert exported["lamina_num_preemptions_total"] == 4
        assert exported["lamina_spec_decode_num_draft_tokens_total"] == 30
        assert exported["lamina_spec_decode_num_accepted_tokens_total"] == 21

    run({"executor": {"use": "flaky"}}, scenario, ("flaky", Flaky()))


def test_bearer_keys_in_metadata_authenticate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAMINA_GRPC_KEYS", "acme=sk-grpc-1")

    async def check(live: Live) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            [c async for c in live.stub.Generate(text("hi"))]
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        call = live.stub.Generate(text("hi there"), metadata=(("authorization", "Bearer sk-grpc-1"),))
        assert "".join([c.text async for c in call]) == "hi there"

    run({**ECHO, "admission": [{"use": "api-keys", "keys_env": "LAMINA_GRPC_KEYS"}]}, check)


def test_a_named_codec_streams_its_frames_which_decode_to_the_typed_chunks() -> None:
    async def check(live: Live) -> None:
        typed = [c async for c in live.stub.Generate(text(WORDS, max_tokens=12))]
        request = text(WORDS, max_tokens=12)
        request.codec = "application/x-lamina-stc"
        framed = [c async for c in live.stub.Generate(request)]
        assert all(c.frames and not c.text and not c.token_ids for c in framed)
        decoder = live.stack.codec_for("application/x-lamina-stc").decoder()
        items = [item for c in framed for item in decoder.feed(c.frames)]
        decoder.close()
        chunks = [item for item in items if isinstance(item, TokenChunk)]
        assert [(c.text, list(c.token_ids)) for c in chunks] == [(c.text, list(c.token_ids)) for c in typed]
        assert chunks[-1].finish_reason == typed[-1].finish_reason == "length"
        assert chunks[-1].usage.completion_tokens == typed[-1].usage.completion_tokens == 12
        request.codec = "application/x-nope"
        with pytest.raises(grpc.aio.AioRpcError) as info:
            [c async for c in live.stub.Generate(request)]
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "x-nope" in info.value.details()

    run(ECHO, check)


def test_w3c_trace_metadata_reaches_the_request_context_and_nothing_else() -> None:
    seen: list[dict[str, str]] = []

    class Traces:
        @hookimpl
        def lamina_request_received(self, ctx: Any) -> None:
            seen.append(dict(ctx.trace_context))

    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

    async def check(live: Live) -> None:
        call = live.stub.Generate(text("hi"), metadata=(("traceparent", parent), ("tracestate", "v=1"),
                                                        ("x-other", "no")))
        assert "".join([c.text async for c in call]) == "hi"

    run(ECHO, check, ("traces", Traces()))
    assert seen == [{"traceparent": parent, "tracestate": "v=1"}]
