"""The request lifecycle over a built stack (echo executor, no transport)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest
from lamina.kernel.pipeline import run_request
from lamina_hookspecs import hookimpl
from lamina_hookspecs.errors import (InvalidRequestError, LaminaError, NotFoundError, RateLimitError,
                                     ServiceUnavailableError)
from lamina_hookspecs.types import (BackendState, ModelInfo, RateDecision, Request, RequestContext, SamplingParams,
                                    TokenChunk)


def parse(body: Mapping[str, Any]) -> Request:
    if "prompt" not in body:
        raise InvalidRequestError("prompt is required", param="prompt")
    return Request(id="req", model=body.get("model", "echo"), prompt=body["prompt"],
                   sampling=SamplingParams(max_tokens=body.get("max_tokens", 16)))


async def collect(stack: Any, body: Mapping[str, Any], ctx: RequestContext | None = None,
                  limit: int | None = None) -> tuple[RequestContext, list[TokenChunk]]:
    ctx = ctx or RequestContext(request_id="req", endpoint="completions")
    chunks: list[TokenChunk] = []
    stream = run_request(stack, ctx, body, parse)
    try:
        async for chunk in stream:
            chunks.append(chunk)
            if limit and len(chunks) >= limit:
                break
    finally:
        await stream.aclose()
    return ctx, chunks


def run(stack: Any, body: Mapping[str, Any], **kw: Any) -> tuple[RequestContext, list[TokenChunk]]:
    async def go() -> tuple[RequestContext, list[TokenChunk]]:
        await stack.start()
        try:
            return await collect(stack, body, **kw)
        finally:
            await stack.stop()

    return asyncio.run(go())


def test_hooks_fire_in_order(build_stack: Any, hook_recorder: Any) -> None:
    recorder, plugin = hook_recorder
    stack = build_stack(("rec", plugin))
    ctx, chunks = run(stack, {"prompt": "a b c"})
    assert "".join(c.text for c in chunks) == "a b c"
    assert recorder.names() == [
        "lamina_stack_started", "lamina_request_received", "lamina_request_admitted", "lamina_request_routed",
        "lamina_request_first_token", "lamina_request_finished", "lamina_stack_stopping",
    ]
    assert recorder.calls[-2][1]["finish_reason"] == "stop"
    assert ctx.backend == "local" and ctx.usage.completion_tokens == 3 and ctx.ttft_s is not None


class Raising:
    @hookimpl
    def lamina_request_received(self, ctx: RequestContext) -> None:
        raise RuntimeError("observer bug")

    @hookimpl
    async def lamina_request_finished(self, ctx: RequestContext, finish_reason: str) -> None:
        raise RuntimeError("async observer bug")

    @hookimpl
    def lamina_request_wrap(self, ctx: RequestContext) -> Any:
        @contextlib.asynccontextmanager
        async def broken() -> AsyncIterator[None]:
            raise RuntimeError("wrapper bug")
            yield

        return broken()


def test_a_raising_observer_is_logged_and_does_not_fail_the_request(
        build_stack: Any, hook_recorder: Any, lamina_logs: list[dict[str, Any]]) -> None:
    recorder, plugin = hook_recorder
    stack = build_stack(("raising", Raising()), ("rec", plugin))
    _, chunks = run(stack, {"prompt": "x y"})
    assert chunks[-1].finish_reason == "stop"
    assert "lamina_request_finished" in recorder.names(), "other observers still run"
    failures = {(e["event"], e["plugin"]) for e in lamina_logs if "failed" in e["event"] and "plugin" in e}
    assert ("observer_failed", "raising") in failures and ("request_wrapper_failed", "raising") in failures


class Timing:
    """Wraps the admission and routing phases with ``wrapper=True`` and the request with a context manager."""

    def __init__(self) -> None:
        self.events: list[str] = []

    @hookimpl(wrapper=True)
    def lamina_admit(self, ctx: RequestContext, body: Mapping[str, Any]) -> Any:
        self.events.append("admit:before")
        result = yield
        self.events.append("admit:after")
        return result

    @hookimpl(wrapper=True)
    def lamina_route(self, ctx: RequestContext, request: Request, backends: Any) -> Any:
        backend = yield
        self.events.append(f"route:{backend.name}")
        return backend

    @hookimpl
    def lamina_request_wrap(self, ctx: RequestContext) -> Any:
        @contextlib.asynccontextmanager
        async def span() -> AsyncIterator[None]:
            self.events.append("span:enter")
            try:
                yield
            finally:
                self.events.append("span:exit")

        return span()


def test_wrappers_time_admission_routing_and_the_whole_request(build_stack: Any) -> None:
    timing = Timing()
    run(build_stack(("timing", timing)), {"prompt": "x"})
    assert timing.events == ["span:enter", "admit:before", "admit:after", "route:local", "span:exit"]


class DenyAll:
    @hookimpl
    def lamina_register_rate_limiters(self, register: Any) -> None:
        class Deny:
            key_by, unit = "tenant", "requests"

            def acquire(self, key: str, now: float, cost: float = 1.0) -> RateDecision:
                return RateDecision(allowed=False, retry_after_s=2.5)

        register("deny-all", lambda options, context: Deny())


@pytest.mark.parametrize(("body", "overrides", "error"), [
    ({"prompt": "x"}, {"admission": [{"use": "deny-all"}]}, RateLimitError),
    ({"max_tokens": 3}, {}, InvalidRequestError),
    ({"prompt": "x", "model": "gpt-9"}, {}, NotFoundError),
])
def test_rejections_fire_failed_and_raise_the_error(build_stack: Any, hook_recorder: Any, body: dict[str, Any],
                                                   overrides: dict[str, Any], error: type[LaminaError]) -> None:
    recorder, plugin = hook_recorder
    stack = build_stack(("deny", DenyAll()), ("rec", plugin), overrides=overrides)
    with pytest.raises(error) as info:
        run(stack, body)
    assert recorder.names()[-2] == "lamina_request_failed"
    assert recorder.calls[-2][1]["error"] is info.value
    assert "lamina_request_routed" not in recorder.names()
    if error is RateLimitError:
        assert info.value.retry_after == 2.5 and info.value.to_openai()["error"]["type"] == "rate_limit_error"


def test_closing_the_stream_early_aborts_and_frees_the_executor(build_stack: Any, hook_recorder: Any) -> None:
    recorder, plugin = hook_recorder
    stack = build_stack(("rec", plugin))
    _, chunks = run(stack, {"prompt": "a b c d e f", "max_tokens": 6}, limit=2)
    assert len(chunks) == 2
    assert recorder.calls[-2] == ("lamina_request_finished", {"ctx": recorder.calls[-2][1]["ctx"],
                                                              "finish_reason": "abort"})
    assert stack.backends["local"].state().outstanding_requests == 0


def test_ab_split_assigns_arms_stickily_by_tenant(build_stack: Any) -> None:
    stack = build_stack(overrides={"router": None, "ab": {"router": {"sticky_by": "tenant", "arms": [
        {"name": "control", "use": "round-robin", "weight": 1},
        {"name": "treatment", "use": "shortest-queue", "weight": 1}]}}})
    arms = set()
    for tenant in ("t1", "t2", "t3", "t4", "t5", "t6", "t1"):
        ctx, _ = run(stack, {"prompt": "x"}, ctx=RequestContext(request_id=tenant, endpoint="c", tenant=tenant))
        arms.add((tenant, ctx.arms["router"]))
    assert len({t for t, _ in arms}) == 6, "the same tenant always gets the same arm"
    assert {a for _, a in arms} == {"control", "treatment"}


class Refusing:
    """An executor that refuses every request at arrival with a 503 of ``code``, counting the tries."""

    model = ModelInfo(id="echo", context_length=64)

    def __init__(self, code: str) -> None:
        self.code, self.tries = code, 0

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def state(self) -> BackendState:
        return BackendState(name="refusing", model="echo")

    async def generate(self, request: Request) -> AsyncIterator[TokenChunk]:
        self.tries += 1
        raise ServiceUnavailableError(f"no room ({self.code})", code=self.code, retry_after=2)
        yield  # an async generator, as executors are

    @hookimpl
    def lamina_register_executors(self, register: Any) -> None:
        register("refusing", lambda options, context: self)


@pytest.mark.parametrize(("code", "elsewhere"), [("queue_full", True), ("overloaded", True), ("draining", True),
                                                 ("queue_timeout", False)])
def test_a_refusal_at_arrival_is_routed_again_where_another_backend_may_have_room(
        build_stack: Any, code: str, elsewhere: bool) -> None:
    """A backend out of room or shutting down leaves the request to another one, as a lost backend
    does; a request that already waited out its bound is not sent to wait again."""
    refusing = Refusing(code)
    stack = build_stack(("refusing", refusing), overrides={"executor": None, "backends": [
        {"name": "busy", "executor": {"use": "refusing"}}, {"name": "free", "executor": {"use": "echo"}}]})
    outcomes = []
    for _ in range(4):
        try:
            ctx, chunks = run(stack, {"prompt": "a b"})
            outcomes.append((ctx.backend, "".join(c.text for c in chunks)))
        except ServiceUnavailableError as error:
            outcomes.append(("busy", error.code))
    assert refusing.tries >= 1, "the router sent some to the busy backend first"
    refused = [outcome for outcome in outcomes if outcome[0] == "busy"]
    assert refused == ([] if elsewhere else [("busy", code)] * refusing.tries)
    assert outcomes.count(("free", "a b")) == 4 - len(refused)


def test_when_every_backend_refuses_the_last_refusal_is_the_answer(build_stack: Any) -> None:
    stack = build_stack(("refusing", Refusing("overloaded")), overrides={"executor": None, "backends": [
        {"name": "one", "executor": {"use": "refusing"}}, {"name": "two", "executor": {"use": "refusing"}}]})
    with pytest.raises(ServiceUnavailableError) as caught:
        run(stack, {"prompt": "a b"})
    assert (type(caught.value), caught.value.code, caught.value.retry_after) == (ServiceUnavailableError, "overloaded", 2)
