"""Canary rules: enough requests, warm-up skipped, error and latency limits."""

from __future__ import annotations

from lamina.kernel.pool_tables import CanaryConfig
from lamina.pool.canary import judge

CONFIG = CanaryConfig(min_requests=10, warmup_requests=2, max_error_rate_increase=0.05, max_ttft_p95_ratio=1.5)
STABLE = [(False, 0.1)] * 100


def test_waits_for_enough_requests_after_warm_up() -> None:
    assert judge(CONFIG, [(False, 0.1)] * 11, STABLE) is None, "two warm-up requests leave nine"
    assert judge(CONFIG, [(False, 0.1)] * 12, STABLE).promote


def test_cold_first_requests_are_not_judged() -> None:
    verdict = judge(CONFIG, [(False, 5.0)] * 2 + [(False, 0.1)] * 10, STABLE)
    assert verdict is not None and verdict.promote


def test_rolls_back_on_errors_or_latency() -> None:
    errors = judge(CONFIG, [(False, 0.1)] * 2 + [(True, 0.1)] * 2 + [(False, 0.1)] * 18, STABLE)
    assert errors is not None and not errors.promote and "5xx share +10.00%" in errors.reason
    slow = judge(CONFIG, [(False, 0.1)] * 2 + [(False, 0.2)] * 20, STABLE)
    assert slow is not None and not slow.promote and "TTFT p95 x2.00" in slow.reason
