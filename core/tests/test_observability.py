"""Observability through a live server: configured observers, SLO burn rates, per-backend
gauges, arm labels, and request fields on every log line."""

from __future__ import annotations

from typing import Any

import attrs
import httpx
import openai
from lamina_hookspecs import hookimpl
from lamina_hookspecs.registration import Register
from lamina_hookspecs.types import FinishReason, RequestContext

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
CHAT = {"model": "echo", "messages": [{"role": "user", "content": "a b c"}]}


@attrs.frozen
class RecorderOptions:
    label: str = "unset"


class Recorder:
    """An observer built from a stack-file ``[[observers]]`` entry."""

    instances: list[Recorder] = []

    def __init__(self, label: str) -> None:
        self.label, self.seen, self.closed = label, [], False
        Recorder.instances.append(self)

    @hookimpl
    def lamina_request_finished(self, ctx: RequestContext, finish_reason: FinishReason) -> None:
        self.seen.append((dict(ctx.trace_context), ctx.backend, ctx.usage))

    def close(self) -> None:
        self.closed = True


class RecorderPlugin:
    @hookimpl
    def lamina_register_observers(self, register: Register) -> None:
        register("recorder", lambda options, context: Recorder(options.label), options=RecorderOptions)


def test_observer_is_configured_by_the_stack_file_and_sees_only_trace_headers(live: Any) -> None:
    Recorder.instances.clear()
    server = live({"executor": {"use": "echo"}, "observers": [{"use": "recorder", "label": "audit"}]},
                  ("recorder-plugin", RecorderPlugin()))
    reply = httpx.post(f"{server.url}/v1/chat/completions", json=CHAT,
                       headers={"traceparent": TRACEPARENT, "authorization": "Bearer sk-x", "x-other": "1"})
    assert reply.status_code == 200
    (recorder,) = Recorder.instances
    assert recorder.label == "audit"
    (trace, backend, usage), = recorder.seen
    assert trace == {"traceparent": TRACEPARENT}, "only W3C trace headers reach observers"
    assert backend == "local" and usage.completion_tokens == 3 and usage.queue_s == 0.0
    server.__exit__()
    assert recorder.closed, "the observer is closed when the stack stops"


def test_slo_burn_rates_and_backend_gauges_are_exported(live: Any) -> None:
    # every TTFT misses a 1 ns objective: burn rate = 100% bad / 5% budget = 20
    server = live({"executor": {"use": "echo"}, "slo": {"ttft_p95_s": 1e-9, "error_rate": 0.01}})
    for _ in range(3):
        assert httpx.post(f"{server.url}/v1/chat/completions", json=CHAT).status_code == 200
    bad = httpx.post(f"{server.url}/v1/chat/completions", json={**CHAT, "model": "nope"})
    assert bad.status_code == 404  # a client error: it does not burn the error budget
    metrics = httpx.get(f"{server.url}/metrics").text
    for line in ('lamina_slo_events_total{slo="ttft_p95"} 3.0', 'lamina_slo_bad_events_total{slo="ttft_p95"} 3.0',
                 'lamina_slo_burn_rate{slo="ttft_p95",window="5m"} 20.0',
                 'lamina_slo_burn_rate{slo="ttft_p95",window="1h"} 20.0',
                 'lamina_slo_events_total{slo="error_rate"} 4.0', 'lamina_slo_bad_events_total{slo="error_rate"} 0.0',
                 'lamina_slo_burn_rate{slo="error_rate",window="5m"} 0.0',
                 'lamina_slo_threshold{slo="error_rate"} 0.01',
                 'lamina_backend_up{backend="local"} 1.0', 'lamina_backend_circuit_open{backend="local"} 0.0',
                 'lamina_time_to_first_token_seconds_count{arm=""} 3.0',
                 'lamina_request_queue_time_seconds_count{arm=""} 3.0'):
        assert line in metrics, line
    assert 'slo="itl_p95"' not in metrics, "an objective left out is not tracked"


def test_arm_label_and_log_fields(live: Any, lamina_logs: list[dict[str, Any]]) -> None:
    server = live({"executor": {"use": "echo"}, "ab": {"router": {"sticky_by": "request", "arms": [
        {"name": "control", "use": "round-robin"}, {"name": "treatment", "use": "round-robin"}]}}})
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="sk-not-logged", max_retries=0) as client:
        for _ in range(6):
            stream = client.chat.completions.create(model="echo", messages=CHAT["messages"], stream=True)
            assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "a b c"
    metrics = httpx.get(f"{server.url}/metrics").text
    arms = {line.split('arm="')[1].split('"')[0] for line in metrics.splitlines()
            if line.startswith("lamina_e2e_request_latency_seconds_count")}
    assert arms <= {"router=control", "router=treatment"} and arms, arms
    assert 'lamina_inter_token_latency_seconds_count{arm="router=' in metrics
    finished = [e for e in lamina_logs if e["event"] == "request_finished"]
    assert len(finished) == 6
    for entry in finished:
        assert entry["request_id"].startswith("chatcmpl-") and entry["tenant"] == "default"
        assert entry["backend"] == "local" and entry["arm"].startswith("router=")
    assert not any("sk-not-logged" in repr(entry) for entry in lamina_logs)


def test_failed_request_logs_error_class_not_body(live: Any, lamina_logs: list[dict[str, Any]]) -> None:
    server = live({"executor": {"use": "echo"}})
    secret_prompt = "my secret prompt text"
    reply = httpx.post(f"{server.url}/v1/chat/completions",
                       json={"model": "echo", "messages": [{"role": "user", "content": secret_prompt}],
                             "temperature": 9})
    assert reply.status_code == 400
    (failed,) = [e for e in lamina_logs if e["event"] == "request_failed"]
    assert failed["error_type"] == "InvalidRequestError" and "temperature" in failed["error"]
    assert failed["request_id"] == reply.headers["x-request-id"] and failed["status"] == 400
    assert not any(secret_prompt in repr(entry) for entry in lamina_logs)


