"""Each limiter on the same bursty trace against the exact moving window.

The trace (:func:`~lamina_admission.burst_trace.burst_trace`): 10 s of a steady 80 requests/s,
evenly spaced, plus a burst of 500 requests within 50 ms every 2 s from t = 1 s; one key;
the limit is 100 per 1 s window. The token bucket gets rate 100/s and capacity 20 (a fifth
of a second's rate: bursts of 20 at once, and never more than 120 in any 1 s window).
"""

from collections.abc import Callable

import pytest

from lamina_hookspecs.protocols import RateLimiter
from lamina_admission.burst_trace import (
    SimulatedClock, burst_trace, disagreement, exact_moving_window, limits_on_clock, max_in_window, replay,
)
from lamina_admission.shared_limit import SharedLimit
from lamina_admission.sliding_window import SlidingWindow
from lamina_admission.token_bucket import TokenBucket

LIMIT = 100
CAPACITY = 20
TIMES = burst_trace()
EXACT = exact_moving_window(TIMES, LIMIT)

LIMITERS: dict[str, Callable[[], RateLimiter]] = {
    "token-bucket": lambda: TokenBucket(capacity=CAPACITY, rate=LIMIT),
    "sliding-window": lambda: SlidingWindow(limit=LIMIT, window_s=1.0, slices=10),
    "shared-limit moving-window": lambda: SharedLimit(limit=LIMIT, window_s=1, strategy="moving-window"),
    "shared-limit sliding-window-counter": lambda: SharedLimit(limit=LIMIT, window_s=1,
                                                                 strategy="sliding-window-counter"),
}


def decide(name: str) -> list[bool]:
    clock = SimulatedClock()
    with limits_on_clock(clock):  # the shared limits read the trace's time; the others take `now`
        return replay(LIMITERS[name](), TIMES, clock=clock)


def test_the_reference_is_exact() -> None:
    assert len(TIMES) == 800 + 5 * 500
    assert max_in_window(TIMES, EXACT) == LIMIT
    assert max_in_window(TIMES, [True] * len(TIMES)) >= 580  # the trace asks for 5.8 times the limit


@pytest.mark.parametrize("name", list(LIMITERS))
def test_never_admits_more_than_the_limit_plus_the_bucket_in_any_window(name: str) -> None:
    decisions = decide(name)
    worst = max_in_window(TIMES, decisions)
    rate = disagreement(decisions, EXACT)
    print(f"{name}: admitted {sum(decisions)} of {len(TIMES)} (exact {sum(EXACT)}), "
          f"disagrees on {rate:.2%}, at most {worst} in any 1 s")
    assert worst <= LIMIT + CAPACITY


def test_sliding_window_agrees_with_the_exact_window_on_98_percent() -> None:
    assert disagreement(decide("sliding-window"), EXACT) <= 0.02


def test_fixed_window_admits_up_to_twice_the_limit_across_a_boundary() -> None:
    """Why ``fixed-window`` is not the default: a burst straddling a window boundary passes twice."""
    clock = SimulatedClock()
    with limits_on_clock(clock):
        decisions = replay(SharedLimit(limit=LIMIT, window_s=1, strategy="fixed-window"), TIMES, clock=clock)
    assert max_in_window(TIMES, decisions) > 1.5 * LIMIT
