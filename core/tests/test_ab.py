"""A/B assignment: deterministic per key and faithful to the weights."""

from __future__ import annotations

from collections import Counter

import pytest
from lamina.kernel.ab import ArmPicker


@pytest.mark.parametrize("weights", [(95, 5), (50, 50), (1, 2, 7), (33.3, 33.3, 33.4)])
def test_assignment_matches_weights_within_one_percent_over_100k_keys(weights: tuple[float, ...]) -> None:
    picker = ArmPicker.from_weights("lamina.router", [(f"arm{i}", w) for i, w in enumerate(weights)])
    counts = Counter(picker.pick(f"tenant-{i}") for i in range(100_000))
    total = sum(weights)
    for i, weight in enumerate(weights):
        assert abs(counts[f"arm{i}"] / 100_000 - weight / total) < 0.01, counts


def test_assignment_is_deterministic_and_salted_by_layer() -> None:
    arms = [("a", 1.0), ("b", 1.0)]
    router, executor = ArmPicker.from_weights("lamina.router", arms), ArmPicker.from_weights("lamina.executor", arms)
    keys = [f"k{i}" for i in range(1000)]
    assert [router.pick(k) for k in keys] == [ArmPicker.from_weights("lamina.router", arms).pick(k) for k in keys]
    same = sum(router.pick(k) == executor.pick(k) for k in keys)
    assert 400 < same < 600, "layers must be assigned independently"
