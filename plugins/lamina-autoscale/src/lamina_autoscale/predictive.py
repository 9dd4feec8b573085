"""The ``predictive`` autoscaler: starts replicas a cold start ahead of the arrival-rate trend.

From the seed design (issue 10, layer 5): it measures each replica's cold-start time, keeps
the warm-up trigger threshold at P90 + 2σ of recent cold starts clamped to a configured range,
and starts a replica when the arrival-rate trend says one will be needed within that time.

* Lead time: ``horizon = clamp(P90 + 2σ, lead_clamp_s)`` of ``snapshot.cold_starts_s`` (P90 by
  linear interpolation, numpy's default; σ the sample standard deviation, 0 for one sample);
  before any cold start is measured, the upper end of the clamp. Starting replicas that far
  ahead has them ready in time for about 97% of cold starts when those are roughly normal.
* Trend: the least-squares slope of the arrival rates this autoscaler saw in the last
  ``window_s`` seconds (0 until it has seen half a window: a pool's first minutes, from idle to
  busy, are no trend); ``predicted = rate + slope × horizon``, never below the rate now.
* Sizing: ``replicas = ceil(rate / per_replica_rate)`` serve now, and
  ``warm = ceil(predicted / per_replica_rate) − replicas`` more start ahead of need. Without a
  ``per_replica_rate`` the rate one replica sustains is derived from utilisation, by Little's
  law: a pool of n replicas at mean KV usage u serving λ req/s sustains λ / (n·u) per replica
  at full use, ``utilisation_target`` of that is its share (smoothed over the decisions where
  0.05 ≤ u ≤ 0.95; a saturated pool says only that capacity is at most that).
* Against flapping (each arrival rate is one interval's count, noisy enough to move ``ceil`` by
  a replica every few decisions), as HPA's stabilisation windows and tolerance: the pool grows
  to the lowest answer of the last ``scale_up_cooldown_s`` (short: the lead time is what makes
  it early), and shrinks only to a count that serves ``rate × (1 + tolerance)`` (a hysteresis
  band), the highest such answer of the last ``scale_down_cooldown_s``, so only after demand has
  stayed lower for that long. Scaling down names the least-loaded replicas in ``drain``.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import attrs

from lamina_hookspecs.registration import BuildContext
from lamina_hookspecs.stats import percentile
from lamina_hookspecs.types import PoolSnapshot, ScaleDecision
from lamina_autoscale._pool import (
    Window, ceil_ratio, check_bounds, cooldown_field, drain_names, floor, max_replicas_field, min_replicas_field,
    tolerance_field,
)

_SMOOTHING = 0.3
"""Weight of the newest per-replica rate sample in the derived estimate (an EWMA)."""


def _check_clamp(instance: object, attribute: attrs.Attribute, value: tuple[float, float]) -> None:
    lo, hi = value
    if not 0 <= lo <= hi:
        raise ValueError(f"must be [low, high] seconds with 0 <= low <= high; got {list(value)}")


@attrs.frozen(kw_only=True)
class PredictiveOptions:
    """Stack-file options of ``predictive``."""

    per_replica_rate: float | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.gt(0.0)), metadata={
            "help": "requests/s one replica sustains at the load you want it to run at; "
                    "unset: derived from KV usage and utilisation_target"})
    utilisation_target: float = attrs.field(
        default=0.8, validator=[attrs.validators.gt(0.0), attrs.validators.le(1.0)], metadata={
            "help": "without per_replica_rate: the KV usage (0..1] a replica should run at"})
    min_replicas: int = min_replicas_field()
    max_replicas: int = max_replicas_field()
    lead_clamp_s: tuple[float, float] = attrs.field(default=(10.0, 600.0), validator=_check_clamp, metadata={
        "help": "[low, high] seconds the lead time P90 + 2σ of cold starts is clamped to "
                "(high before any cold start is measured)"})
    window_s: float = attrs.field(default=300.0, validator=attrs.validators.gt(0.0), metadata={
        "help": "seconds of arrival rates the trend (least-squares slope) is fitted over"})
    scale_up_cooldown_s: float = cooldown_field(20.0, "up", "lowest")
    scale_down_cooldown_s: float = cooldown_field(120.0, "down", "highest")
    tolerance: float = tolerance_field("scale down only to a count that serves the rate × (1 + tolerance)")

    def __attrs_post_init__(self) -> None:
        check_bounds(self)


def lead_time(cold_starts_s: Sequence[float], clamp: tuple[float, float]) -> float:
    """P90 + 2σ of the cold starts, within ``clamp``; its upper end when there are none."""
    lo, hi = clamp
    if not cold_starts_s:
        return hi
    sigma = statistics.stdev(cold_starts_s) if len(cold_starts_s) > 1 else 0.0
    p90 = percentile(cold_starts_s, 90)
    assert p90 is not None
    return min(max(p90 + 2 * sigma, lo), hi)


def slope(points: Sequence[tuple[float, float]]) -> float:
    """The least-squares slope of ``(t, y)`` points; 0 for fewer than two distinct times."""
    if len(points) < 2:
        return 0.0
    mean_t = sum(t for t, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    spread = sum((t - mean_t) ** 2 for t, _ in points)
    if spread == 0:
        return 0.0
    return sum((t - mean_t) * (y - mean_y) for t, y in points) / spread


class Predictive:
    """Sizes the pool for the arrival rate now and warms replicas for the rate one lead time
    ahead; see the module docstring."""

    def __init__(self, options: PredictiveOptions) -> None:
        self.options = options
        self._rates: Window[float] = Window(options.window_s)
        self._answers: Window[tuple[int, int]] = Window(options.scale_down_cooldown_s)
        self._ups: Window[tuple[int, int]] = Window(options.scale_up_cooldown_s)
        self._estimate: float | None = None

    def per_replica_rate(self, snapshot: PoolSnapshot) -> float | None:
        """The configured rate, or the derived estimate after this snapshot (``None``: no load seen yet)."""
        if self.options.per_replica_rate is not None:
            return self.options.per_replica_rate
        usage, serving = snapshot.kv_usage, len(snapshot.backends)
        if serving and snapshot.arrival_rate > 0 and usage >= 0.05:
            sample = snapshot.arrival_rate / (serving * usage) * self.options.utilisation_target
            if usage <= 0.95 and not snapshot.queue_depth:
                self._estimate = sample if self._estimate is None else (
                    _SMOOTHING * sample + (1 - _SMOOTHING) * self._estimate)
            elif self._estimate is None or sample < self._estimate:
                return sample  # saturated: capacity is at most this
        return self._estimate

    def decide(self, snapshot: PoolSnapshot) -> ScaleDecision:
        o = self.options
        rate, current = snapshot.arrival_rate, snapshot.replicas
        self._rates.add(snapshot.now, rate)
        history = list(self._rates)
        trend = slope(history) if history[-1][0] - history[0][0] >= o.window_s / 2 else 0.0
        horizon = lead_time(snapshot.cold_starts_s, o.lead_clamp_s)
        predicted = max(rate, rate + trend * horizon)
        lo = floor(snapshot, o.min_replicas)

        def size(demand: float, headroom: float = 1.0) -> int:
            return min(max(ceil_ratio(demand * headroom / unit) if unit else (current if rate else 0), lo),
                       o.max_replicas)

        unit = self.per_replica_rate(snapshot)
        need, ahead = size(rate), size(predicted)
        # scaling down goes only as far as leaves `tolerance` headroom, and no further than the
        # highest such answer of the cooldown: a rate that wavers by a replica moves nothing
        self._answers.add(snapshot.now, (size(rate, 1 + o.tolerance), size(predicted, 1 + o.tolerance)))
        self._ups.add(snapshot.now, (need, ahead))
        up = self._ups.recent(snapshot.now, o.scale_up_cooldown_s)
        if min(a for _, a in up) > current:
            replicas, target = min(n for n, _ in up), min(a for _, a in up)
        else:
            recent = self._answers.recent(snapshot.now, o.scale_down_cooldown_s)
            target = min(current, max(a for _, a in recent))
            replicas = min(target, max(n for n, _ in recent))
        unit_text = "unknown" if unit is None else f"{unit:.3g}"
        return ScaleDecision(
            replicas=replicas, warm=target - replicas, drain=drain_names(snapshot, target),
            reason=(f"rate {rate:.3g}/s, slope {trend:+.3g}/s², lead {horizon:.0f}s → {predicted:.3g}/s; "
                    f"per replica {unit_text}/s: {need} now, {ahead} ahead; {current} → {target}"))


def build_predictive(options: PredictiveOptions, context: BuildContext) -> Predictive:
    """Arrival-rate trend: warms replicas one cold start (P90 + 2σ) ahead of need."""
    return Predictive(options)
