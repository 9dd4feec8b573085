import random

import pytest
from lamina.kernel.options import build_options
from lamina.testing.contracts import AutoscalerContract
from lamina_hookspecs.errors import ConfigError
from lamina_hookspecs.types import BackendState, PoolSnapshot

from lamina_autoscale.target import Target, TargetOptions


class TestTargetContract(AutoscalerContract):
    registered_name = "target"
    options = {"target": 4.0, "max_replicas": 10}


class TestTargetOnQueueContract(AutoscalerContract):
    registered_name = "target"
    options = {"metric": "queue_per_replica", "target": 2.0, "max_replicas": 10, "max_step": 2}


def pool(now: float, serving: int, running: int, *, starting: int = 0, rate: float = 1.0) -> PoolSnapshot:
    """``serving`` replicas running ``running`` requests in all, spread as evenly as they go."""
    backends = tuple(BackendState(name=f"r{i}", model="m", outstanding_requests=running // serving
                                  + (i < running % serving)) for i in range(serving))
    return PoolSnapshot(now=now, backends=backends, starting=starting, arrival_rate=rate)


def scaler(**options: object) -> Target:
    return Target(build_options(TargetOptions, {"target": 4.0, "max_replicas": 100, **options}, "autoscaler"))


def test_hpa_rule_ceil_of_current_times_ratio() -> None:
    s = scaler(scale_up_cooldown_s=0)
    # 4 serving replicas running 6 each against a target of 4: ceil(4 × 6/4) = 6
    decision = s.decide(pool(0, 4, 24))
    assert decision.replicas == 6 and decision.warm == 0 and "running_per_replica" in decision.reason


def test_within_tolerance_no_action() -> None:
    s = scaler(tolerance=0.1, scale_up_cooldown_s=0, scale_down_cooldown_s=0)
    assert s.decide(pool(0, 10, 43)).replicas == 10  # ratio 1.075
    assert s.decide(pool(10, 10, 37)).replicas == 10  # ratio 0.925
    assert s.decide(pool(20, 10, 46)).replicas == 12  # ratio 1.15: ceil(11.5)


def test_starting_replicas_are_not_added_twice() -> None:
    s = scaler(scale_up_cooldown_s=0)
    assert s.decide(pool(0, 2, 16)).replicas == 4
    # two started, not ready: the two serving ones still run 8 each, the pool already has 4
    assert s.decide(pool(10, 2, 16, starting=2)).replicas == 4


def test_max_step_and_bounds() -> None:
    s = scaler(scale_up_cooldown_s=0, max_step=3, max_replicas=20, min_replicas=2)
    assert s.decide(pool(0, 2, 80)).replicas == 5
    assert s.decide(pool(10, 5, 400)).replicas == 8
    big = scaler(scale_up_cooldown_s=0, scale_down_cooldown_s=0, max_replicas=20, min_replicas=2)
    assert big.decide(pool(0, 2, 400)).replicas == 20
    assert big.decide(pool(10, 20, 0, rate=0.0)).replicas == 2


def test_scale_down_drains_the_least_loaded() -> None:
    s = scaler(scale_down_cooldown_s=0)
    backends = tuple(BackendState(name=n, model="m", outstanding_requests=k)
                     for n, k in (("a", 3), ("b", 0), ("c", 1), ("d", 2)))
    decision = s.decide(PoolSnapshot(now=0, backends=backends, arrival_rate=1.0))
    assert decision.replicas == 2 and decision.drain == ("b", "c")  # ceil(4 × 1.5/4) = 2


@pytest.mark.parametrize("metric, snapshot, expected", [
    ("queue_per_replica", PoolSnapshot(now=0, backends=tuple(
        BackendState(name=f"r{i}", model="m", queue_depth=8, outstanding_requests=10) for i in range(2))), 8),
    ("kv_usage", PoolSnapshot(now=0, backends=tuple(
        BackendState(name=f"r{i}", model="m", kv_blocks_used=90, kv_blocks_total=100) for i in range(4)),
        arrival_rate=1.0), 6),
    ("arrival_per_replica", PoolSnapshot(now=0, backends=tuple(
        BackendState(name=f"r{i}", model="m") for i in range(3)), arrival_rate=30.0), 10),
    ("ttft_p95_s", PoolSnapshot(now=0, backends=tuple(
        BackendState(name=f"r{i}", model="m") for i in range(3)), arrival_rate=1.0, ttft_p95_s=3.0), 5),
])
def test_metrics(metric: str, snapshot: PoolSnapshot, expected: int) -> None:
    target = {"queue_per_replica": 2.0, "kv_usage": 0.6, "arrival_per_replica": 3.0, "ttft_p95_s": 2.0}[metric]
    s = scaler(metric=metric, target=target, scale_up_cooldown_s=0, scale_down_cooldown_s=0)
    assert s.decide(snapshot).replicas == expected


def test_unknown_metric_holds_and_idle_pool_goes_to_min() -> None:
    s = scaler(metric="ttft_p95_s", target=1.0, scale_down_cooldown_s=0)
    assert s.decide(pool(0, 3, 3)).replicas == 3  # traffic but no TTFT measured: hold
    assert s.decide(PoolSnapshot(now=10, backends=pool(0, 3, 0).backends[1:])).replicas == 1


def _run(load: list[float], *, start: int, noise: float = 0.0, seed: int = 0, interval: float = 10.0,
         **options: object) -> list[int]:
    """A closed loop: the pool serves ``load[i]`` requests in all (target 4 per replica) times a
    random factor ``1 + N(0, noise)``, spread evenly; replicas are ready at the next decision."""
    rng = random.Random(seed)
    s = scaler(**options)
    replicas, history = start, []
    for i, total in enumerate(load):
        running = max(0, round(total * (1 + rng.gauss(0, noise))))
        backends = pool(i * interval, replicas, running).backends
        replicas = s.decide(PoolSnapshot(now=i * interval, backends=backends, arrival_rate=1.0)).replicas
        history.append(replicas)
    return history


def _moves(history: list[int]) -> tuple[int, int]:
    """How many times the count changed, and how many of those reversed the direction before."""
    changes = [b > a for a, b in zip(history, history[1:]) if a != b]
    return len(changes), sum(1 for x, y in zip(changes, changes[1:]) if x != y)


@pytest.mark.parametrize("seed", range(5))
def test_noisy_steady_load_does_not_flap(seed: int) -> None:
    # 2 h at 40 requests (10 replicas' worth) ± 5%: after the first decision (which has no
    # history to stabilise it) and one down window, it never moves
    assert _moves(_run([40.0] * 720, start=10, noise=0.05, seed=seed)[13:]) == (0, 0)
    # ± 10%, as wide as the band: the load leaves it every few minutes, yet the pool settles on
    # a count that holds it (at most one correction of a first move), with no back and forth
    history = _run([40.0] * 720, start=10, noise=0.1, seed=seed)
    changes, reversals = _moves(history)
    assert reversals <= 1 and changes <= 3 and set(history) <= set(range(8, 14)), history


def test_noise_inside_the_band_never_moves() -> None:
    rng = random.Random(1)
    s = scaler(tolerance=0.1, scale_up_cooldown_s=0, scale_down_cooldown_s=0)
    for i in range(500):
        load = 40 * (1 + rng.uniform(-0.08, 0.08))
        backends = tuple(BackendState(name=f"r{k}", model="m", outstanding_requests=0) for k in range(10))
        backends = (*backends[:-1], BackendState(name="r9", model="m", outstanding_requests=round(load)))
        assert s.decide(PoolSnapshot(now=10.0 * i, backends=backends, arrival_rate=1.0)).replicas == 10


def test_step_up_follows_within_one_cooldown() -> None:
    # 40 requests, then 80 from t = 600 on: the snapshot at 610 is the first to see it
    history = _run([40.0] * 61 + [80.0] * 30, start=10, scale_up_cooldown_s=30)
    first_up = next(i for i, r in enumerate(history) if r > 10) * 10.0
    assert 610 < first_up <= 610 + 30
    assert history[-1] == 20


def test_step_down_waits_for_the_down_cooldown() -> None:
    history = _run([80.0] * 61 + [40.0] * 40, start=20, scale_down_cooldown_s=120)
    first_down = next(i for i, r in enumerate(history) if r < 20) * 10.0
    assert first_down == 610 + 120
    assert history[-1] == 10


def test_a_spike_shorter_than_the_up_window_changes_nothing() -> None:
    history = _run([40.0] * 30 + [80.0] * 2 + [40.0] * 30, start=10, scale_up_cooldown_s=30)
    assert set(history) == {10}


@pytest.mark.parametrize("options, problem", [
    ({"target": 1.0, "max_replicas": 2, "min_replicas": 3}, "max_replicas (2) is below min_replicas (3)"),
    ({"target": 0.0, "max_replicas": 2}, "autoscaler.target"),
    ({"target": 1.0, "max_replicas": 2, "metric": "latency"}, "autoscaler.metric: must be one of"),
    ({"max_replicas": 2}, "target"),
    ({"target": 1.0, "max_replicas": 2, "tolerance": 1.5}, "autoscaler.tolerance"),
])
def test_invalid_options(options: dict[str, object], problem: str) -> None:
    with pytest.raises(ConfigError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        build_options(TargetOptions, options, "autoscaler")
