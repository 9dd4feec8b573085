"""Prometheus metrics, as a lifecycle plugin plus a live collector.

Names follow vLLM's under a ``lamina_`` prefix (``lamina_time_to_first_token_seconds``,
``lamina_num_requests_waiting``, ...). The three gauges that Kubernetes inference gateways
(the Gateway API Inference Extension's model-server protocol) and KEDA read are also
exported under vLLM's own names — ``vllm:num_requests_waiting``,
``vllm:num_requests_running``, ``vllm:kv_cache_usage_perc`` (and the older
``vllm:gpu_cache_usage_perc``) — so those tools route and scale Lamina with no glue.
When the stack has a prefix cache, its ``stats()`` are exported at scrape time too
(``lamina_prefix_cache_queries_total``, ``lamina_prefix_cache_hits_total``, ... — vLLM's
``prefix_cache_queries``/``prefix_cache_hits`` count tokens, and so do these).
Each backend also gets ``lamina_backend_*{backend=...}`` series (health, load, KV usage,
generation rate, circuit state) for ``lamina status`` and dashboards.

Request metrics carry an ``arm`` label: the request's A/B assignments
(``"router=treatment"``, see :func:`lamina.kernel.ab.arm_label`), ``""`` outside any split, so one
query compares arms. When the stack file declares ``[slo]`` objectives, their counters and
burn rates are exported too (:mod:`lamina.kernel.slo`).

Each server gets its own registry; nothing is global.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import prometheus_client
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from lamina_hookspecs import hookimpl
from lamina_hookspecs.errors import LaminaError
from lamina_hookspecs.types import BackendState, FinishReason, RequestContext
from lamina.kernel import metric_names as m
from lamina.kernel.ab import arm_label
from lamina.kernel.slo import SloTracker
from lamina.kernel.stack import ROUTE_TREE_KEY, Stack

LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                   40.0, 80.0)
ABORTING_CODES = frozenset({"queue_timeout"})
"""Error codes of requests that were accepted and then given up on, counted as aborts by that reason."""


class _BackendGauges(Collector):
    """Reads the backends' live state at scrape time."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack

    def collect(self) -> Iterator[GaugeMetricFamily]:
        named = {name: executor.state() for name, executor in self.stack.backends.items()}
        states = list(named.values())
        waiting = sum(s.queue_depth for s in states)
        running = sum(max(s.outstanding_requests - s.queue_depth, 0) for s in states)
        used, total = sum(s.kv_blocks_used for s in states), sum(s.kv_blocks_total for s in states)
        usage = used / total if total else 0.0
        for names, help_, value in (
                ((m.NUM_REQUESTS_WAITING, "vllm:num_requests_waiting"), "Requests waiting to be scheduled.", waiting),
                ((m.NUM_REQUESTS_RUNNING, "vllm:num_requests_running"), "Requests being computed.", running),
                ((m.KV_CACHE_USAGE, "vllm:kv_cache_usage_perc"), "KV-cache usage; 1 means 100%.", usage)):
            for name in names:
                yield GaugeMetricFamily(name, help_, value=value)
        yield GaugeMetricFamily("vllm:gpu_cache_usage_perc", "KV-cache usage (older vLLM name).", value=usage)
        yield GaugeMetricFamily(m.KV_CACHE_BLOCKS_USED, "KV-cache blocks in use.", value=used)
        yield GaugeMetricFamily(m.KV_CACHE_BLOCKS_TOTAL, "KV-cache blocks in all.", value=total)
        yield CounterMetricFamily(m.PREEMPTIONS, "Running requests preempted for KV memory (recomputed "
                                  "later), since the backends started.", value=sum(s.preemptions for s in states))
        yield CounterMetricFamily(m.SPEC_DECODE_DRAFT_TOKENS, "Tokens drafted by speculative decoding, since the "
                                  "backends started.", value=sum(s.draft_tokens for s in states))
        yield CounterMetricFamily(m.SPEC_DECODE_ACCEPTED_TOKENS, "Drafted tokens the model agreed with (each one a "
                                  "decode step saved), since the backends started.",
                                  value=sum(s.accepted_draft_tokens for s in states))
        yield from self._per_backend(named)

    def _per_backend(self, named: dict[str, BackendState]) -> Iterator[GaugeMetricFamily]:
        now = time.monotonic()
        series = (
            (m.BACKEND_UP, "1 when the backend is healthy and not draining.",
             lambda name, s: float(s.healthy and not s.draining)),
            (m.BACKEND_CIRCUIT_OPEN, "1 while a breaker keeps new work away from the backend.",
             lambda name, s: float(self.stack.admission.retry_after(name, now) is not None)),
            (m.BACKEND_OUTSTANDING, "Requests the backend holds (queued or running).",
             lambda name, s: s.outstanding_requests),
            (m.BACKEND_QUEUE_DEPTH, "Requests waiting in the backend's queue.", lambda name, s: s.queue_depth),
            (m.BACKEND_KV_USAGE, "Backend KV-cache usage; 1 means 100%.", lambda name, s: s.kv_usage),
            (m.BACKEND_TOKENS_PER_S, "Backend's recent generation rate.",
             lambda name, s: s.tokens_per_s),
        )
        for metric, help_, value in series:
            family = GaugeMetricFamily(metric, help_, labels=["backend"])
            for name, state in named.items():
                family.add_metric([name], value(name, state))
            yield family


# (metric name without ``_total``, stats() key, help): counters, cumulative since start
_PREFIX_COUNTERS = (
    ("lamina_prefix_cache_queries", "lookup_tokens", "Prompt tokens looked up in the prefix cache."),
    ("lamina_prefix_cache_hits", "hit_tokens", "Prompt tokens served from the prefix cache."),
    ("lamina_prefix_cache_hit_requests", "hit_requests", "Prefix-cache lookups that hit at least one block."),
    ("lamina_prefix_cache_lookups", "lookups", "Prefix-cache lookups (one per request's prefill, plus pre-warm checks)."),
    ("lamina_prefix_cache_inserted_blocks", "inserted_blocks", "KV blocks stored in the prefix cache."),
    ("lamina_prefix_cache_evicted_blocks", "evicted_blocks", "KV blocks evicted from the prefix cache."),
)
# gauges: live values
_PREFIX_GAUGES = (
    ("lamina_prefix_cache_blocks", "cached_blocks", "KV blocks held by the prefix cache."),
    ("lamina_prefix_cache_pinned_blocks", "pinned_blocks", "Prefix-cache blocks pinned by running requests or the pre-warm policy."),
    ("lamina_prefix_cache_hit_rate", "hit_rate", "Hit tokens over looked-up tokens since start (0 to 1)."),
)


class _PrefixCacheStats(Collector):
    """Reads the stack's prefix cache(s) at scrape time; yields nothing when there is none.

    Under an A/B split of the prefix-cache layer each arm's cache is a series with an
    ``arm`` label; otherwise the metrics carry no label.
    """

    def __init__(self, stack: Stack) -> None:
        self.stack = stack

    def collect(self) -> Iterator[Metric]:
        instances = self.stack.prefix_cache.instances
        if not instances:
            return
        labels = [] if set(instances) == {""} else ["arm"]
        stats = {arm: cache.stats() for arm, cache in instances.items()}
        for name, key, help_ in _PREFIX_COUNTERS:
            counter = CounterMetricFamily(name, help_, labels=labels)
            for arm, values in stats.items():
                counter.add_metric([arm] if labels else [], float(values.get(key, 0.0)))
            yield counter
        for name, key, help_ in _PREFIX_GAUGES:
            gauge = GaugeMetricFamily(name, help_, labels=labels)
            for arm, values in stats.items():
                gauge.add_metric([arm] if labels else [], float(values.get(key, 0.0)))
            yield gauge


class _PoolStats(Collector):
    """The worker pool (``[replicas]``) at scrape time: replicas by state, the autoscaler's
    target, the latest cold start, and every action the provider took, by reason."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack

    def collect(self) -> Iterator[Metric]:
        status = self.stack.pool.status() if self.stack.pool is not None else None
        if status is None:
            return
        states = GaugeMetricFamily(m.REPLICAS, "Worker replicas by state.", labels=["state"])
        for state, count in (("serving", status.serving), ("starting", status.starting),
                             ("draining", status.draining)):
            states.add_metric([state], count)
        yield states
        if status.target is not None:
            yield GaugeMetricFamily(m.AUTOSCALER_TARGET, "Replicas the autoscaler last asked for "
                                    "(serving plus warm).", value=status.target)
        if status.cold_start_s is not None:
            yield GaugeMetricFamily(m.REPLICA_COLD_START, "The latest replica's spawn-to-ready time.",
                                    value=status.cold_start_s)
        actions = CounterMetricFamily(m.REPLICA_ACTIONS, "Replica actions (spawn, drain, restart) by reason.",
                                      labels=["action", "reason"])
        for (action, reason), count in sorted(status.actions.items()):
            actions.add_metric([action, reason], count)
        yield actions


class Metrics:
    """The server's metrics; registered on the stack's plugin manager as an observer."""

    def __init__(self, stack: Stack) -> None:
        self.registry = prometheus_client.CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = prometheus_client.Counter(
            m.REQUESTS, "Requests by endpoint, HTTP status, tenant and A/B arm.",
            ["endpoint", "status", "tenant", "arm"], registry=r)
        self.success = prometheus_client.Counter(
            m.REQUEST_SUCCESS, "Finished requests by finish reason.", ["finished_reason"], registry=r)
        self.ttft = prometheus_client.Histogram(
            m.TTFT, "Time to first token.", ["arm"], buckets=LATENCY_BUCKETS,
            registry=r)
        self.itl = prometheus_client.Histogram(
            m.ITL, "Time between streamed chunks.", ["arm"], buckets=LATENCY_BUCKETS,
            registry=r)
        self.e2e = prometheus_client.Histogram(
            m.E2E, "End-to-end request latency.", ["arm"], buckets=LATENCY_BUCKETS,
            registry=r)
        self.queue_time = prometheus_client.Histogram(
            m.QUEUE_TIME, "Time a finished request waited in its executor before its "
            "prefill started (0 from executors that do not queue).", ["arm"], buckets=LATENCY_BUCKETS, registry=r)
        self.aborts = prometheus_client.Counter(
            m.REQUEST_ABORTS, "Requests aborted before they finished, by reason (client_gone; queue_timeout: "
            "waited longer than max_queue_wait_s to start; shutdown: still running when the drain ran out; "
            "slow_client: its stream fell server.stream_buffer_bytes behind).",
            ["reason"], registry=r)
        self.prompt_tokens = prometheus_client.Counter(
            m.PROMPT_TOKENS, "Prompt tokens processed, by tenant and A/B arm.", ["tenant", "arm"], registry=r)
        self.generation_tokens = prometheus_client.Counter(
            m.GENERATION_TOKENS, "Tokens generated, by tenant and A/B arm.", ["tenant", "arm"], registry=r)
        r.register(_BackendGauges(stack))
        self.route_tree = prometheus_client.Counter(
            m.ROUTE_TREE_REQUESTS, "Requests by the routing-tree leaf they reached.", ["leaf"], registry=r)
        r.register(_PrefixCacheStats(stack))
        r.register(_PoolStats(stack))
        self.slo = SloTracker(stack.config.slo, time.monotonic)
        r.register(self.slo)

    def render(self) -> bytes:
        return prometheus_client.generate_latest(self.registry)

    def rejected(self, endpoint: str, http_status: int, tenant: str) -> None:
        """Count a request the transport refused before it reached the pipeline."""
        self.requests.labels(endpoint, str(http_status), tenant, "").inc()
        self.slo.outcome(http_status)

    def aborted(self, reason: str) -> None:
        """Count a request the transport aborted (``client_gone``: its client disconnected; ``shutdown``: the
        drain ran out of time; ``slow_client``: its stream fell too far behind)."""
        self.aborts.labels(reason).inc()

    def inter_token(self, ctx: RequestContext, gap_s: float) -> None:
        """One gap between streamed chunks (the transport measures it)."""
        self.itl.labels(arm_label(ctx.arms)).observe(gap_s)
        self.slo.gap(gap_s)

    @hookimpl
    def lamina_request_admitted(self, ctx: RequestContext) -> None:
        decided = ctx.attributes.get(ROUTE_TREE_KEY)
        if isinstance(decided, dict):
            self.route_tree.labels(decided["leaf"]).inc()

    @hookimpl
    def lamina_request_first_token(self, ctx: RequestContext) -> None:
        if ctx.ttft_s is not None:
            self.ttft.labels(arm_label(ctx.arms)).observe(ctx.ttft_s)
            self.slo.first_token(ctx.ttft_s)

    @hookimpl
    def lamina_request_finished(self, ctx: RequestContext, finish_reason: FinishReason) -> None:
        arm = arm_label(ctx.arms)
        self.requests.labels(ctx.endpoint, "200", ctx.tenant, arm).inc()
        self.success.labels(finish_reason).inc()
        self.slo.outcome(200)
        if ctx.finished_at is not None:
            self.e2e.labels(arm).observe(ctx.finished_at - ctx.received_at)
        if ctx.usage is not None:
            self.queue_time.labels(arm).observe(ctx.usage.queue_s)
            self.prompt_tokens.labels(ctx.tenant, arm).inc(ctx.usage.prompt_tokens)
            self.generation_tokens.labels(ctx.tenant, arm).inc(ctx.usage.completion_tokens)

    @hookimpl
    def lamina_request_failed(self, ctx: RequestContext, error: LaminaError) -> None:
        self.requests.labels(ctx.endpoint, str(error.http_status), ctx.tenant, arm_label(ctx.arms)).inc()
        self.slo.outcome(error.http_status)
        if error.code in ABORTING_CODES:
            self.aborts.labels(error.code).inc()
