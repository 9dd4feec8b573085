"""The live pool's control loop: every ``[replicas] autoscale_interval_s`` a :class:`PoolSnapshot`
goes to the stack's autoscaler and its decision to the replica provider; replicas whose fault
rate is too high are restarted one at a time (self-healing). A fault is a 5xx that says the
replica failed (500, a lost worker, a broken stream), not a 503 refusing work for want of capacity
(``overloaded``, ``queue_full``, ``queue_timeout``, ``draining``): restarting a replica for shedding
load would only take more capacity away. With ``fallback_model`` the pool
also degrades a dependency while it heals: its requests go to the fallback model's backends
(all of them while no replica serves, else all but ``fallback_probe_share``), until the
replicas are back and ``heal_min_requests`` probe requests since the degrade came in under the
fault threshold. A fallback in place also lets the last replica restart (nothing is left unserved).

:class:`TrafficWindow` is a lifecycle observer that counts what the snapshot needs: arrivals,
TTFTs, time per output token (the inter-token latency of each finished request, averaged),
and each request's outcome per backend. Every action (scale up, drain, restart, degrade,
restore) is logged with its reason and counted in ``lamina_replica_actions_total``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque

import structlog

from lamina_hookspecs import hookimpl
from lamina_hookspecs.errors import BackendLostError, LaminaError, ServiceUnavailableError
from lamina_hookspecs.protocols import Autoscaler
from lamina_hookspecs.stats import percentile
from lamina_hookspecs.types import FinishReason, PoolSnapshot, RequestContext, ScaleDecision
from lamina.kernel.pool_tables import CanaryConfig, ReplicasConfig
from lamina.pool.canary import Verdict, judge
from lamina.pool.replicas import ReplicaSet

log = structlog.get_logger(__name__)


def replica_fault(error: LaminaError) -> bool:
    """Whether ``error`` says its replica failed: a 5xx other than a 503 refusal for want of capacity
    (a lost backend is a fault, though it is a 503 too)."""
    refusal = isinstance(error, ServiceUnavailableError) and not isinstance(error, BackendLostError)
    return error.http_status >= 500 and not refusal


class TrafficWindow:
    """What happened since the last snapshot, plus per-backend outcomes over the healing window."""

    def __init__(self, heal_window_s: float) -> None:
        self.heal_window_s = heal_window_s
        self.arrivals, self.requests, self.errors = 0, 0, 0
        self.ttfts: list[float] = []
        self.tpots: list[float] = []
        self.outcomes: deque[tuple[float, str, bool]] = deque()  # (time, backend, fault)
        self.canary_outcomes: dict[bool, list[tuple[bool, float | None]]] = {True: [], False: []}
        """While a canary is judged: (server error, TTFT) of its requests (True) and the others'."""
        self.canary_name: str | None = None
        self.since = time.monotonic()

    @hookimpl
    def lamina_request_received(self, ctx: RequestContext) -> None:
        self.arrivals += 1

    @hookimpl
    def lamina_request_first_token(self, ctx: RequestContext) -> None:
        if ctx.ttft_s is not None:
            self.ttfts.append(ctx.ttft_s)

    @hookimpl
    def lamina_request_finished(self, ctx: RequestContext, finish_reason: FinishReason) -> None:
        self._outcome(ctx, server_error=False, fault=False)
        usage = ctx.usage
        if usage and usage.completion_tokens > 1 and ctx.first_token_at and ctx.finished_at:
            self.tpots.append((ctx.finished_at - ctx.first_token_at) / (usage.completion_tokens - 1))

    @hookimpl
    def lamina_request_failed(self, ctx: RequestContext, error: LaminaError) -> None:
        self._outcome(ctx, server_error=error.http_status >= 500, fault=replica_fault(error))

    def _outcome(self, ctx: RequestContext, *, server_error: bool, fault: bool) -> None:
        self.requests += 1
        self.errors += server_error
        if ctx.backend is not None:
            self.outcomes.append((time.monotonic(), ctx.backend, fault))
            if self.canary_name is not None:
                self.canary_outcomes[ctx.backend == self.canary_name].append((server_error, ctx.ttft_s))

    def snapshot(self, replicas: ReplicaSet, now: float) -> PoolSnapshot:
        """The pool now and the traffic since the last call (which starts a new interval)."""
        elapsed = max(now - self.since, 1e-9)
        snapshot = PoolSnapshot(
            now=now, backends=tuple(w.executor.state() for w in replicas.serving), starting=len(replicas.starting),
            arrival_rate=self.arrivals / elapsed, ttft_p95_s=percentile(self.ttfts, 95), itl_p95_s=percentile(self.tpots, 95),
            error_rate=self.errors / self.requests if self.requests else 0.0,
            cold_starts_s=tuple(replicas.cold_starts_s))
        self.arrivals = self.requests = self.errors = 0
        self.ttfts, self.tpots, self.since = [], [], now
        return snapshot

    def error_rates(self, now: float, since: float | None = None) -> dict[str, tuple[int, float]]:
        """Per backend over the healing window (or from ``since`` on, within it): (requests,
        share that failed with a fault)."""
        while self.outcomes and self.outcomes[0][0] < now - self.heal_window_s:
            self.outcomes.popleft()
        counts: dict[str, list[int]] = {}
        for at, backend, failed in self.outcomes:
            if since is not None and at < since:
                continue
            entry = counts.setdefault(backend, [0, 0])
            entry[0] += 1
            entry[1] += failed
        return {backend: (n, bad / n) for backend, (n, bad) in counts.items()}

    def forget(self, backend: str) -> None:
        """Drop a restarted backend's outcomes: its new process starts with a clean record."""
        self.outcomes = deque(o for o in self.outcomes if o[1] != backend)


class PoolController:
    """Runs the autoscaler against the replica pool and heals failing replicas."""

    def __init__(self, replicas: ReplicaSet, autoscaler: Autoscaler, config: ReplicasConfig,
                 canary: CanaryConfig | None = None) -> None:
        self.replicas, self.autoscaler, self.config, self.canary = replicas, autoscaler, config, canary
        self.traffic = TrafficWindow(config.heal_window_s)
        self.last: ScaleDecision | None = None
        self.canary_ready_at: float | None = None
        self.canary_verdict: Verdict | None = None
        self.degraded_at: float | None = None
        """Since when the pool's requests go to ``fallback_model``; None while not degraded."""
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.canary is not None:
            self.replicas.launch_canary(self.canary.tables)
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.autoscale_interval_s)
            try:
                self.tick(time.monotonic())
            except Exception:
                log.exception("autoscale_tick_failed")

    def tick(self, now: float) -> ScaleDecision:
        """One interval: decide, apply, heal."""
        snapshot = self.traffic.snapshot(self.replicas, now)
        decision = self.autoscaler.decide(snapshot)
        if decision.target != snapshot.replicas:
            log.info("autoscale", current=snapshot.replicas, target=decision.target, warm=decision.warm,
                     reason=decision.reason, arrival_rate=round(snapshot.arrival_rate, 2),
                     queue_depth=snapshot.queue_depth, ttft_p95_s=snapshot.ttft_p95_s)
            self.replicas.scale_to(decision.target, decision.drain, reason=decision.reason or "autoscaler")
        self.last = decision
        self.heal(now)
        self.judge_canary(now)
        return decision

    def judge_canary(self, now: float) -> None:
        """Start comparing once the canary serves; promote or roll back once the rules can tell."""
        worker, config = self.replicas.canary, self.canary
        if worker is None or config is None or not worker.ready or worker.draining or self.canary_verdict:
            return
        if self.canary_ready_at is None:
            self.canary_ready_at, self.traffic.canary_name = now, worker.name
            self.traffic.canary_outcomes = {True: [], False: []}
            return
        if now - self.canary_ready_at < config.evaluate_after_s:
            return
        verdict = judge(config, self.traffic.canary_outcomes[True], self.traffic.canary_outcomes[False])
        if verdict is not None:
            log.warning("canary_decided", promote=verdict.promote, reason=verdict.reason)
            self.canary_verdict, self.traffic.canary_name = verdict, None
            self.replicas.end_canary(verdict.promote)

    def heal(self, now: float) -> None:
        """Restart (drain first) the worst replica over the fault threshold, one at a time and never
        the last serving one unless a fallback pool takes over meanwhile; degrade to and restore
        from the fallback."""
        threshold = self.config.heal_error_rate
        if threshold is None:
            return
        serving = self.replicas.serving
        rates = self.traffic.error_rates(now)
        failing = [(rates[w.name][1], w) for w in serving
                   if w.name in rates and rates[w.name][0] >= self.config.heal_min_requests
                   and rates[w.name][1] > threshold]
        busy = any(w.draining or not w.ready for w in self.replicas.workers if not w.canary)
        reason = ""
        if failing:
            rate, worker = max(failing, key=lambda pair: pair[0])
            reason = f"{worker.name}: fault rate {rate:.0%} over {self.config.heal_window_s:g}s > {threshold:.0%}"
        if self.config.fallback_model is not None:
            self._degrade_or_restore(now, reason, busy, threshold)
        if failing and not busy and (len(serving) >= 2 or self.degraded_at is not None):
            log.warning("replica_unhealthy", replica=worker.name, reason=reason)
            self.traffic.forget(worker.name)
            self.replicas.restart(worker, reason="heal")

    def _degrade_or_restore(self, now: float, failing: str, busy: bool, threshold: float) -> None:
        fallback = self.config.fallback_model
        if self.degraded_at is None:
            if failing:
                self.degraded_at = now
                self.replicas.actions["degrade", "heal"] += 1
                log.warning("pool_degraded", fallback_model=fallback, reason=failing)
            return
        pool = {w.name for w in self.replicas.workers if not w.canary}
        probes = [(n, rate) for name, (n, rate) in self.traffic.error_rates(now, self.degraded_at).items()
                  if name in pool]
        served = sum(n for n, _ in probes)
        rate = sum(n * rate for n, rate in probes) / served if served else 0.0
        if failing or busy or not self.replicas.serving or served < self.config.heal_min_requests or rate > threshold:
            return
        self.degraded_at = None
        self.replicas.actions["restore", "heal"] += 1
        log.warning("pool_restored", fallback_model=fallback,
                    reason=f"{served} probe requests, fault rate {rate:.0%} <= {threshold:.0%}")
