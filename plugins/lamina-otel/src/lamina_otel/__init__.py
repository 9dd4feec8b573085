"""Lamina OpenTelemetry tracing, written as a lifecycle plugin (no edits to core's pipeline).

A stack switches it on with an ``[[observers]]`` entry::

    [[observers]]
    use = "otel"
    exporter = "otlp"            # or "console" for local use
    endpoint = "http://collector:4318/v1/traces"
    sample_ratio = 0.01

Each request becomes one ``lamina.request`` span (continuing the client's W3C
``traceparent``) with child spans ``admission``, ``routing``, ``queue``, ``prefill`` and
``decode``, and the request's tenant, backend, A/B arms, model and token counts as
attributes. Registered through the ``lamina`` entry point ``otel``.
"""

from __future__ import annotations

from lamina_hookspecs import hookimpl
from lamina_hookspecs.registration import Register
from lamina_otel.tracing import Tracing, TracingOptions, build_tracing

__all__ = ["Tracing", "TracingOptions"]


@hookimpl
def lamina_register_observers(register: Register) -> None:
    register("otel", build_tracing, options=TracingOptions)
