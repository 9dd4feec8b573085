"""``shared-limit`` on ``limits``' memory storage, with ``limits`` reading a simulated clock
(:func:`~lamina_admission.burst_trace.limits_on_clock`): no sleeps."""

import random
from collections.abc import Iterator
from typing import Any

import pytest

from lamina.kernel.options import build_options, describe
from lamina.kernel.plugins import load_plugins
from lamina.testing.contracts import RateLimiterContract
from lamina_hookspecs import layers
from lamina_hookspecs.errors import ConfigError
from lamina_hookspecs.registration import BuildContext
from lamina_hookspecs.types import RateDecision
from lamina_admission.burst_trace import SimulatedClock, limits_on_clock
from lamina_admission.shared_limit import CLOCK_SLACK_S, SharedLimit, SharedLimitOptions, build_shared_limit


def build(options: dict[str, Any]) -> Any:
    """``shared-limit`` built as a stack builds it: through the installed plugin's entry point."""
    found = load_plugins().registry.get((layers.RATE_LIMITER,), "shared-limit", layers.RATE_LIMITER.key)
    return found.factory(build_options(found.options, options, "admission"), BuildContext(stack_name="test"))


class OnClock:
    """A limiter whose ``limits`` clock reads the ``now`` each ``acquire`` is given."""

    def __init__(self, limiter: SharedLimit, clock: SimulatedClock) -> None:
        self.limiter, self.clock = limiter, clock
        self.key_by, self.unit = limiter.key_by, limiter.unit

    def acquire(self, key: str, now: float, cost: float = 1.0) -> RateDecision:
        self.clock.now = now
        return self.limiter.acquire(key, now, cost)


@pytest.fixture
def clock() -> Iterator[SimulatedClock]:
    with limits_on_clock(SimulatedClock(1000.0)) as clock:
        yield clock


class TestMovingWindowContract(RateLimiterContract):
    registered_name = "shared-limit"
    options = {"limit": 5}

    @pytest.fixture
    def component(self, clock: SimulatedClock) -> OnClock:
        return OnClock(build(self.options), clock)


class TestSlidingWindowCounterContract(TestMovingWindowContract):
    options = {"limit": 5, "window_s": 2, "strategy": "sliding-window-counter"}


class TestFixedWindowContract(TestMovingWindowContract):
    options = {"limit": 5, "strategy": "fixed-window", "unit": "tokens", "key_by": "api_key"}


def test_moving_window_retry_after_is_when_the_oldest_hit_leaves(clock: SimulatedClock) -> None:
    limiter = OnClock(SharedLimit(limit=3, window_s=1), clock)
    for t in (1000.0, 1000.2, 1000.4):
        assert limiter.acquire("a", t).allowed
    refused = limiter.acquire("a", 1000.5)
    assert not refused.allowed and refused.retry_after_s == pytest.approx(0.5 + CLOCK_SLACK_S)
    assert refused.remaining == 0
    assert not limiter.acquire("a", 1000.99).allowed
    assert limiter.acquire("a", 1000.5 + refused.retry_after_s).allowed
    assert limiter.acquire("b", 1000.5).allowed  # keys are independent


def test_a_shortfall_of_more_than_one_unit_waits_out_the_window(clock: SimulatedClock) -> None:
    limiter = OnClock(SharedLimit(limit=10, window_s=2, unit="tokens"), clock)
    assert limiter.acquire("a", 1000.0, cost=8).allowed
    refused = limiter.acquire("a", 1000.5, cost=5)  # limits can only say when 1 unit frees
    assert not refused.allowed and refused.retry_after_s == pytest.approx(2 + CLOCK_SLACK_S)
    assert limiter.acquire("a", 1000.5 + refused.retry_after_s, cost=5).allowed


def test_fixed_window_retry_after_is_the_window_reset(clock: SimulatedClock) -> None:
    limiter = OnClock(SharedLimit(limit=2, window_s=10, strategy="fixed-window"), clock)
    assert limiter.acquire("a", 1000.0).allowed and limiter.acquire("a", 1003.0).allowed
    refused = limiter.acquire("a", 1004.0, cost=2)
    assert not refused.allowed and refused.retry_after_s == pytest.approx(6 + CLOCK_SLACK_S)
    assert limiter.acquire("a", 1004.0 + refused.retry_after_s, cost=2).allowed


@pytest.mark.parametrize("window_s", [1, 3])
def test_sliding_window_counter_retry_after_is_exact(clock: SimulatedClock, window_s: int) -> None:
    limiter = OnClock(SharedLimit(limit=6, window_s=window_s, strategy="sliding-window-counter",
                                  unit="tokens"), clock)
    rng = random.Random(window_s)
    now, refusals = 1000.0, 0
    for _ in range(300):
        cost = rng.choice([1, 1, 2, 3, 6])
        decision = limiter.acquire("a", now, cost)
        if not decision.allowed:
            refusals += 1
            if decision.retry_after_s > 3 * CLOCK_SLACK_S:  # not much earlier: still refused
                assert not limiter.acquire("a", now + decision.retry_after_s - 2 * CLOCK_SLACK_S, cost).allowed
            now += decision.retry_after_s
            assert limiter.acquire("a", now, cost).allowed
        now += rng.choice([0.0, 0.05, 0.3, 1.1]) * window_s
    assert refusals > 50


def test_costs_are_whole_units_and_at_most_the_limit(clock: SimulatedClock) -> None:
    limiter = OnClock(SharedLimit(limit=5, window_s=1, unit="tokens"), clock)
    assert limiter.acquire("a", 1000.0, cost=2.2).allowed  # counted as 3
    assert not limiter.acquire("a", 1000.0, cost=2.5).allowed
    assert limiter.acquire("a", 1000.0, cost=2).allowed
    assert limiter.acquire("b", 1000.0, cost=50).allowed  # above the limit: passes an empty window...
    assert not limiter.acquire("b", 1000.9, cost=1).allowed  # ...and uses all of it
    assert limiter.acquire("b", 1001.01, cost=1).allowed


def test_keys_in_the_store_name_what_they_limit(clock: SimulatedClock) -> None:
    limiter = SharedLimit(limit=3, window_s=1, key_by="api_key")
    limiter.acquire("k1", 0.0)
    assert list(limiter.storage.events) == ["lamina/api_key/k1/3/1/second"]  # type: ignore[attr-defined]


def test_limits_reads_its_own_clock_not_now() -> None:
    limiter = SharedLimit(limit=1, window_s=60)
    assert limiter.acquire("a", 0.0).allowed
    assert not limiter.acquire("a", 1e9).allowed  # a later `now` frees nothing: the wall clock did not move


def test_options_validate_and_document_every_field() -> None:
    options = build_options(SharedLimitOptions, {"limit": 100}, "admission.shared-limit")
    assert (options.window_s, options.strategy, options.storage_uri, options.key_by) == (
        1, "moving-window", "memory://", "tenant")
    with pytest.raises(ConfigError, match=r"window_s: must be an integer"):
        build_options(SharedLimitOptions, {"limit": 100, "window_s": 0.5}, "admission.shared-limit")
    with pytest.raises(ConfigError, match=r"strategy: must be one of"):
        build_options(SharedLimitOptions, {"limit": 100, "strategy": "leaky"}, "admission.shared-limit")
    assert all(field["help"] for field in describe(SharedLimitOptions))


def test_an_unusable_store_is_a_config_error_naming_storage_uri() -> None:
    options = SharedLimitOptions(limit=1, storage_uri="nosuch://x")
    with pytest.raises(ConfigError, match=r"^storage_uri: unknown storage scheme"):
        build_shared_limit(options, BuildContext(stack_name="test"))
