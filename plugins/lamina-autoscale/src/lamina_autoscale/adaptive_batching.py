"""The ``adaptive`` batching policy (DBS-Adapt): a window that follows a latency target.

Like ``fixed`` it holds new prefills until B requests wait or the oldest has waited the window
w; after each step that started requests it moves w by a clipped gradient step toward the
target, scaled by the load and with a decaying step size::

    η_t = eta0 / (1 + decay·t)
    w  ← clamp(w − clip(η_t·(latency − target)·qps/qps0, ±max_step_s), w_min_s, w_max_s)

Over target the window shrinks (requests start sooner); under it, it grows (bigger, cheaper
batches). ``latency`` is the scheduler's feedback: the longest time to first token among the
requests that got their first token in the step. The step size decays, so under a steady load
w settles; after a lasting change of load it moves slowly (rebuild the stack to restart it).
"""

from __future__ import annotations

import attrs

from lamina_hookspecs.registration import BuildContext
from lamina_hookspecs.types import SchedulerState
from lamina_autoscale.batching import hold_s

_seconds = [attrs.validators.ge(0.0), attrs.validators.le(10.0)]


@attrs.frozen(kw_only=True)
class AdaptiveOptions:
    """Stack-file options of ``adaptive``."""

    w_min_s: float = attrs.field(default=0.0, validator=_seconds, metadata={"help": "smallest window, seconds"})
    w_max_s: float = attrs.field(default=0.2, validator=_seconds,
                                 metadata={"help": "largest window, seconds"})
    w_init_s: float | None = attrs.field(default=None, validator=attrs.validators.optional(_seconds), metadata={
        "help": "window to start from (default: the middle of [w_min_s, w_max_s]; clamped into it)"})
    target_latency_s: float = attrs.field(default=0.5, validator=attrs.validators.gt(0.0), metadata={
        "help": "time to first token the window steers toward, seconds"})
    eta0: float = attrs.field(default=0.5, validator=attrs.validators.gt(0.0), metadata={
        "help": "initial step size: window seconds per second of latency error, at qps0"})
    decay: float = attrs.field(default=0.01, validator=attrs.validators.ge(0.0), metadata={
        "help": "step-size decay per observation: η_t = eta0 / (1 + decay·t)"})
    qps0: float = attrs.field(default=10.0, validator=attrs.validators.gt(0.0), metadata={
        "help": "arrival rate (requests/s) at which a step is eta0 times the error; steps scale with qps/qps0"})
    max_step_s: float = attrs.field(default=0.02, validator=attrs.validators.gt(0.0), metadata={
        "help": "largest change of the window in one step, seconds (the gradient clip)"})
    max_prefills: int = attrs.field(default=4, validator=attrs.validators.ge(1),
                                    metadata={"help": "most new sequences prefilled together in one step (B)"})

    def __attrs_post_init__(self) -> None:
        if self.w_min_s > self.w_max_s:
            raise ValueError(f"w_min_s ({self.w_min_s}) must not exceed w_max_s ({self.w_max_s})")


@attrs.define
class Adaptive:
    """A batching window moved toward a latency target by decaying, clipped gradient steps."""

    options: AdaptiveOptions
    window_s: float = attrs.field(init=False)
    steps: int = attrs.field(init=False, default=0)

    def __attrs_post_init__(self) -> None:
        o = self.options
        start = (o.w_min_s + o.w_max_s) / 2 if o.w_init_s is None else o.w_init_s
        self.window_s = min(max(start, o.w_min_s), o.w_max_s)

    def wait_s(self, state: SchedulerState) -> float:
        return hold_s(state, self.window_s, self.options.max_prefills)

    def max_prefills(self, state: SchedulerState) -> int:
        return self.options.max_prefills

    def observe(self, latency_s: float, state: SchedulerState) -> None:
        o = self.options
        self.steps += 1
        eta = o.eta0 / (1 + o.decay * self.steps)
        step = eta * (latency_s - o.target_latency_s) * state.arrival_rate / o.qps0
        step = min(max(step, -o.max_step_s), o.max_step_s)
        self.window_s = min(max(self.window_s - step, o.w_min_s), o.w_max_s)


def build_adaptive(options: AdaptiveOptions, context: BuildContext) -> Adaptive:
    """DBS-Adapt: a batching window steered toward a latency target."""
    return Adaptive(options)
