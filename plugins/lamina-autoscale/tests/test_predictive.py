import math
import random
import statistics

import pytest
from lamina.kernel.options import build_options
from lamina.testing.contracts import AutoscalerContract
from lamina_hookspecs.errors import ConfigError
from lamina_hookspecs.types import BackendState, PoolSnapshot

from lamina_autoscale.predictive import Predictive, PredictiveOptions, lead_time, slope


class TestPredictiveContract(AutoscalerContract):
    registered_name = "predictive"
    options = {"per_replica_rate": 5.0, "max_replicas": 20}


class TestPredictiveDerivedRateContract(AutoscalerContract):
    registered_name = "predictive"
    options = {"max_replicas": 20}


def scaler(**options: object) -> Predictive:
    """5 req/s per replica; scaling up at once unless the test says otherwise."""
    return Predictive(build_options(PredictiveOptions, {"per_replica_rate": 5.0, "max_replicas": 100,
                                                        "lead_clamp_s": [10, 600], "scale_up_cooldown_s": 0,
                                                        **options}, "autoscaler"))


def snap(now: float, rate: float, serving: int = 4, *, cold_starts: tuple[float, ...] = (60.0,) * 5,
         kv: float = 0.0, queue: int = 0) -> PoolSnapshot:
    backends = tuple(BackendState(name=f"r{i}", model="m", queue_depth=queue, outstanding_requests=queue,
                                  kv_blocks_used=round(kv * 100), kv_blocks_total=100) for i in range(serving))
    return PoolSnapshot(now=now, backends=backends, arrival_rate=rate, cold_starts_s=cold_starts)



def test_lead_time_is_p90_plus_two_sigma_clamped() -> None:
    cold = [30.0, 42.0, 35.0, 61.0, 38.0, 33.0, 90.0, 40.0]
    p90 = statistics.quantiles(cold, n=10, method="inclusive")[-1]
    expected = p90 + 2 * statistics.stdev(cold)
    assert lead_time(cold, (0.0, 1000.0)) == pytest.approx(expected)
    assert 105 < expected < 115  # P90 63.9 + 2 × 23.0
    assert lead_time(cold, (0.0, 100.0)) == 100.0
    assert lead_time([1.0, 1.0], (10.0, 100.0)) == 10.0
    assert lead_time([50.0], (10.0, 100.0)) == 50.0  # one sample: σ = 0
    assert lead_time([], (10.0, 100.0)) == 100.0  # nothing measured yet: the upper end


def test_slope_is_least_squares() -> None:
    assert slope([(0.0, 1.0), (10.0, 3.0), (20.0, 5.0)]) == pytest.approx(0.2)
    assert slope([(0.0, 1.0), (10.0, 4.0), (20.0, 3.0)]) == pytest.approx(0.1)
    assert slope([(5.0, 1.0)]) == 0.0 and slope([(5.0, 1.0), (5.0, 2.0)]) == 0.0


def test_rising_trend_warms_before_the_rate_needs_it() -> None:
    s = scaler(window_s=120)
    decisions = [s.decide(snap(10.0 * i, 10.0 + 0.5 * i)) for i in range(13)]  # +0.05 req/s²
    last = decisions[-1]  # 16 req/s now: ceil(16/5) = 4 serve; in 60 s 19 req/s: 4 again
    assert last.replicas == 4 and last.warm == 0
    s = scaler(window_s=120)
    decisions = [s.decide(snap(10.0 * i, 10.0 + 1.0 * i)) for i in range(10)]  # +0.1 req/s²
    last = decisions[-1]  # 19 req/s now: 4 serve; lead 60 s → 25 req/s: 5, one to warm
    assert last.replicas == 4 and last.warm == 1 and last.target == 5
    assert "lead 60s" in last.reason


def test_flat_rate_warms_nothing() -> None:
    s = scaler()
    for i in range(30):
        decision = s.decide(snap(10.0 * i, 19.0))
        assert decision.replicas == 4 and decision.warm == 0


def test_the_lead_follows_cold_starts() -> None:
    rising = [(10.0 * i, 10.0 + 1.0 * i) for i in range(10)]  # 19 req/s, +0.1 req/s²
    targets = {}
    for cold in (5.0, 60.0, 200.0, 2000.0):
        s = scaler(window_s=120, lead_clamp_s=[10, 600])
        for now, rate in rising:
            decision = s.decide(snap(now, rate, cold_starts=(cold,)))
        targets[cold] = decision.target
    # lead 10 (clamped up), 60, 200, 600 (clamped down) s → 20, 25, 39, 79 req/s
    assert targets == {5.0: math.ceil(20 / 5), 60.0: 5, 200.0: math.ceil(39 / 5), 2000.0: math.ceil(79 / 5)}


def test_scale_down_waits_for_the_cooldown() -> None:
    s = scaler(scale_down_cooldown_s=120)
    for i in range(20):
        s.decide(snap(10.0 * i, 40.0, serving=8))
    held = [s.decide(snap(200.0 + 10.0 * i, 10.0, serving=8)) for i in range(14)]
    assert [d.target for d in held[:12]] == [8] * 12  # through 310 s, the 8 of 190 s is in the window
    # then to ceil(10 req/s × 1.1 / 5), keeping the 10% tolerance as headroom
    assert held[13].target == 3 and held[13].drain == ("r0", "r1", "r2", "r3", "r4")


def test_no_trend_before_half_a_window() -> None:
    s = scaler(window_s=300)
    assert s.decide(snap(0.0, 0.0, serving=0)).target == 1
    assert s.decide(snap(10.0, 20.0)).target == 4  # 0 → 20 req/s in 10 s is no trend to extrapolate
    decisions = [s.decide(snap(10.0 * i, 20.0 + i)) for i in range(2, 17)]
    assert all(d.warm == 0 for d in decisions[:12]) and decisions[-1].warm > 0


@pytest.mark.parametrize("seed", range(3))
def test_a_noisy_flat_rate_does_not_flap(seed: int) -> None:
    rng = random.Random(seed)
    s, replicas, history = scaler(scale_up_cooldown_s=20), 5, []
    for i in range(720):  # 2 h around 22 req/s, each interval's count Poisson-noisy (± 7%)
        rate = rng.gauss(220, math.sqrt(220)) / 10
        replicas = s.decide(snap(10.0 * i, rate, serving=replicas)).target
        history.append(replicas)
    changes = sum(1 for a, b in zip(history, history[1:]) if a != b)
    assert changes <= 2 and set(history) <= {5, 6}, history


def test_scale_up_follows_the_lowest_answer_of_the_up_window() -> None:
    s = scaler(scale_up_cooldown_s=20)
    assert s.decide(snap(0.0, 20.0)).target == 4
    assert s.decide(snap(10.0, 30.0)).target == 4  # one high interval: noise until it lasts
    assert s.decide(snap(20.0, 20.0)).target == 4
    assert [s.decide(snap(30.0 + 10 * i, 30.0)).target for i in range(3)] == [4, 4, 6]


def test_scale_up_is_immediate_and_bounded() -> None:
    s = scaler(max_replicas=6, min_replicas=2)
    assert s.decide(snap(0.0, 0.0, serving=0)).target == 2
    assert s.decide(snap(10.0, 100.0, serving=2)).replicas == 6


def test_derives_the_per_replica_rate_from_kv_usage() -> None:
    s = scaler(per_replica_rate=None, utilisation_target=0.8)
    # 4 replicas at 50% KV serve 20 req/s: one at 80% serves 8 → ceil(20 / 8) = 3
    decision = s.decide(snap(0.0, 20.0, kv=0.5))
    assert decision.replicas == 3 and "per replica 8/s" in decision.reason
    # saturated with a queue: the estimate stays (saturation says only "at most 40 / 4 × 0.8")
    assert s.decide(snap(10.0, 40.0, kv=1.0, queue=5)).replicas == 5
    # saturated at 24 req/s: at most 24 / 4 × 0.8 = 4.8 per replica, below the estimate
    assert s.decide(snap(20.0, 24.0, kv=1.0, queue=5)).replicas == 5
    fresh = scaler(per_replica_rate=None)
    assert fresh.decide(snap(0.0, 5.0, kv=0.0)).target == 4  # no usage reported: hold


@pytest.mark.parametrize("options, problem", [
    ({"max_replicas": 2, "min_replicas": 3}, r"max_replicas \(2\) is below min_replicas \(3\)"),
    ({"max_replicas": 2, "lead_clamp_s": [100, 10]}, "autoscaler.lead_clamp_s"),
    ({"max_replicas": 2, "lead_clamp_s": [10]}, "autoscaler.lead_clamp_s: must have 2 items"),
    ({"max_replicas": 2, "per_replica_rate": 0}, "autoscaler.per_replica_rate"),
    ({"max_replicas": 2, "utilisation_target": 1.5}, "autoscaler.utilisation_target"),
])
def test_invalid_options(options: dict[str, object], problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        build_options(PredictiveOptions, options, "autoscaler")
