"""What an upstream engine says about its load, read at an interval for the routers.

| engine | health | running, waiting | KV usage |
|---|---|---|---|
| ``lamina`` | ``/ready`` | ``/metrics``: ``vllm:num_requests_running``, ``vllm:num_requests_waiting`` (Lamina exports vLLM's names) | ``vllm:kv_cache_usage_perc`` |
| ``vllm`` | ``/health`` | the same | the same (``vllm:gpu_cache_usage_perc`` before vLLM 0.10) |
| ``llama-server`` | ``/health`` (503 while loading) | ``/metrics`` (``--metrics``): ``llamacpp:requests_processing``, ``llamacpp:requests_deferred``; without it ``/slots``: slots processing | not reported |
| ``sglang`` | ``/health`` | ``/metrics`` (``--enable-metrics``): ``sglang:num_running_reqs``, ``sglang:num_queue_reqs`` | ``sglang:token_usage`` (its KV pool's tokens in use) |
| ``tgi`` | ``/health`` | ``/metrics``: ``tgi_batch_current_size``, ``tgi_queue_size`` | not reported |
| ``generic`` | ``/v1/models`` | not read (only what is in flight from here) | not reported |
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs
from prometheus_client.parser import text_string_to_metric_families

from lamina_upstream.options import Engine

HEALTH_PATH: dict[Engine, str] = {"lamina": "/ready", "vllm": "/health", "llama-server": "/health",
                                  "sglang": "/health", "tgi": "/health", "generic": "/v1/models"}

_VLLM = {"running": ("vllm:num_requests_running",), "waiting": ("vllm:num_requests_waiting",),
         "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")}
_METRICS: dict[Engine, dict[str, tuple[str, ...]]] = {
    "lamina": _VLLM,
    "vllm": _VLLM,
    "llama-server": {"running": ("llamacpp:requests_processing",), "waiting": ("llamacpp:requests_deferred",)},
    "sglang": {"running": ("sglang:num_running_reqs",), "waiting": ("sglang:num_queue_reqs",),
               "kv_usage": ("sglang:token_usage",)},
    "tgi": {"running": ("tgi_batch_current_size",), "waiting": ("tgi_queue_size",)},
}


@attrs.frozen(kw_only=True)
class UpstreamLoad:
    """Requests the upstream runs and queues (all clients', not only ours), and its KV usage (0..1) if known."""

    running: int = 0
    waiting: int = 0
    kv_usage: float | None = None


def load_from_metrics(text: str, engine: Engine) -> UpstreamLoad:
    """The load in a Prometheus text exposition (each metric summed over its labels, e.g. vLLM's per model)."""
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    found: dict[str, float] = {}
    for field, names in _METRICS[engine].items():
        value = next((totals[n] for n in names if n in totals), None)
        if value is not None:
            found[field] = value
    return UpstreamLoad(running=int(found.get("running", 0)), waiting=int(found.get("waiting", 0)),
                        kv_usage=found.get("kv_usage"))


def load_from_slots(slots: Sequence[Mapping[str, Any]]) -> UpstreamLoad:
    """llama-server's ``/slots``: a slot ``is_processing`` runs one request; its queue is not shown."""
    return UpstreamLoad(running=sum(1 for slot in slots if slot.get("is_processing")))
