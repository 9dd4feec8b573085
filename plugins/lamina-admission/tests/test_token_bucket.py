import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lamina.kernel.options import build_options, describe
from lamina.testing.contracts import RateLimiterContract
from lamina_hookspecs.errors import ConfigError
from lamina_admission.token_bucket import TokenBucket, TokenBucketOptions


class TestTokenBucketContract(RateLimiterContract):
    registered_name = "token-bucket"
    options = {"capacity": 10, "rate": 5}


class TestTokenBucketTokensContract(RateLimiterContract):
    registered_name = "token-bucket"
    options = {"capacity": 4000, "rate": 1000.5, "key_by": "api_key", "unit": "tokens", "max_keys": 10}


def test_bursts_capacity_then_refills_at_rate() -> None:
    bucket = TokenBucket(capacity=10, rate=5)
    assert all(bucket.acquire("a", 100.0).allowed for _ in range(10))
    refused = bucket.acquire("a", 100.0)
    assert not refused.allowed and refused.retry_after_s == pytest.approx(0.2) and refused.remaining == 0
    assert sum(bucket.acquire("a", 101.0).allowed for _ in range(10)) == 5  # 1 s refilled 5
    assert sum(bucket.acquire("a", 200.0).allowed for _ in range(20)) == 10  # never above capacity


def test_costs_above_one() -> None:
    bucket = TokenBucket(capacity=10, rate=2, unit="tokens")
    assert bucket.acquire("a", 0.0, cost=4).allowed
    assert bucket.acquire("a", 0.0, cost=4).allowed
    refused = bucket.acquire("a", 0.0, cost=4)  # 2 left, 2 missing at 2/s
    assert not refused.allowed and refused.retry_after_s == pytest.approx(1.0)
    assert bucket.acquire("a", 0.0, cost=2).allowed  # a smaller cost still fits


def test_cost_above_capacity_passes_a_full_bucket_and_leaves_debt() -> None:
    bucket = TokenBucket(capacity=10, rate=5, unit="tokens")
    assert bucket.acquire("a", 0.0, cost=25).allowed  # full: admitted, 15 in debt
    refused = bucket.acquire("a", 1.0, cost=1)  # debt 10 left after 1 s
    assert not refused.allowed and refused.retry_after_s == pytest.approx(2.2)
    refused = bucket.acquire("a", 1.0, cost=25)  # waits for a full bucket: 20 more tokens
    assert not refused.allowed and refused.retry_after_s == pytest.approx(4.0)
    assert bucket.acquire("a", 5.0, cost=25).allowed


@settings(max_examples=200, deadline=None)
@given(capacity=st.floats(0.5, 1e4), rate=st.floats(1e-3, 1e6),
       steps=st.lists(st.tuples(st.floats(0, 2), st.floats(0.01, 2e4)), min_size=1, max_size=60),
       start=st.floats(0, 1e7))
def test_retry_after_is_exactly_when_the_cost_fits(capacity: float, rate: float, steps: list[tuple[float, float]],
                                                   start: float) -> None:
    bucket = TokenBucket(capacity=capacity, rate=rate)
    now = start
    for dt, cost in steps:
        now += dt
        decision = bucket.acquire("k", now, cost)
        if not decision.allowed:
            assert decision.retry_after_s > 0
            early = TokenBucket(capacity=capacity, rate=rate)  # probe a copy: acquire mutates
            early._table["k"] = list(bucket._table["k"])
            if decision.retry_after_s * 1e-3 > 1e4 * math.ulp(now):  # earlier is representable
                assert not early.acquire("k", now + decision.retry_after_s * 0.999, cost).allowed
            now += decision.retry_after_s
            assert bucket.acquire("k", now, cost).allowed


def test_keys_are_independent() -> None:
    bucket = TokenBucket(capacity=1, rate=1)
    assert bucket.acquire("a", 0.0).allowed and not bucket.acquire("a", 0.0).allowed
    assert bucket.acquire("b", 0.0).allowed


def test_earlier_now_never_drains_the_bucket() -> None:
    bucket = TokenBucket(capacity=2, rate=1)
    assert bucket.acquire("a", 10.0).allowed
    assert bucket.acquire("a", 9.0).allowed  # out of order: no refill, no negative refill
    refused = bucket.acquire("a", 9.5)
    assert not refused.allowed and refused.retry_after_s == pytest.approx(1.5)  # until 11.0
    assert bucket.acquire("a", 11.0).allowed


def test_idle_keys_are_dropped_over_a_million_keys() -> None:
    bucket = TokenBucket(capacity=10, rate=100)  # a used key is full (idle) again 10 ms later
    for i in range(1_000_000):  # 100,000 new keys per simulated second: ~1,000 active at once
        bucket.acquire(str(i), i * 1e-5)
    assert bucket.tracked_keys <= 1_100
    assert bucket.forced_evictions == 0


def test_max_keys_caps_active_keys_least_recently_used_first() -> None:
    bucket = TokenBucket(capacity=1, rate=1e-3, max_keys=100)  # nothing goes idle
    for i in range(1000):
        assert bucket.acquire(str(i), 0.0).allowed
    assert bucket.tracked_keys == 100 and bucket.forced_evictions == 900
    assert not bucket.acquire("999", 0.0).allowed  # recent keys keep their state
    assert bucket.acquire("0", 0.0).allowed  # the oldest was forgotten: starts afresh
    bucket.acquire("901", 0.0)  # touched: now the most recently used
    for i in range(1000, 1098):
        bucket.acquire(str(i), 0.0)
    assert not bucket.acquire("901", 0.0).allowed


def test_options_validate_and_document_every_field() -> None:
    options = build_options(TokenBucketOptions, {"capacity": 5, "rate": 2}, "admission.token-bucket")
    assert (options.capacity, options.rate, options.key_by, options.unit, options.max_keys) == (
        5.0, 2.0, "tenant", "requests", 1_000_000)
    with pytest.raises(ConfigError, match=r"admission.token-bucket.rate: .*> 0"):
        build_options(TokenBucketOptions, {"capacity": 5, "rate": 0}, "admission.token-bucket")
    with pytest.raises(ConfigError, match=r"key_by: must be one of"):
        build_options(TokenBucketOptions, {"capacity": 5, "rate": 1, "key_by": "ip"}, "admission.token-bucket")
    with pytest.raises(ConfigError, match="rate"):
        build_options(TokenBucketOptions, {"capacity": 5}, "admission.token-bucket")
    assert all(field["help"] for field in describe(TokenBucketOptions))
