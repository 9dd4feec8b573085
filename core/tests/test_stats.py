"""The one percentile definition: the live pool's, the replay's, canaries', autoscalers' and benchmarks'."""

from __future__ import annotations

import statistics

import numpy as np
import pytest
from lamina_hookspecs.stats import percentile

from lamina.tools.autoscale_replay import _Waits


def test_percentile_is_linear_interpolation_between_order_statistics() -> None:
    values = [7.0, 1.0, 3.0, 10.0, 4.0]
    for q in range(1, 100):
        assert percentile(values, q) == pytest.approx(statistics.quantiles(values, n=100, method="inclusive")[q - 1])
    assert (percentile(values, 0), percentile(values, 100)) == (1.0, 10.0)
    assert percentile([5.0], 90) == 5.0 and percentile([], 50) is None
    assert percentile(np.array([1.0, 2.0, 3.0, 4.0]), 50, presorted=True) == 2.5


def test_the_replays_interval_p95_is_the_same_percentile() -> None:
    waits = _Waits(slo_wait_s=1.0)
    sample = [0.0, 0.0, 0.3, 0.05, 2.5, 0.9, 0.12, 0.0, 1.7, 0.4]
    waits.add(np.array(sample), interval=True)
    assert waits.interval_p95() == pytest.approx(percentile(sample, 95))
