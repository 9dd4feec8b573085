"""The otel observer over a built echo stack: span tree, attributes, traceparent, sampling."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

import attrs
import pytest
import structlog
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from lamina.kernel.pipeline import run_request
from lamina.kernel.plugins import load_plugins
from lamina.kernel.stack import Stack
from lamina.kernel.stack_config import StackConfig
from lamina.testing.contracts import ObserverContract
from lamina_hookspecs import hookimpl
from lamina_hookspecs.errors import ConfigError, InvalidRequestError, LaminaError
from lamina_hookspecs.registration import Register
from lamina_hookspecs.types import Request, RequestContext, SamplingParams, TokenChunk

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


def parse(body: Mapping[str, Any]) -> Request:
    if "prompt" not in body:
        raise InvalidRequestError("prompt is required", param="prompt")
    return Request(id="req", model="echo", prompt=body["prompt"], sampling=SamplingParams(max_tokens=16))


def build(observer: Mapping[str, Any], **sections: Any) -> tuple[Stack, InMemorySpanExporter]:
    plugins = load_plugins(extra=tuple(sections.pop("extra", ())))
    config = StackConfig.from_dict({"executor": {"use": "echo", "token_delay_s": 0.002},
                                    "observers": [{"use": "otel", "exporter": "console", **observer}], **sections},
                                   plugins.registry)
    stack = Stack(config, plugins)
    ((_, tracing),) = stack.observers
    exported = InMemorySpanExporter()
    tracing.provider.add_span_processor(SimpleSpanProcessor(exported))
    return stack, exported


def serve(stack: Stack, *requests: tuple[RequestContext, Mapping[str, Any]]) -> list[list[TokenChunk] | LaminaError]:
    async def one(ctx: RequestContext, body: Mapping[str, Any]) -> list[TokenChunk] | LaminaError:
        try:
            return [chunk async for chunk in run_request(stack, ctx, body, parse)]
        except LaminaError as error:
            return error

    async def go() -> list[list[TokenChunk] | LaminaError]:
        await stack.start()
        try:
            return [await one(ctx, body) for ctx, body in requests]
        finally:
            await stack.stop()

    return asyncio.run(go())


def by_name(spans: tuple[ReadableSpan, ...]) -> dict[str, ReadableSpan]:
    return {span.name: span for span in spans}


def test_one_root_span_with_phase_children_continuing_the_callers_trace() -> None:
    stack, exported = build({})
    ctx = RequestContext(request_id="r1", endpoint="completion", tenant="acme", trace_context={"traceparent": PARENT})
    (chunks,) = serve(stack, (ctx, {"prompt": "a b c"}))
    assert not isinstance(chunks, LaminaError) and chunks[-1].finish_reason == "stop"
    spans = by_name(exported.get_finished_spans())
    assert set(spans) == {"lamina.request", "admission", "routing", "queue", "prefill", "decode"}
    root = spans["lamina.request"]
    assert format(root.context.trace_id, "032x") == TRACE_ID, "the client's traceparent is the parent"
    assert root.parent is not None and format(root.parent.span_id, "016x") == "00f067aa0ba902b7"
    assert root.kind is SpanKind.SERVER
    assert root.attributes["lamina.tenant"] == "acme" and root.attributes["lamina.backend"] == "local"
    assert root.attributes["gen_ai.usage.output_tokens"] == 3 and root.attributes["gen_ai.request.model"] == "echo"
    assert root.attributes["gen_ai.response.finish_reasons"] == ("stop",)
    assert root.attributes["http.response.status_code"] == 200
    assert root.resource.attributes["service.name"] == "lamina"
    for name in ("admission", "routing", "queue", "prefill", "decode"):
        child = spans[name]
        assert child.parent is not None and child.parent.span_id == root.context.span_id
        assert root.start_time <= child.start_time <= child.end_time <= root.end_time, name
    order = [spans[n] for n in ("admission", "routing", "queue", "prefill", "decode")]
    assert all(a.end_time <= b.start_time for a, b in zip(order, order[1:])), "phases follow one another"
    # three 2 ms token pauses: decode holds the two after the first token
    assert spans["decode"].end_time - spans["decode"].start_time >= 3_000_000


def test_queue_time_reported_by_the_executor_splits_queue_from_prefill() -> None:
    stack, exported = build({})
    executor = stack.backends["local"]
    generate = executor.generate

    async def queued(request: Request) -> AsyncIterator[TokenChunk]:
        await asyncio.sleep(0.05)  # waiting for a batch slot, as the executor then reports
        async for chunk in generate(request):
            if chunk.usage is not None:
                chunk = attrs.evolve(chunk, usage=attrs.evolve(chunk.usage, queue_s=0.05))
            yield chunk

    executor.generate = queued  # type: ignore[method-assign]
    serve(stack, (RequestContext(request_id="r2", endpoint="completion"), {"prompt": "a b"}))
    spans = by_name(exported.get_finished_spans())
    assert spans["queue"].end_time - spans["queue"].start_time >= 49_000_000
    assert spans["prefill"].start_time == spans["queue"].end_time
    assert spans["prefill"].end_time <= spans["decode"].start_time


def test_a_rejected_request_has_a_failed_admission_and_no_later_phases() -> None:
    stack, exported = build({})
    (error,) = serve(stack, (RequestContext(request_id="r3", endpoint="completion"), {"no": "prompt"}))
    assert isinstance(error, InvalidRequestError)
    spans = by_name(exported.get_finished_spans())
    assert set(spans) == {"lamina.request", "admission"}
    root = spans["lamina.request"]
    assert root.attributes["error.type"] == "InvalidRequestError"
    assert root.attributes["http.response.status_code"] == 400
    assert root.status.status_code is StatusCode.UNSET, "a client error is not a server span error"


def test_sampling_ratio_and_trace_id_on_log_lines() -> None:
    stack, exported = build({"sample_ratio": 0.0})
    with structlog.testing.capture_logs(processors=[structlog.contextvars.merge_contextvars]) as logs:
        serve(stack,
              (RequestContext(request_id="sampled", endpoint="completion", trace_context={"traceparent": PARENT}),
               {"prompt": "a"}),
              (RequestContext(request_id="unsampled", endpoint="completion"), {"prompt": "a"}))
    roots = [s for s in exported.get_finished_spans() if s.name == "lamina.request"]
    assert [s.attributes["lamina.request_id"] for s in roots] == ["sampled"], \
        "ratio 0 records no new trace, but a caller's sampled trace is followed"
    finished = {e["request_id"]: e for e in logs if e["event"] == "request_finished"}
    assert finished["sampled"]["trace_id"] == TRACE_ID and "trace_id" not in finished["unsampled"]


@pytest.mark.parametrize(("option", "path"), [({"sample_ratio": 2.0}, "observers[0].sample_ratio"),
                                               ({"exporter": "zipkin"}, "observers[0].exporter")])
def test_bad_options_name_the_key(option: dict[str, Any], path: str) -> None:
    with pytest.raises(ConfigError) as info:
        build(option)
    assert info.value.path == path


def test_registers_as_an_observer() -> None:
    seen: list[str] = []

    class Names:
        @hookimpl
        def lamina_register_observers(self, register: Register) -> None:
            seen.append("called")

    plugins = load_plugins(extra=(("names", Names()),))
    assert "otel" in [c.name for c in plugins.registry if c.layer.key == "observer"] and seen


class TestOtelObserverContract(ObserverContract):
    registered_name = "otel"
    options = {"exporter": "console"}
