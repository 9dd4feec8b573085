"""``lamina autoscale replay``: policies from the registry against traces on a simulated pool."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pytest
from lamina.tools import autoscale_replay as ar
from lamina.cli import main
from lamina.kernel.plugins import load_plugins
from lamina_hookspecs.errors import ConfigError
from lamina_hookspecs.types import PoolSnapshot, ScaleDecision

STEP = "synthetic:step:low_rate=10,high_rate=40,duration_s=1800"
"""10 req/s, 40 req/s from 600 s to 1200 s, 10 req/s: 5, 20 and 5 replicas' worth at 2 req/s each."""
TARGET = {"metric": "arrival_per_replica", "target": 1.5, "max_replicas": 60}
MODEL = ar.PoolModel(cold_start_s=30.0)


@pytest.fixture(scope="module")
def registry() -> Any:
    return load_plugins().registry


def _replay(registry: Any, trace: str, policy: str, options: dict[str, Any], model: ar.PoolModel = MODEL
            ) -> dict[str, Any]:
    return ar.replay(trace, policy, options, model, registry)


def test_target_follows_a_step_and_static_pays_for_its_headroom(registry: Any) -> None:
    target = _replay(registry, STEP, "target", TARGET)
    static = _replay(registry, STEP, "static", {"replicas": 28})
    line = target["timeline"]
    serving = dict(zip(line["t"], line["serving"]))
    assert serving[590.0] <= 8, "sized for 10 req/s before the step"
    assert max(line["serving"]) >= 27, "scaled up for 40 req/s (at 1.5 req/s per replica)"
    assert serving[1790.0] <= 8, "and back down after it"
    assert target["summary"]["cold_starts"] >= 20 and target["summary"]["scale_events"] >= 2
    assert static["summary"]["slo_violations"] == 0 and static["summary"]["cold_starts"] == 0
    assert static["summary"]["ttft_p99_s"] == pytest.approx(MODEL.first_token_s, abs=0.01)
    assert static["summary"]["replica_seconds"] == 28 * 1800
    assert target["summary"]["replica_seconds"] < 0.75 * static["summary"]["replica_seconds"]
    assert target["summary"]["requests"] == static["summary"]["requests"], "every policy sees the same arrivals"


def test_too_few_replicas_queue_and_violate(registry: Any) -> None:
    result = _replay(registry, STEP, "static", {"replicas": 10})  # 20 req/s of capacity against 40
    s = result["summary"]
    assert s["slo_violation_share"] > 0.2 and s["ttft_p99_s"] > 60
    # the backlog outlasts the step: those still queued at the end count with the wait so far
    assert max(result["timeline"]["queue"]) > 10_000 and s["unserved"] > 1000


def test_deterministic_for_a_seed(registry: Any) -> None:
    runs = [_replay(registry, STEP, "predictive", {"per_replica_rate": 1.5, "max_replicas": 60},
                    attrs.evolve(MODEL, seed=seed)) for seed in (3, 3, 4)]
    for run in runs:
        del run["summary"]["wall_s"]
    assert runs[0] == runs[1]
    assert runs[0]["summary"] != runs[2]["summary"]


def test_the_policy_is_the_one_a_stack_file_builds(registry: Any, build_stack: Any) -> None:
    from lamina.kernel.options import build_options

    options = {"use": "target", **TARGET}
    stack = build_stack(overrides={"autoscaler": options})
    replayed = ar.build_policy("target", TARGET, registry)
    component = registry.get((stack.config.layers["autoscaler"].component.layer,), "target", "autoscaler")
    direct = component.factory(build_options(component.options, TARGET, "autoscaler"), None)
    assert type(replayed) is type(stack.autoscaler) is type(direct)
    assert replayed.options == stack.autoscaler.options == direct.options
    with pytest.raises(ConfigError, match="autoscaler.use: no autoscaler named 'targett'; did you mean 'target'"):
        ar.build_policy("targett", {}, registry)
    with pytest.raises(ConfigError, match="autoscaler.metrc: unknown option"):
        ar.build_policy("target", {**TARGET, "metrc": "kv_usage"}, registry)


class Scripted:
    """A policy that answers ``script[t]`` from the given time on, and records what it saw."""

    def __init__(self, script: dict[float, ScaleDecision]) -> None:
        self.script, self.seen = sorted(script.items()), []

    def decide(self, snapshot: PoolSnapshot) -> ScaleDecision:
        self.seen.append(snapshot)
        return [d for t, d in self.script if t <= snapshot.now][-1]


def test_cold_starts_warm_replicas_and_drains() -> None:
    policy = Scripted({0.0: ScaleDecision(replicas=2), 100.0: ScaleDecision(replicas=2, warm=2),
                       300.0: ScaleDecision(replicas=1, drain=("replica-3",))})
    trace = ar.parse_trace("synthetic:step:low_rate=2,high_rate=2,duration_s=600")
    result = ar.simulate(policy, trace, ar.PoolModel(cold_start_s=50.0, cold_start_jitter=0.0, service_s=20.0,
                                                    service_dist="fixed", initial_replicas=2))
    at = {t: i for i, t in enumerate(result["timeline"]["t"])}
    line = result["timeline"]
    assert (line["serving"][at[140.0]], line["starting"][at[140.0]]) == (2, 2)
    assert (line["serving"][at[150.0]], line["starting"][at[150.0]]) == (4, 0)
    assert policy.seen[at[160.0] + 1].cold_starts_s == (50.0, 50.0)
    # at 300 s: replica-3 drains first, then the least loaded two; each finishes its last 20 s request
    assert line["serving"][at[310.0]] == 1 and 1 <= line["draining"][at[310.0]] <= 3
    assert line["draining"][at[330.0]] == 0
    assert [b.name for b in policy.seen[-1].backends] != ["replica-3"]
    assert result["summary"]["cold_starts"] == 2 and result["summary"]["max_replicas"] == 4
    # 2 replicas for 100 s, 4 for 200 s, then 1 (plus the drains' last seconds)
    assert 2 * 100 + 4 * 200 + 300 < result["summary"]["replica_seconds"] < 2 * 100 + 4 * 200 + 300 + 3 * 21


def test_snapshot_shows_running_queue_and_kv() -> None:
    policy = Scripted({0.0: ScaleDecision(replicas=2)})
    trace = ar.parse_trace("synthetic:step:low_rate=10,high_rate=10,duration_s=60")
    ar.simulate(policy, trace, ar.PoolModel(initial_replicas=2, concurrency=4, service_s=10.0,
                                            service_dist="fixed"))
    last = policy.seen[-1]  # 8 slots against 10 req/s × 10 s: full, with a queue shared out
    assert [b.outstanding_requests - b.queue_depth for b in last.backends] == [4, 4]
    assert last.queue_depth > 100 and abs(last.backends[0].queue_depth - last.backends[1].queue_depth) <= 1
    assert last.kv_usage == 1.0 and last.arrival_rate == pytest.approx(10, rel=0.5)
    assert last.ttft_p95_s is not None and last.ttft_p95_s > 5


def test_water_filling_goes_to_the_least_loaded() -> None:
    pool = ar._Pool(ar.PoolModel(concurrency=8), horizon=10, rng=np.random.default_rng(0))
    pool.start(0.0, 4, cold=False)
    pool.busy[:4] = [8, 2, 5, 7]  # free: 0, 6, 3, 1 (and the slots not started: none)
    assert pool.room() == 10
    pool.assign(4, np.full(4, 3))
    # 3 to the emptiest, which then ties with the next at 3 free: the first of the two takes the 4th
    assert pool.busy[:4].tolist() == [8, 6, 5, 7]
    assert pool.done[:4, 3].tolist() == [0, 4, 0, 0]
    pool.room()
    pool.assign(6, np.full(6, 4))
    assert pool.busy.tolist() == [8] * 4 + [0] * (len(pool.busy) - 4)


def test_traces(tmp_path: Path) -> None:
    step = ar.parse_trace("synthetic:step:high_rate=80,duration_s=900")
    assert step.duration_s == 900 and "high_rate=80" in step.name
    assert step.mean_rate(300, 600) == 80 and step.mean_rate(0, 300) == 10
    diurnal = ar.parse_trace("synthetic:diurnal:peak_rate=50,base_rate=5,duration_s=1000")
    assert diurnal.shape.rate(np.array([0.0, 500.0])).tolist() == [5.0, 50.0]
    bursty = ar.parse_trace("synthetic:bursty")
    assert bursty.shape.rate(np.array([30.0, 630.0, 700.0])).tolist() == [20.0, 100.0, 20.0]
    counts = [len(a) for a in step.by_step(1.0, 900, np.random.default_rng(0))]
    assert sum(counts[300:600]) == pytest.approx(80 * 300, rel=0.05)
    with pytest.raises(ConfigError, match="no synthetic trace 'ramp'"):
        ar.parse_trace("synthetic:ramp")
    with pytest.raises(ConfigError, match="synthetic:step.hi_rate: unknown option; did you mean 'high_rate'"):
        ar.parse_trace("synthetic:step:hi_rate=5")
    with pytest.raises(ConfigError, match="synthetic:step.duration_s"):
        ar.parse_trace("synthetic:step:duration_s=0")

    bench = {"records": [{"index": i, "target": t, "level": "rate=5", "round": 0, "warmup": i == 0, "start": s}
                         for i, (t, s) in enumerate([("A", 0.0), ("A", 0.5), ("A", 2.5), ("B", 0.1), ("A", 1.0)])]}
    (tmp_path / "run.json").write_text(json.dumps(bench))
    recorded = ar.parse_trace(str(tmp_path / "run.json"))
    assert recorded.times.tolist() == [0.5, 1.0, 2.5] and "target 'A'" in recorded.name
    assert [a.tolist() for a in recorded.by_step(1.0, 3, np.random.default_rng(0))] == [[0.5], [1.0], [2.5]]
    (tmp_path / "times.json").write_text("[3, 1, 2]")
    assert ar.parse_trace(str(tmp_path / "times.json")).times.tolist() == [1.0, 2.0, 3.0]
    with pytest.raises(ConfigError, match="cannot read"):
        ar.parse_trace(str(tmp_path / "missing.json"))


def test_a_day_of_hundreds_of_replicas_in_seconds(registry: Any) -> None:
    result = _replay(registry, "synthetic:diurnal:peak_rate=400,base_rate=40", "target",
                     {**TARGET, "max_replicas": 400}, ar.PoolModel(step_s=1.0))
    s = result["summary"]
    assert s["duration_s"] == 86400 and s["requests"] > 15_000_000 and s["max_replicas"] > 250
    assert s["slo_violation_share"] < 0.001
    assert s["wall_s"] < 60


def test_pool_model_checks() -> None:
    with pytest.raises(ValueError, match="must divide"):
        ar.PoolModel(interval_s=10.0, step_s=3.0)
    with pytest.raises(ValueError):
        ar.PoolModel(concurrency=0)


def test_cli_replay(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["autoscale", "replay", "synthetic:step:duration_s=600", "--policy", "target", "--option", "target=1.5",
            "--option", "metric=arrival_per_replica", "--option", "max_replicas=40", "--cold-start-s", "20",
            "--interval", "5", "--seed", "7"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "policy target (target=1.5, metric=arrival_per_replica, max_replicas=40) on synthetic:step" in out
    assert "cold start 20 s" in out and "decisions every 5 s" in out and "replica-seconds" in out

    assert main([*args, "--json", "--html", str(tmp_path / "r.html")]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["model"]["seed"] == 7 and data["options"]["max_replicas"] == 40
    assert len(data["timeline"]["t"]) == 120 and data["summary"]["requests"] > 5000
    page = (tmp_path / "r.html").read_text()
    assert page.count("<svg") == 3 and "arrival rate" in page and "<script" not in page

    assert main(["autoscale", "replay", "synthetic:step", "--policy", "target", "--option", "target=1"]) == 1
    assert "autoscaler.max_replicas" in capsys.readouterr().err
    assert main(["autoscale", "replay", "synthetic:step", "--policy", "static", "--option", "replicas"]) == 1
    assert "expected KEY=VALUE" in capsys.readouterr().err
    assert main(["autoscale", "replay", "synthetic:step", "--policy", "static", "--step-s", "3"]) == 2
    assert "must divide" in capsys.readouterr().err
