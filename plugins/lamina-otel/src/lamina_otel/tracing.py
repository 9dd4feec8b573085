"""Request spans from lifecycle hooks.

``lamina_request_wrap`` opens the request's root span (its parent is the client's W3C
``traceparent``, so the sampler follows the caller's decision) and binds ``trace_id`` to the
request's log lines; the observer hooks note when admission and routing ended. The child
spans are created when the request ends, with the phase boundaries as explicit
timestamps: queueing and prefill are split by the executor's ``Usage.queue_s``, so no hook
runs per token and an unsampled request costs one span start and end.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Literal

import attrs
import structlog
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from lamina_hookspecs import hookimpl
from lamina_hookspecs.errors import LaminaError
from lamina_hookspecs.registration import BuildContext
from lamina_hookspecs.types import FinishReason, RequestContext

ATTRIBUTE_KEY = "otel"
"""Where a request's trace state lives in ``RequestContext.attributes``."""


def _ratio(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{attribute.name} must be between 0 and 1; got {value!r}")


@attrs.frozen(kw_only=True)
class TracingOptions:
    """The ``[[observers]]`` options of ``use = "otel"``."""

    exporter: Literal["otlp", "console"] = attrs.field(
        default="otlp", metadata={"help": "otlp (OTLP over HTTP/protobuf) or console (stdout, for local use)"})
    endpoint: str | None = attrs.field(
        default=None, metadata={"help": "OTLP traces URL; default: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or "
                                        "http://localhost:4318/v1/traces"})
    sample_ratio: float = attrs.field(
        default=1.0, validator=_ratio,
        metadata={"help": "share of new traces recorded (0..1); a client's sampled traceparent is always followed"})
    service_name: str = attrs.field(default="lamina", metadata={"help": "the service.name resource attribute"})


def build_tracing(options: TracingOptions, context: BuildContext) -> Tracing:
    """A tracer provider of its own (never the global one) exporting in batches."""
    exporter: SpanExporter = ConsoleSpanExporter() if options.exporter == "console" else _otlp(options.endpoint)
    provider = TracerProvider(
        resource=Resource.create({"service.name": options.service_name, "lamina.stack": context.stack_name}),
        sampler=ParentBased(TraceIdRatioBased(options.sample_ratio)),
    )
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return Tracing(provider)


def _otlp(endpoint: str | None) -> SpanExporter:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=endpoint)


@attrs.define
class _Trace:
    """One request's root span and the monotonic times its phases ended."""

    root: trace.Span
    offset_ns: int  # wall-clock ns minus monotonic ns, to timestamp spans from ctx's monotonic times
    admitted_at: float | None = None
    routed_at: float | None = None
    finish_reason: FinishReason | None = None
    error: LaminaError | None = None

    def ns(self, monotonic_s: float) -> int:
        return int(monotonic_s * 1e9) + self.offset_ns


class Tracing:
    """The ``otel`` observer: its methods are lifecycle hook implementations."""

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer("lamina_otel")
        self.propagator = TraceContextTextMapPropagator()

    def close(self) -> None:
        self.provider.shutdown()  # flushes spans still batched

    @hookimpl
    def lamina_request_wrap(self, ctx: RequestContext) -> AbstractAsyncContextManager[None]:
        return self._request(ctx)

    @asynccontextmanager
    async def _request(self, ctx: RequestContext) -> AsyncIterator[None]:
        offset = time.time_ns() - time.monotonic_ns()
        root = self.tracer.start_span("lamina.request", context=self.propagator.extract(ctx.trace_context),
                                      kind=trace.SpanKind.SERVER, start_time=int(ctx.received_at * 1e9) + offset)
        if not root.is_recording():  # not sampled: nothing to end or export
            yield
            return
        record = ctx.attributes[ATTRIBUTE_KEY] = _Trace(root, offset)
        structlog.contextvars.bind_contextvars(trace_id=format(root.get_span_context().trace_id, "032x"))
        try:
            yield
        finally:
            self._finish(ctx, record)

    @hookimpl
    def lamina_request_admitted(self, ctx: RequestContext) -> None:
        if (record := ctx.attributes.get(ATTRIBUTE_KEY)) is not None:
            record.admitted_at = time.monotonic()

    @hookimpl
    def lamina_request_routed(self, ctx: RequestContext) -> None:
        if (record := ctx.attributes.get(ATTRIBUTE_KEY)) is not None:
            record.routed_at = time.monotonic()

    @hookimpl
    def lamina_request_finished(self, ctx: RequestContext, finish_reason: FinishReason) -> None:
        if (record := ctx.attributes.get(ATTRIBUTE_KEY)) is not None:
            record.finish_reason = finish_reason

    @hookimpl
    def lamina_request_failed(self, ctx: RequestContext, error: LaminaError) -> None:
        if (record := ctx.attributes.get(ATTRIBUTE_KEY)) is not None:
            record.error = error

    def _finish(self, ctx: RequestContext, record: _Trace) -> None:
        end = ctx.finished_at if ctx.finished_at is not None else time.monotonic()
        root = record.root
        root.set_attributes(_attributes(ctx, record))
        if record.error is not None:
            root.set_attribute("error.type", type(record.error).__name__)
            if record.error.http_status >= 500:
                root.set_status(trace.Status(trace.StatusCode.ERROR, record.error.message))
        parent = trace.set_span_in_context(root)
        for name, start, stop in _phases(ctx, record, end):
            child = self.tracer.start_span(name, context=parent, start_time=record.ns(start))
            child.end(end_time=record.ns(stop))
        root.end(end_time=record.ns(end))


def _phases(ctx: RequestContext, record: _Trace, end: float) -> list[tuple[str, float, float]]:
    """(name, start, end) of each phase the request reached, in monotonic seconds."""
    phases = [("admission", ctx.received_at, record.admitted_at or end)]
    if record.admitted_at is None:
        return phases
    phases.append(("routing", record.admitted_at, record.routed_at or end))
    if record.routed_at is None:
        return phases
    queued = min(record.routed_at + (ctx.usage.queue_s if ctx.usage else 0.0), ctx.first_token_at or end)
    phases.append(("queue", record.routed_at, queued))
    phases.append(("prefill", queued, ctx.first_token_at or end))
    if ctx.first_token_at is not None:
        phases.append(("decode", ctx.first_token_at, end))
    return phases


def _attributes(ctx: RequestContext, record: _Trace) -> dict[str, str | int | float | tuple[str, ...]]:
    """Span attributes: Lamina's own under ``lamina.``, token counts after the GenAI conventions."""
    attributes: dict[str, str | int | float | tuple[str, ...]] = {
        "lamina.request_id": ctx.request_id, "lamina.endpoint": ctx.endpoint, "lamina.tenant": ctx.tenant,
        "http.response.status_code": record.error.http_status if record.error else 200,
    }
    attributes.update({f"lamina.arm.{layer}": arm for layer, arm in ctx.arms.items()})
    if ctx.backend is not None:
        attributes["lamina.backend"] = ctx.backend
    if ctx.request is not None:
        attributes["gen_ai.request.model"] = ctx.request.model
    if ctx.usage is not None:
        attributes["gen_ai.usage.input_tokens"] = ctx.usage.prompt_tokens
        attributes["gen_ai.usage.output_tokens"] = ctx.usage.completion_tokens
        attributes["lamina.cached_tokens"] = ctx.usage.cached_tokens
    if record.finish_reason is not None:
        attributes["gen_ai.response.finish_reasons"] = (record.finish_reason,)
    return attributes
