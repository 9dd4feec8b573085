"""The ``target`` autoscaler: keeps one load metric near a target value.

The rule is the Kubernetes Horizontal Pod Autoscaler's (kubernetes.io/docs/tasks/run-application/
horizontal-pod-autoscale, "Algorithm details"): ``desired = ceil(serving × metric / target)``,
the metric averaged over the serving replicas, and no action while ``metric / target`` is within
``1 ± tolerance``. Replicas still starting count as present but add nothing to the average, as
HPA treats not-yet-ready pods, so a scale-up is not repeated while its replicas start.

Against flapping each direction is stabilised over its own window, as HPA's
``behavior.scaleUp/scaleDown.stabilizationWindowSeconds``: the pool grows to the *lowest*
recommendation of the last ``scale_up_cooldown_s`` and shrinks to the *highest* of the last
``scale_down_cooldown_s``. A spike shorter than the up window or a dip shorter than the down
window changes nothing; a lasting step up is followed within one up cooldown, a step down only
after the down cooldown. ``max_step`` caps the replicas one decision adds or removes (HPA's
scaling policies). Scaling down names the least-loaded serving replicas in ``drain``.

Metrics: ``queue_per_replica`` (requests waiting), ``running_per_replica`` (requests being
served), ``kv_usage`` (0..1) and ``arrival_per_replica`` (req/s) are per serving replica and
proportional to the load, so the rule lands on the right count in one step. ``ttft_p95_s`` is
pool-wide and not proportional to the replica count: there the rule is a heuristic that
``max_step`` should temper.
"""

from __future__ import annotations

from typing import Literal

import attrs

from lamina_hookspecs.registration import BuildContext
from lamina_hookspecs.types import PoolSnapshot, ScaleDecision
from lamina_autoscale._pool import (
    Window, ceil_ratio, check_bounds, cooldown_field, drain_names, floor, max_replicas_field, min_replicas_field,
    tolerance_field,
)

Metric = Literal["queue_per_replica", "running_per_replica", "ttft_p95_s", "kv_usage", "arrival_per_replica"]


@attrs.frozen(kw_only=True)
class TargetOptions:
    """Stack-file options of ``target``."""

    metric: Metric = attrs.field(default="running_per_replica", metadata={
        "help": "what to hold near the target: queue_per_replica, running_per_replica, ttft_p95_s, "
                "kv_usage or arrival_per_replica"})
    target: float = attrs.field(validator=attrs.validators.gt(0.0), metadata={
        "help": "the metric's target value (requests, seconds, 0..1 or req/s per replica)"})
    min_replicas: int = min_replicas_field()
    max_replicas: int = max_replicas_field()
    tolerance: float = tolerance_field("no action while metric/target is within 1 ± tolerance")
    scale_up_cooldown_s: float = cooldown_field(30.0, "up", "lowest")
    scale_down_cooldown_s: float = cooldown_field(120.0, "down", "highest")
    max_step: int | None = attrs.field(default=None, validator=attrs.validators.optional(attrs.validators.ge(1)),
                                       metadata={"help": "most replicas one decision adds or removes; unset: no limit"})

    def __attrs_post_init__(self) -> None:
        check_bounds(self)


def metric_value(metric: Metric, snapshot: PoolSnapshot) -> float | None:
    """The metric now, per serving replica where it is a per-replica one; ``None`` when unknown."""
    serving = len(snapshot.backends)
    if metric == "ttft_p95_s":
        return snapshot.ttft_p95_s
    if not serving:
        return None
    if metric == "queue_per_replica":
        return snapshot.queue_depth / serving
    if metric == "running_per_replica":
        return snapshot.running / serving
    if metric == "kv_usage":
        return snapshot.kv_usage
    return snapshot.arrival_rate / serving


class Target:
    """HPA's rule on one metric, stabilised per direction; see the module docstring."""

    def __init__(self, options: TargetOptions) -> None:
        self.options = options
        self._recommendations: Window[int] = Window(max(options.scale_up_cooldown_s, options.scale_down_cooldown_s))

    def decide(self, snapshot: PoolSnapshot) -> ScaleDecision:
        o = self.options
        current, serving = snapshot.replicas, len(snapshot.backends)
        value = metric_value(o.metric, snapshot)
        if value is None and snapshot.arrival_rate == 0 and not snapshot.starting:
            value = 0.0  # an idle pool: nothing to measure, nothing to serve
        if value is None:
            desired, why = current, f"{o.metric} unknown"
        else:
            ratio = value / o.target
            if abs(ratio - 1.0) <= o.tolerance:
                desired, why = current, "within tolerance"
            else:
                desired, why = ceil_ratio(serving * ratio) if serving else current, "ceil(serving × metric/target)"
            why = f"{o.metric} {value:.3g} / target {o.target:g}: {why}"
        lo = floor(snapshot, o.min_replicas)
        desired = min(max(desired, lo), o.max_replicas)
        self._recommendations.add(snapshot.now, desired)
        up = min(self._recommendations.recent(snapshot.now, o.scale_up_cooldown_s))
        down = max(self._recommendations.recent(snapshot.now, o.scale_down_cooldown_s))
        step = o.max_step or o.max_replicas
        if up > current:
            replicas = min(up, current + step)
        elif down < current:
            replicas = max(down, current - step)
        else:
            replicas = current
        replicas = min(max(replicas, lo), o.max_replicas)  # bounds hold even mid-stabilisation
        return ScaleDecision(replicas=replicas, drain=drain_names(snapshot, replicas),
                             reason=f"{why} → {desired}; {current} → {replicas}")


def build_target(options: TargetOptions, context: BuildContext) -> Target:
    """HPA-style: replicas = ceil(serving × metric/target), with a tolerance band and cooldowns."""
    return Target(options)
