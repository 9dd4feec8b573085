"""Worker processes behind a gateway: routing across them, a crashed worker restarted, its
requests failed fast or retried elsewhere, remote backends by address."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import httpx
import pytest
from lamina.kernel.plugins import load_plugins
from lamina.kernel.stack_config import StackConfig
from lamina_hookspecs.errors import ConfigError

CHAT = {"model": "echo", "messages": [{"role": "user", "content": "a b c"}]}
LONG = {"model": "echo", "prompt": " ".join(f"w{i}" for i in range(60)), "max_tokens": 60, "stream": True}


def wait_for(condition: Any, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_requests_spread_over_replicas_that_report_their_state(live: Any, lamina_logs: list[dict[str, Any]]) -> None:
    server = live({"executor": {"use": "echo"}, "replicas": {"count": 2}})
    for _ in range(4):
        reply = httpx.post(f"{server.url}/v1/chat/completions", json=CHAT)
        assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"] == "a b c"
    used = [e["backend"] for e in lamina_logs if e["event"] == "request_finished"]
    assert sorted(used) == ["replica-0", "replica-0", "replica-1", "replica-1"], used
    metrics = httpx.get(f"{server.url}/metrics").text
    assert 'lamina_backend_up{backend="replica-0"} 1.0' in metrics
    assert 'lamina_backend_up{backend="replica-1"} 1.0' in metrics
    models = httpx.get(f"{server.url}/v1/models").json()["data"]
    assert [m["id"] for m in models] == ["echo"], "the model comes from the workers"


def test_a_killed_worker_fails_its_stream_fast_and_is_restarted(live: Any) -> None:
    server = live({"executor": {"use": "echo", "token_delay_s": 0.05},
                   "replicas": {"count": 2, "restart_backoff_s": 0.1}})
    replicas = server.stack.pool.replicas
    with httpx.stream("POST", f"{server.url}/v1/completions", json=LONG, timeout=30) as response:
        lines = response.iter_lines()
        assert next(lines).startswith("data: {")
        (busy,) = [name for name, backend in server.stack.backends.items() if backend.state().outstanding_requests]
        assert server.stack.backends[busy].state().outstanding_tokens > 60, "the gateway counts what it sent"
        worker = next(w for w in replicas.workers if w.name == busy)
        os.kill(worker.handle.process.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        rest = list(lines)
    assert time.monotonic() - killed_at < 5, "the stream ends soon after its worker died"
    errors = [line for line in rest if '"error"' in line]
    assert errors and "was lost" in errors[0] and busy in errors[0], rest[-3:]
    wait_for(lambda: worker.restarts == 1 and server.stack.backends[busy].state().healthy)
    for _ in range(2):  # both replicas serve again
        assert httpx.post(f"{server.url}/v1/chat/completions", json=CHAT).status_code == 200


def test_a_request_whose_backend_is_gone_before_any_token_is_retried_elsewhere(
        live: Any, lamina_logs: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    server = live({"executor": {"use": "echo"}, "replicas": {"count": 2, "restart_backoff_s": 30}})
    dead = server.stack.pool.replicas.workers[0]
    backend = server.stack.backends[dead.name]
    healthy_looking = backend.state()  # read before the kill: the 100 ms poll may notice it at once
    monkeypatch.setattr(backend, "state", lambda: healthy_looking)  # as if the poll had not noticed yet
    dead.handle.process.kill()
    dead.handle.process.wait()
    for _ in range(4):
        reply = httpx.post(f"{server.url}/v1/chat/completions", json=CHAT)
        assert reply.status_code == 200, reply.text
    retried = [e for e in lamina_logs if e["event"] == "retrying_on_another_backend"]
    assert retried and all(e["lost"] == dead.name for e in retried)
    finished = [e["backend"] for e in lamina_logs if e["event"] == "request_finished"]
    assert set(finished) == {"replica-1"}


def test_model_pools_of_local_replicas_and_remote_backends(live: Any, lamina_logs: list[dict[str, Any]]) -> None:
    far = live({"executor": {"use": "echo", "model": "pool-b"}, "replicas": {"count": 1}})
    address = far.stack.pool.replicas.workers[0].address
    gateway = live({"executor": {"use": "echo", "model": "pool-a"}, "replicas": {"count": 1},
                    "backends": [{"name": "far", "address": address}]})
    for model in ("pool-a", "pool-b", "pool-a", "pool-b"):
        reply = httpx.post(f"{gateway.url}/v1/chat/completions", json={**CHAT, "model": model})
        assert reply.status_code == 200 and reply.json()["model"] == model
    served = [(e["backend"]) for e in lamina_logs if e["event"] == "request_finished"][-4:]
    assert served == ["replica-0", "far", "replica-0", "far"], "each model's requests go to its pool"
    missing = httpx.post(f"{gateway.url}/v1/chat/completions", json={**CHAT, "model": "pool-c"})
    assert missing.status_code == 404 and "pool-a, pool-b" in missing.json()["error"]["message"]


@pytest.mark.parametrize(("data", "path"), [
    ({"executor": {"use": "echo"}, "replicas": {"count": -1}}, "replicas.count"),
    ({"backends": [{"name": "a"}]}, "backends[0]"),
    ({"executor": {"use": "echo"}, "replicas": {"count": 1, "fallback_model": "small"},
      "backends": [{"name": "b", "address": "h:1"}]}, "replicas.fallback_model"),
    ({"executor": {"use": "echo"}, "replicas": {"count": 1},
      "backends": [{"name": "replica-0", "address": "h:1"}]}, "backends"),
    ({"replicas": {"count": 2}, "ab": {"executor": {"arms": [{"name": "a", "use": "echo"},
                                                              {"name": "b", "use": "echo"}]}}}, "ab.executor"),
])
def test_replica_config_errors_name_the_key(data: dict[str, Any], path: str) -> None:
    with pytest.raises(ConfigError) as info:
        StackConfig.from_dict(data, load_plugins().registry)
    assert info.value.path.startswith(path), (info.value.path, str(info.value))


def test_a_routing_tree_sends_requests_to_pools(live: Any, lamina_logs: list[dict[str, Any]]) -> None:
    big = live({"executor": {"use": "echo", "model": "pool-big"}, "replicas": {"count": 1}})
    gateway = live({
        "executor": {"use": "echo", "model": "pool-small"}, "replicas": {"count": 1},
        "backends": [{"name": "big-0", "address": big.stack.pool.replicas.workers[0].address}],
        "route_tree": {"classes": {"transactional": ["cancel", "refund"]}, "root": {
            "if": "intent has transactional", "then": {"name": "txn", "pool": "pool-big", "router": "round-robin"},
            "else": {"name": "chat", "pool": "pool-small", "router": "round-robin"}}},
    })
    for content, pool in (("cancel my order", "pool-big"), ("hello there", "pool-small")):
        reply = httpx.post(f"{gateway.url}/v1/chat/completions",
                           json={"model": "auto", "messages": [{"role": "user", "content": content}]})
        assert reply.status_code == 200 and reply.json()["model"] == pool
    finished = [e for e in lamina_logs if e["event"] == "request_finished"][-2:]
    assert [(e["route_leaf"], e["backend"]) for e in finished] == [("txn", "big-0"), ("chat", "replica-0")]
    assert finished[0]["route_features"]["intent"] == ("transactional",)
    metrics = httpx.get(f"{gateway.url}/metrics").text
    assert 'lamina_route_tree_requests_total{leaf="txn"} 1.0' in metrics
    assert 'lamina_route_tree_requests_total{leaf="chat"} 1.0' in metrics

