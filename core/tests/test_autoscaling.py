"""The live pool under an autoscaler: scaling up, draining down without failing a request,
self-healing restarts, and what the snapshot and metrics say."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from typing import Any

import httpx
from lamina.tools.bench.servers import free_port
from lamina.pool.controller import TrafficWindow
from lamina.pool.replicas import LocalHandle, LocalProcesses
from lamina_hookspecs import hookimpl
from lamina_hookspecs.errors import (BackendLostError, InternalError, InvalidRequestError,
                                     ServiceUnavailableError)
from lamina_hookspecs.registration import Register
from lamina_hookspecs.types import PoolSnapshot, RequestContext, ScaleDecision, WorkerLaunch

SLOW = {"model": "echo", "prompt": " ".join(f"w{i}" for i in range(20)), "max_tokens": 20}


class Scripted:
    """An autoscaler whose answer the test sets; it records what it saw."""

    target = 1
    seen: list[PoolSnapshot] = []

    def decide(self, snapshot: PoolSnapshot) -> ScaleDecision:
        Scripted.seen.append(snapshot)
        return ScaleDecision(replicas=Scripted.target, reason="scripted")


class ScriptedPlugin:
    @hookimpl
    def lamina_register_autoscalers(self, register: Register) -> None:
        register("scripted", lambda options, context: Scripted())


def wait_for(condition: Any, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_scale_up_then_drain_down_without_failing_a_request(live: Any, lamina_logs: list[dict[str, Any]]) -> None:
    Scripted.target, Scripted.seen = 1, []
    server = live({"executor": {"use": "echo", "token_delay_s": 0.05}, "autoscaler": {"use": "scripted"},
                   "replicas": {"count": 1, "autoscale_interval_s": 0.2}}, ("scripted", ScriptedPlugin()))
    pool = server.stack.pool.replicas
    Scripted.target = 3
    wait_for(lambda: len(pool.serving) == 3)
    metrics = httpx.get(f"{server.url}/metrics").text
    assert 'lamina_replicas{state="serving"} 3.0' in metrics
    assert 'lamina_replica_actions_total{action="spawn",reason="scripted"} 2.0' in metrics
    assert "lamina_replica_cold_start_seconds" in metrics and "lamina_autoscaler_target_replicas 3.0" in metrics

    replies: list[httpx.Response] = []
    streams = [threading.Thread(target=lambda: replies.append(
        httpx.post(f"{server.url}/v1/completions", json=SLOW, timeout=30))) for _ in range(3)]
    for thread in streams:
        thread.start()
    wait_for(lambda: sum(w.in_flight for w in pool.workers) == 3)
    Scripted.target = 1  # two replicas drain while their requests (1 s each) are still running
    wait_for(lambda: len(pool.workers) == 1, timeout_s=30)
    for thread in streams:
        thread.join()
    assert [r.status_code for r in replies] == [200, 200, 200], "draining let running requests finish"
    assert all(r.json()["usage"]["completion_tokens"] == 20 for r in replies)
    stopped = [e for e in lamina_logs if e["event"] == "replica_stopped"]
    assert len(stopped) == 2 and all(e["reason"] == "scripted" for e in stopped)
    assert httpx.post(f"{server.url}/v1/completions", json={**SLOW, "max_tokens": 2}).status_code == 200
    snapshot = Scripted.seen[-1]
    assert snapshot.replicas == 1 and snapshot.cold_starts_s and all(c > 0 for c in snapshot.cold_starts_s)


def test_snapshot_counts_arrivals_ttft_and_errors(live: Any) -> None:
    Scripted.target, Scripted.seen = 1, []
    server = live({"executor": {"use": "echo"}, "autoscaler": {"use": "scripted"},
                   "replicas": {"count": 1, "autoscale_interval_s": 60}}, ("scripted", ScriptedPlugin()))
    for _ in range(4):
        assert httpx.post(f"{server.url}/v1/completions", json={**SLOW, "max_tokens": 3}).status_code == 200
    assert httpx.post(f"{server.url}/v1/completions", json={**SLOW, "model": "nope"}).status_code == 404
    decision = server.stack.pool.controller.tick(time.monotonic())  # scales nothing: safe off the event loop
    snapshot = Scripted.seen[-1]
    assert decision.replicas == 1
    assert snapshot.arrival_rate > 0 and snapshot.ttft_p95_s is not None and snapshot.itl_p95_s is not None
    assert snapshot.error_rate == 0.0, "a 404 is the client's error, not the pool's"
    assert [b.name for b in snapshot.backends] == ["replica-0"]


def test_a_refusal_for_want_of_capacity_is_an_error_but_no_fault_of_the_replica() -> None:
    """A replica shedding load (503 ``overloaded``) counts in the pool's 5xx share, which autoscalers
    read, but not toward healing: restarting it would take capacity away. A lost worker or a 500 does."""
    window = TrafficWindow(heal_window_s=60)
    errors = [ServiceUnavailableError("busy", code="overloaded"), ServiceUnavailableError("full", code="queue_full"),
              BackendLostError("gone"), InternalError("bug"), InvalidRequestError("bad")]
    for i, error in enumerate(errors):
        window.lamina_request_failed(ctx=RequestContext(request_id=f"r{i}", endpoint="chat", backend="replica-0"),
                                     error=error)
    assert window.errors == 4  # every 5xx
    assert window.error_rates(time.monotonic()) == {"replica-0": (5, 2 / 5)}  # the lost worker and the 500


def test_a_replica_over_the_5xx_threshold_is_restarted_but_never_the_last(live: Any) -> None:
    server = live({"executor": {"use": "echo"},
                   "replicas": {"count": 2, "autoscale_interval_s": 0.2, "heal_error_rate": 0.05,
                                "heal_min_requests": 5}})
    pool, replicas = server.stack.pool.controller, server.stack.pool.replicas
    now = time.monotonic()
    old_pid = replicas.workers[0].handle.process.pid
    pool.traffic.outcomes.extend([(now, "replica-0", True)] * 4 + [(now, "replica-0", False)] * 6
                                 + [(now, "replica-1", False)] * 10)  # the controller's next tick heals
    wait_for(lambda: replicas.actions["restart", "heal"] == 1 and replicas.workers[0].ready
             and not replicas.workers[0].draining)
    assert replicas.workers[0].handle.process.pid != old_pid and len(replicas.serving) == 2
    assert httpx.post(f"{server.url}/v1/completions", json={**SLOW, "max_tokens": 2}).status_code == 200
    # with one replica left serving, none is restarted however bad its record
    replicas.workers[1].draining = True
    pool.traffic.outcomes.extend([(time.monotonic(), "replica-0", True)] * 10)
    time.sleep(1.0)  # five ticks
    assert replicas.actions["restart", "heal"] == 1
    replicas.workers[1].draining = False


def test_an_unhealthy_pool_degrades_to_the_fallback_model_then_restores(
        live: Any, lamina_logs: list[dict[str, Any]]) -> None:
    small = live({"executor": {"use": "echo", "model": "small"}, "replicas": {"count": 1}})
    server = live({"executor": {"use": "echo", "model": "big"},
                   "replicas": {"count": 1, "autoscale_interval_s": 0.2, "heal_error_rate": 0.05,
                                "heal_min_requests": 5, "fallback_model": "small", "fallback_probe_share": 0.5},
                   "backends": [{"name": "small-0", "address": small.stack.pool.replicas.workers[0].address}]})
    pool, replicas = server.stack.pool.controller, server.stack.pool.replicas
    body = {**SLOW, "model": "big", "max_tokens": 2}
    assert httpx.post(f"{server.url}/v1/completions", json=body).json()["model"] == "big"
    old_pid = replicas.workers[0].handle.process.pid
    pool.traffic.outcomes.extend([(time.monotonic(), "replica-0", True)] * 4
                                 + [(time.monotonic(), "replica-0", False)] * 6)
    wait_for(lambda: pool.degraded_at is not None)
    models = []
    while replicas.workers[0].handle.process.pid == old_pid or not replicas.serving:
        reply = httpx.post(f"{server.url}/v1/completions", json=body)  # served while the only replica restarts
        assert reply.status_code == 200, reply.text
        models.append(reply.json()["model"])
    assert replicas.actions["restart", "heal"] == 1, "with a fallback in place even the last replica restarts"
    assert "small" in models and pool.degraded_at is not None
    probes = models.count("big")  # the old replica's last answers were forgotten with its record at the restart
    while pool.degraded_at is not None:
        reply = httpx.post(f"{server.url}/v1/completions", json=body)
        assert reply.status_code == 200, reply.text
        probes += reply.json()["model"] == "big"
        assert probes < 40, "restored after heal_min_requests good probe requests"
    assert probes >= 5
    assert all(httpx.post(f"{server.url}/v1/completions", json=body).json()["model"] == "big" for _ in range(5))
    metrics = httpx.get(f"{server.url}/metrics").text
    for action in ("degrade", "restore", "restart"):
        assert f'lamina_replica_actions_total{{action="{action}",reason="heal"}} 1.0' in metrics
    degraded = next(e for e in lamina_logs if e["event"] == "pool_degraded")
    assert degraded["fallback_model"] == "small" and "replica-0: fault rate 36%" in degraded["reason"]
    assert "probe requests" in next(e for e in lamina_logs if e["event"] == "pool_restored")["reason"]


class DiesAtLaunch:
    """Local worker processes, except that the launches numbered in ``dying`` start a process
    that exits at once (a worker that crashes while loading its model)."""

    dying: set[int] = set()

    def __init__(self) -> None:
        self.local, self.launched = LocalProcesses("127.0.0.1", 0), 0

    def launch(self, worker: WorkerLaunch) -> Any:
        self.launched += 1
        if self.launched in DiesAtLaunch.dying:
            process = subprocess.Popen([sys.executable, "-c", "import time, sys; time.sleep(0.3); sys.exit(3)"])
            return LocalHandle(process, f"127.0.0.1:{free_port()}")
        return self.local.launch(worker)

    def close(self) -> None:
        self.local.close()


class DiesAtLaunchPlugin:
    @hookimpl
    def lamina_register_replica_providers(self, register: Register) -> None:
        register("dies-at-launch", lambda options, context: DiesAtLaunch())


def test_a_worker_dying_while_it_starts_is_noticed_at_once_and_started_again(
        live: Any, lamina_logs: list[dict[str, Any]]) -> None:
    Scripted.target, DiesAtLaunch.dying = 1, {2, 4}
    server = live({"executor": {"use": "echo"}, "autoscaler": {"use": "scripted"},
                   "replicas": {"count": 1, "autoscale_interval_s": 0.2, "restart_backoff_s": 0.1,
                                "heal_error_rate": 0.05, "heal_min_requests": 5, "provider": "dies-at-launch"}},
                  ("scripted", ScriptedPlugin()), ("dies", DiesAtLaunchPlugin()))
    replicas = server.stack.pool.replicas
    Scripted.target = 2  # launch 2 dies: dropped, and the autoscaler's next tick asks again (launch 3)
    began = time.monotonic()
    wait_for(lambda: len(replicas.serving) == 2)
    failed = [e for e in lamina_logs if e["event"] == "replica_start_failed"]
    assert len(failed) == 1 and "status 3" in failed[0]["error"] and not failed[0]["retry"]
    assert time.monotonic() - began < 20, "not after start_timeout_s (600 s)"
    server.stack.pool.controller.traffic.outcomes.extend([(time.monotonic(), "replica-0", True)] * 5)
    # the heal restart's launch (4) dies: it is tried again after the back-off
    wait_for(lambda: replicas.workers[0].restarts == 1 and replicas.workers[0].ready
             and len(replicas.serving) == 2)
    failed = [e for e in lamina_logs if e["event"] == "replica_start_failed"]
    assert len(failed) == 2 and failed[1]["retry"] and failed[1]["replica"] == "replica-0"
    assert httpx.post(f"{server.url}/v1/completions", json={**SLOW, "max_tokens": 2}).status_code == 200


def _canary_stack(canary_executor: dict[str, Any], max_ttft_p95_ratio: float = 3.0) -> dict[str, Any]:
    return {"executor": {"use": "echo"}, "replicas": {"count": 1, "autoscale_interval_s": 0.2},
            "canary": {"executor": canary_executor, "share": 0.5, "min_requests": 8, "evaluate_after_s": 0,
                       "max_ttft_p95_ratio": max_ttft_p95_ratio}}


def _serve_until_judged(server: Any) -> None:
    """Once the canary serves, send requests until the controller has judged it (the canary's
    share of them is random: a fixed count may leave it short of min_requests)."""
    pool = server.stack.pool.replicas
    wait_for(lambda: pool.canary is not None and pool.canary.ready and server.stack.pool.controller.canary_ready_at)
    for _ in range(300):
        if server.stack.pool.controller.canary_verdict is not None:
            return
        assert httpx.post(f"{server.url}/v1/completions", json={**SLOW, "max_tokens": 2}).status_code == 200
    raise AssertionError("no verdict after 300 requests")


def test_a_canary_within_the_rules_is_promoted(live: Any, lamina_logs: list[dict[str, Any]]) -> None:
    # as fast as the stable replica; a wide TTFT rule, since p95 of a few ~1 ms TTFTs is noise on a busy machine
    server = live(_canary_stack({"use": "echo", "vocab_size": 1000}, max_ttft_p95_ratio=50.0))
    pool = server.stack.pool.replicas
    _serve_until_judged(server)
    wait_for(lambda: pool.canary is None and pool.actions["restart", "canary_promote"] == 1
             and len(pool.serving) == 1)
    assert pool.stack["executor"] == {"use": "echo", "vocab_size": 1000}, "stable replicas run the canary's config"
    (decided,) = [e for e in lamina_logs if e["event"] == "canary_decided"]
    assert decided["promote"] and "promoted" in decided["reason"]
    arms = {e["arm"] for e in lamina_logs if e["event"] == "request_finished"}
    assert {"canary=canary", "canary=stable"} <= arms
    assert httpx.post(f"{server.url}/v1/completions", json={**SLOW, "max_tokens": 2}).status_code == 200


def test_a_slower_canary_is_rolled_back(live: Any, lamina_logs: list[dict[str, Any]]) -> None:
    server = live(_canary_stack({"use": "echo", "prefill_s_per_token": 0.004}))  # ~80 ms more TTFT
    pool = server.stack.pool.replicas
    _serve_until_judged(server)
    wait_for(lambda: pool.canary is None and pool.actions["canary_rollback", "canary"] == 1)
    assert pool.stack["executor"] == {"use": "echo"} and pool.actions["restart", "canary_promote"] == 0
    (decided,) = [e for e in lamina_logs if e["event"] == "canary_decided"]
    assert not decided["promote"] and "TTFT p95" in decided["reason"]
