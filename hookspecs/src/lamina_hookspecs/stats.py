"""The one percentile definition every figure of Lamina uses: the live pool's TTFT p95, the
autoscaling replay's, canary verdicts, autoscalers, ``lamina bench`` and the benchmarks."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float, *, presorted: bool = False) -> float | None:
    """The ``q``-th percentile (0-100) of ``values``, interpolated linearly between the order
    statistics (numpy's default, ``statistics.quantiles(method="inclusive")``); ``None`` if there
    are none. ``presorted`` skips the sort of values already in order (a numpy array too)."""
    if len(values) == 0:
        return None
    data = values if presorted else sorted(values)
    pos = (len(data) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return float(data[lo] + (data[hi] - data[lo]) * (pos - lo))
