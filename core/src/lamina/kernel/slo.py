"""Service-level objectives from the stack file's ``[slo]`` table, and their burn rates.

Each objective is a share of events allowed to be bad (its error budget): "p95 TTFT ≤ 0.5 s"
allows 5% of requests a TTFT over 0.5 s, "error rate ≤ 1%" allows 1% of requests a 5xx.
The burn rate over a window is the bad share in that window divided by the budget: 1 spends
the budget exactly as fast as the SLO allows, 14.4 over 1 h is the Google SRE workbook's
page-now threshold for a 30-day objective. Both the raw counters and the in-process burn
rates are exported, so dashboards may compute their own windows from the counters.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator

import attrs
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from lamina.kernel import metric_names as m

SLICE_S = 10.0
"""Granularity of the rolling windows: events are counted in 10-second slices."""


def _positive(instance: object, attribute: attrs.Attribute[float | None], value: float | None) -> None:
    if value is not None and not value > 0:
        raise ValueError(f"{attribute.name} must be > 0; got {value!r}")


def _windows(instance: object, attribute: attrs.Attribute[tuple[int, ...]], value: tuple[int, ...]) -> None:
    if not value or any(w < SLICE_S for w in value):
        raise ValueError(f"{attribute.name} must list windows of at least {SLICE_S:g} seconds; got {list(value)}")


@attrs.frozen(kw_only=True)
class SloConfig:
    """The ``[slo]`` table; leave an objective out to not track it."""

    ttft_p95_s: float | None = attrs.field(
        default=None, validator=_positive, metadata={"help": "95% of requests get their first token within this"})
    itl_p95_s: float | None = attrs.field(
        default=None, validator=_positive, metadata={"help": "95% of gaps between streamed tokens are within this"})
    error_rate: float | None = attrs.field(
        default=None, validator=[_positive, attrs.validators.optional(attrs.validators.lt(1.0))],
        metadata={"help": "at most this share of requests may fail with a server error (5xx)"})
    windows_s: tuple[int, ...] = attrs.field(
        default=(300, 3600), validator=_windows, metadata={"help": "burn-rate windows, seconds"})


class Objective:
    """One SLO: good/bad event counts in rolling 10-second slices, plus totals since start."""

    def __init__(self, name: str, threshold: float, budget: float, horizon_s: float) -> None:
        self.name, self.threshold, self.budget = name, threshold, budget
        self._slices: deque[list[float]] = deque()  # [slice index, events, bad events], oldest first
        self._keep = int(horizon_s // SLICE_S) + 1
        self.events = self.bad = 0

    def record(self, bad: bool, now: float) -> None:
        index = now // SLICE_S
        if not self._slices or self._slices[-1][0] != index:
            self._slices.append([index, 0, 0])
            while self._slices[0][0] <= index - self._keep:
                self._slices.popleft()
        current = self._slices[-1]
        current[1] += 1
        current[2] += bad
        self.events += 1
        self.bad += bad

    def burn_rate(self, window_s: float, now: float) -> float:
        """Bad share of the events in the last ``window_s`` over the budget (0 with no events)."""
        oldest = now // SLICE_S - window_s // SLICE_S
        events = bad = 0.0
        for index, n, b in reversed(self._slices):
            if index <= oldest:
                break
            events, bad = events + n, bad + b
        return bad / events / self.budget if events else 0.0


def window_label(seconds: int) -> str:
    """``300`` → ``"5m"``, ``3600`` → ``"1h"``, ``45`` → ``"45s"``."""
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


class SloTracker:
    """Counts events against the configured objectives; a Prometheus collector of the results."""

    def __init__(self, config: SloConfig, clock: Callable[[], float]) -> None:
        self.windows = config.windows_s
        self.clock = clock
        horizon = max(config.windows_s)
        self.ttft = self._objective("ttft_p95", config.ttft_p95_s, 0.05, horizon)
        self.itl = self._objective("itl_p95", config.itl_p95_s, 0.05, horizon)
        self.errors = self._objective("error_rate", config.error_rate, config.error_rate, horizon)
        self.objectives = [o for o in (self.ttft, self.itl, self.errors) if o is not None]

    @staticmethod
    def _objective(name: str, threshold: float | None, budget: float | None, horizon: float) -> Objective | None:
        return None if threshold is None or budget is None else Objective(name, threshold, budget, horizon)

    def first_token(self, ttft_s: float) -> None:
        if self.ttft is not None:
            self.ttft.record(ttft_s > self.ttft.threshold, self.clock())

    def gap(self, itl_s: float) -> None:
        if self.itl is not None:
            self.itl.record(itl_s > self.itl.threshold, self.clock())

    def outcome(self, http_status: int) -> None:
        if self.errors is not None:
            self.errors.record(http_status >= 500, self.clock())

    def collect(self) -> Iterator[Metric]:
        if not self.objectives:
            return
        now = self.clock()
        threshold = GaugeMetricFamily(m.SLO_THRESHOLD, "Each SLO's threshold (seconds, or an error share).",
                                      labels=["slo"])
        budget = GaugeMetricFamily(m.SLO_ERROR_BUDGET, "Share of events each SLO allows to be bad.",
                                   labels=["slo"])
        events = CounterMetricFamily(m.SLO_EVENTS, "Events counted against each SLO.", labels=["slo"])
        bad = CounterMetricFamily(m.SLO_BAD_EVENTS, "Events that missed their SLO.", labels=["slo"])
        burn = GaugeMetricFamily(m.SLO_BURN_RATE, "Bad share over the window divided by the error budget "
                                 "(1 = spending the budget exactly as allowed).", labels=["slo", "window"])
        for o in self.objectives:
            threshold.add_metric([o.name], o.threshold)
            budget.add_metric([o.name], o.budget)
            events.add_metric([o.name], o.events)
            bad.add_metric([o.name], o.bad)
            for window in self.windows:
                burn.add_metric([o.name, window_label(window)], o.burn_rate(window, now))
        yield from (threshold, budget, events, bad, burn)

