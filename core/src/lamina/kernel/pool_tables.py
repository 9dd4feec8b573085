"""The stack file's pool tables, ``[replicas]`` and ``[canary]``: their schema.

The kernel validates them with the rest of the stack file (``lamina check`` reads every table in
one pass); :mod:`lamina.pool` runs them. ``[[backends]]`` entries hold a component, so their schema
(:class:`~lamina.kernel.stack_config.RemoteBackend`) lives with the stack file's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

WORKER_SECTIONS = ("stack", "executor", "prefix_cache", "batching", "prewarm")
"""What a worker process (``lamina worker``) takes from its gateway's stack: the executor and
what it is built with. Admission, routing, observers and SLOs stay with the gateway."""

CANARY_TABLES = ("executor", "prefix_cache", "batching", "prewarm")
"""The ``[canary]`` tables that replace the stable replicas' own."""


@attrs.frozen(kw_only=True)
class ReplicasConfig:
    """The ``[replicas]`` table: worker processes, each running the stack's executor; local
    child processes unless ``provider = "<name>"`` (or ``{ use = ..., options }``) places them."""

    count: int = attrs.field(default=0, validator=attrs.validators.ge(0), metadata={
        "help": "worker processes (lamina worker) to start and supervise; 0 runs the executor in this process"})
    host: str = attrs.field(default="127.0.0.1", metadata={"help": "address the workers listen on"})
    base_port: int = attrs.field(
        default=0, validator=[attrs.validators.ge(0), attrs.validators.le(65535)],
        metadata={"help": "gRPC port of the first worker, the others follow it; 0 picks free ports"})
    restart_backoff_s: float = attrs.field(default=1.0, validator=attrs.validators.ge(0.0), metadata={
        "help": "wait before restarting a crashed worker, doubled per crash in a row (at most 30 s)"})
    start_timeout_s: float = attrs.field(default=600.0, validator=attrs.validators.gt(0.0), metadata={
        "help": "how long a worker may take to load its model"})
    autoscale_interval_s: float = attrs.field(default=5.0, validator=attrs.validators.gt(0.0), metadata={
        "help": "how often the [autoscaler] decides the replica count"})
    heal_error_rate: float | None = attrs.field(
        default=None, validator=attrs.validators.optional([attrs.validators.gt(0.0), attrs.validators.lt(1.0)]),
        metadata={"help": "restart (rolling, never the last) a replica whose share of faults (5xx but 503 "
                          "refusals for want of capacity) exceeds this; off if unset"})
    heal_window_s: float = attrs.field(default=120.0, validator=attrs.validators.gt(0.0), metadata={
        "help": "the window the share of faults is measured over"})
    heal_min_requests: int = attrs.field(default=20, validator=attrs.validators.ge(1), metadata={
        "help": "requests a replica must have served in the window before it can be judged"})
    fallback_model: str | None = attrs.field(default=None, metadata={
        "help": "while healing, send the pool's requests to this model's backends (a degraded dependency, "
                "e.g. a smaller model); needs heal_error_rate"})
    fallback_probe_share: float = attrs.field(
        default=0.1, validator=[attrs.validators.ge(0.0), attrs.validators.le(1.0)],
        metadata={"help": "share of the pool's requests still sent to it while degraded, to see it recover"})


@attrs.frozen(kw_only=True)
class CanaryConfig:
    """The ``[canary]`` table (its component tables are kept apart in ``tables``)."""

    tables: Mapping[str, Any] = attrs.field(factory=dict)
    share: float = attrs.field(default=0.05, validator=[attrs.validators.gt(0.0), attrs.validators.lt(1.0)],
                               metadata={"help": "share of requests sent to the canary"})
    min_requests: int = attrs.field(default=200, validator=attrs.validators.ge(1),
                                    metadata={"help": "canary requests before it is judged"})
    warmup_requests: int = attrs.field(default=5, validator=attrs.validators.ge(0), metadata={
        "help": "the canary's first requests, not judged (a fresh replica's first calls run cold)"})
    evaluate_after_s: float = attrs.field(default=300.0, validator=attrs.validators.ge(0.0),
                                          metadata={"help": "earliest judgement, seconds after it is ready"})
    max_error_rate_increase: float = attrs.field(default=0.01, validator=attrs.validators.ge(0.0), metadata={
        "help": "largest tolerated canary 5xx share minus the stable replicas'"})
    max_ttft_p95_ratio: float = attrs.field(default=1.2, validator=attrs.validators.gt(0.0), metadata={
        "help": "largest tolerated canary TTFT p95 over the stable replicas'"})
