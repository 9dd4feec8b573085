"""The ``fixed`` batching policy: hold new prefills up to W seconds to gather up to B of them."""

from __future__ import annotations

import attrs

from lamina_hookspecs.registration import BuildContext
from lamina_hookspecs.types import SchedulerState


def hold_s(state: SchedulerState, window_s: float, max_prefills: int) -> float:
    """What is left of a window opened by the oldest waiting request; 0 once ``max_prefills``
    requests wait, or as many as the batch has room for (waiting longer gathers nothing it can use)."""
    if state.waiting >= min(max_prefills, max(state.max_batch - state.running, 1)):
        return 0.0
    return max(window_s - state.oldest_wait_s, 0.0)


@attrs.frozen(kw_only=True)
class FixedOptions:
    """Stack-file options of ``fixed``."""

    window_s: float = attrs.field(default=0.05, validator=[attrs.validators.ge(0.0), attrs.validators.le(10.0)],
                                  metadata={"help": "longest hold (W) of new prefills, from the oldest arrival"})
    max_prefills: int = attrs.field(default=4, validator=attrs.validators.ge(1),
                                    metadata={"help": "most new sequences prefilled together in one step (B)"})


@attrs.frozen
class Fixed:
    """Holds new prefills until B requests wait or the oldest has waited W."""

    options: FixedOptions

    def wait_s(self, state: SchedulerState) -> float:
        return hold_s(state, self.options.window_s, self.options.max_prefills)

    def max_prefills(self, state: SchedulerState) -> int:
        return self.options.max_prefills

    def observe(self, latency_s: float, state: SchedulerState) -> None:
        """A fixed window ignores feedback."""


def build_fixed(options: FixedOptions, context: BuildContext) -> Fixed:
    """A fixed batching window: wait up to W for B new prefills."""
    return Fixed(options)
