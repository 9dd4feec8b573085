import random

import pytest
from lamina.testing.contracts import BatchingPolicyContract
from lamina_hookspecs.types import SchedulerState

from lamina_autoscale.adaptive_batching import Adaptive, AdaptiveOptions
from lamina_autoscale.batching import Fixed, FixedOptions


class TestFixedContract(BatchingPolicyContract):
    registered_name = "fixed"
    options = {"window_s": 0.05, "max_prefills": 4}


class TestAdaptiveContract(BatchingPolicyContract):
    registered_name = "adaptive"
    options = {"w_min_s": 0.01, "w_max_s": 0.3, "target_latency_s": 0.2}


def state(waiting: int, oldest_wait_s: float, *, running: int = 0, max_batch: int = 32, qps: float = 20.0,
          now: float = 0.0) -> SchedulerState:
    return SchedulerState(now=now, waiting=waiting, running=running, max_batch=max_batch,
                          oldest_wait_s=oldest_wait_s, arrival_rate=qps)


def test_fixed_holds_up_to_w_for_up_to_b() -> None:
    policy = Fixed(FixedOptions(window_s=0.05, max_prefills=4))
    assert policy.wait_s(state(1, 0.0)) == pytest.approx(0.05)
    assert policy.wait_s(state(3, 0.02)) == pytest.approx(0.03), "the window runs from the oldest arrival"
    assert policy.wait_s(state(3, 0.05)) == policy.wait_s(state(1, 7.0)) == 0.0, "W has passed"
    assert policy.wait_s(state(4, 0.0)) == 0.0, "B are waiting: nothing more to gather"
    assert policy.wait_s(state(2, 0.0, running=30)) == 0.0, "the batch has room for only 2"
    assert all(policy.max_prefills(state(n, 0.0)) == 4 for n in (1, 4, 40))
    policy.observe(9.0, state(1, 0.0))
    assert policy.wait_s(state(1, 0.0)) == pytest.approx(0.05), "feedback does not move a fixed window"


def test_options_refuse_inverted_bounds() -> None:
    with pytest.raises(ValueError, match="w_min_s"):
        AdaptiveOptions(w_min_s=0.3, w_max_s=0.1)


def steady_latency(window_s: float, qps: float, max_prefills: int, rng: random.Random) -> float:
    """A deterministic model of one executor: a window gathers ``1 + qps·w`` requests (at most B);
    prefilling b costs 30 ms + 5 ms each, so bigger batches leave less load queueing; ±5% noise."""
    batch = min(max_prefills, 1 + qps * window_s)
    gather = (batch - 1) / qps
    service = 0.030 + 0.005 * batch
    utilisation = min(qps * service / batch, 0.95)
    return (gather + service / (1 - utilisation)) * rng.uniform(0.95, 1.05)


def run_adaptive(options: AdaptiveOptions, qps: float, steps: int = 3000) -> list[float]:
    policy, rng = Adaptive(options), random.Random(42)
    windows = []
    for t in range(steps):
        now = t / qps
        policy.observe(steady_latency(policy.window_s, qps, options.max_prefills, rng),
                       state(1, 0.0, qps=qps, now=now))
        windows.append(policy.window_s)
    return windows


@pytest.mark.parametrize("qps", [8.0, 20.0, 40.0])
def test_adaptive_window_converges_under_steady_load_and_stays_in_bounds(qps: float) -> None:
    options = AdaptiveOptions(w_min_s=0.005, w_max_s=0.4, w_init_s=0.4, target_latency_s=0.2, max_prefills=16)
    windows = run_adaptive(options, qps)
    assert all(options.w_min_s <= w <= options.w_max_s for w in windows)
    tail = windows[-300:]
    assert max(tail) - min(tail) < 0.025 * (options.w_max_s - options.w_min_s), "the last 300 lie in a narrow band"
    settled = sum(tail) / len(tail)
    mean_latency = sum(steady_latency(settled, qps, 16, random.Random(i)) for i in range(200)) / 200
    assert mean_latency == pytest.approx(0.2, rel=0.05), "it settles where the latency meets the target"


@pytest.mark.parametrize(("target", "bound"), [(0.01, "w_min_s"), (5.0, "w_max_s")])
def test_an_unreachable_target_pins_the_window_to_a_bound(target: float, bound: str) -> None:
    options = AdaptiveOptions(w_min_s=0.01, w_max_s=0.1, target_latency_s=target)
    windows = run_adaptive(options, 20.0, steps=500)
    assert all(0.01 <= w <= 0.1 for w in windows)
    assert windows[-1] == getattr(options, bound)


def test_steps_are_clipped_and_idle_load_does_not_move_it() -> None:
    options = AdaptiveOptions(w_min_s=0.0, w_max_s=1.0, w_init_s=0.5, max_step_s=0.01, eta0=100.0)
    policy = Adaptive(options)
    policy.observe(100.0, state(1, 0.0, qps=1000.0))
    assert policy.window_s == pytest.approx(0.49)
    policy.observe(100.0, state(1, 0.0, qps=0.0))
    assert policy.window_s == pytest.approx(0.49)
    assert policy.wait_s(state(1, 0.09)) == pytest.approx(0.4)
