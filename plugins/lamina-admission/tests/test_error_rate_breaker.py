"""The error-rate breaker's state machine, on a simulated clock."""

from __future__ import annotations

import pytest
from lamina.testing.contracts import BreakerContract
from lamina_hookspecs.protocols import Breaker

from lamina_admission import ErrorRateBreaker, ErrorRateBreakerOptions


def breaker(**options: float) -> ErrorRateBreaker:
    return ErrorRateBreaker(ErrorRateBreakerOptions(**options))  # type: ignore[arg-type]


def run(b: ErrorRateBreaker, key: str, outcomes: str, start: float, step: float = 0.1) -> float:
    """Send one request per outcome (``o`` ok, ``x`` failed), ``step`` apart; return the time after."""
    now = start
    for outcome in outcomes:
        assert b.retry_after(key, now) is None
        b.started(key, now)
        b.record(key, outcome == "o", now)
        now += step
    return now


def test_opens_on_the_error_rate_once_enough_requests_are_seen() -> None:
    b = breaker(failure_rate=0.5, min_requests=10, window_s=10, cooldown_s=5)
    assert isinstance(b, Breaker)
    now = run(b, "a", "xxxxoooo", 0.0)  # 50% but only 8 requests
    assert b.state("a", now) == "closed"
    now = run(b, "a", "o", now)  # 9 requests, 4 failed
    now = run(b, "a", "x", now)  # 10 requests, 5 failed: 50%
    assert b.state("a", now) == "open"
    assert b.retry_after("a", now) == pytest.approx(4.9), "opened by the 10th request, at t=0.9"
    assert b.retry_after("b", now) is None, "circuits are per backend"


def test_old_outcomes_leave_the_window() -> None:
    b = breaker(failure_rate=0.5, min_requests=4, window_s=10, slices=10)
    now = run(b, "a", "xxx", 0.0)
    now = run(b, "a", "oooo", now + 11)  # the failures are more than 10 s old
    assert b.state("a", now) == "closed"
    run(b, "a", "xxxx", now)
    assert b.state("a", now) == "open"


def test_half_open_lets_probes_through_then_closes_or_reopens() -> None:
    b = breaker(failure_rate=1.0, min_requests=2, cooldown_s=5, probes=1)
    run(b, "a", "xx", 0.0)
    opened = 0.1  # by the second failure
    assert b.state("a", opened) == "open" and b.retry_after("a", opened + 1) == pytest.approx(4.0)
    assert b.retry_after("a", opened + 4.99) is not None
    probe = opened + 5.0
    assert b.state("a", probe) == "half-open" and b.retry_after("a", probe) is None
    b.started("a", probe)
    assert b.retry_after("a", probe) is not None, "only one probe at a time"
    b.record("a", False, probe + 0.5)
    assert b.state("a", probe + 0.5) == "open", "a failed probe re-opens for a fresh cool-down"
    assert b.retry_after("a", probe + 5.4) is not None and b.retry_after("a", probe + 5.5) is None
    b.started("a", probe + 5.5)
    b.record("a", True, probe + 6)
    assert b.state("a", probe + 6) == "closed" and b.retry_after("a", probe + 6) is None


def test_outcomes_of_requests_started_before_the_circuit_opened_are_ignored() -> None:
    b = breaker(failure_rate=1.0, min_requests=2, cooldown_s=5)
    run(b, "a", "xx", 0.0)
    b.record("a", True, 1.0)
    assert b.state("a", 1.0) == "open"


class TestErrorRateContract(BreakerContract):
    registered_name = "error-rate"
