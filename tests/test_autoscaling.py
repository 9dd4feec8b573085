"""The live pool under an autoscaler: scaling up, draining down without failing a request,
self-healing restarts, and what the snapshot and metrics say."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
from lamina_hookspecs import hookimpl
from lamina_hookspecs.registration import Register
from lamina_hookspecs.types import PoolSnapshot, ScaleDecision

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
    pool = server.stack.replicas
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
    decision = server.stack.pool.tick(time.monotonic())  # scales nothing: safe off the event loop
    snapshot = Scripted.seen[-1]
    assert decision.replicas == 1
    assert snapshot.arrival_rate > 0 and snapshot.ttft_p95_s is not None and snapshot.itl_p95_s is not None
    assert snapshot.error_rate == 0.0, "a 404 is the client's error, not the pool's"
    assert [b.name for b in snapshot.backends] == ["replica-0"]


def test_a_replica_over_the_5xx_threshold_is_restarted_but_never_the_last(live: Any) -> None:
    server = live({"executor": {"use": "echo"},
                   "replicas": {"count": 2, "autoscale_interval_s": 0.2, "heal_error_rate": 0.05,
                                "heal_min_requests": 5}})
    pool, replicas = server.stack.pool, server.stack.replicas
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


def _canary_stack(canary_executor: dict[str, Any]) -> dict[str, Any]:
    return {"executor": {"use": "echo"}, "replicas": {"count": 1, "autoscale_interval_s": 0.2},
            "canary": {"executor": canary_executor, "share": 0.5, "min_requests": 8, "evaluate_after_s": 0,
                       "max_ttft_p95_ratio": 3.0}}


def test_a_canary_within_the_rules_is_promoted(live: Any, lamina_logs: list[dict[str, Any]]) -> None:
    server = live(_canary_stack({"use": "echo", "vocab_size": 1000}))
    pool = server.stack.replicas
    wait_for(lambda: pool.canary is not None and pool.canary.ready and server.stack.pool.canary_ready_at)
    for _ in range(40):
        assert httpx.post(f"{server.url}/v1/completions", json={**SLOW, "max_tokens": 2}).status_code == 200
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
    pool = server.stack.replicas
    wait_for(lambda: pool.canary is not None and pool.canary.ready and server.stack.pool.canary_ready_at)
    for _ in range(40):
        assert httpx.post(f"{server.url}/v1/completions", json={**SLOW, "max_tokens": 2}).status_code == 200
    wait_for(lambda: pool.canary is None and pool.actions["canary_rollback", "canary"] == 1)
    assert pool.stack["executor"] == {"use": "echo"} and pool.actions["restart", "canary_promote"] == 0
    (decided,) = [e for e in lamina_logs if e["event"] == "canary_decided"]
    assert not decided["promote"] and "TTFT p95" in decided["reason"]
