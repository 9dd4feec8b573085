"""The ``sliding-window`` rate limiter: at most ``limit`` units per ``window_s`` seconds per
key, counted in ``slices`` sub-windows (the sliding-window counter).

The exact rule — admit while fewer than ``limit`` units were admitted in the last
``window_s`` seconds — needs every admission's timestamp (a moving window: memory and work
per decision grow with the limit). This limiter keeps only a count per slice of
``window_s / slices`` seconds, in a ring of ``slices + 1`` slots per key, aligned to
multiples of the slice width. At time ``now`` the window ``(now - window_s, now]`` covers the
``slices`` most recent slices whole and the oldest slice in part; that slice's count is
weighted by the fraction of it still inside the window (as if its admissions were spread
evenly over it)::

    estimate = (sum of the newest `slices` slices) + oldest * fraction_inside
    admit iff  estimate + cost <= limit

The sum of the newest slices is kept as a running total, updated as slices age out, so a
decision is O(1) amortised: a key's ring is advanced by one step per slice that passed
since its last decision (at most ``slices + 1`` steps; then it is simply cleared), never
summed. The estimate errs by at most the oldest slice's count, and only where that slice's
admissions were not spread evenly: admissions bunched at the end of the slice are
underweighted as it leaves, so the window can then admit more than ``limit``. On the
bursty trace of ``tests/test_burst_accuracy.py`` (10 slices) it disagrees with the exact
moving window on 0.3% of decisions and never admits more than ``limit`` in any window; on
random traffic with bursts far above the limit it disagreed on 4-5% and admitted up to
about 1.2 x ``limit`` in the worst window. More slices means smaller slices, a closer
estimate and a slightly larger ring per key.

A refusal's ``retry_after_s`` walks the ring forward: the oldest slice drains linearly over
what is left of it, then each next slice over a whole slice width, until ``cost`` fits. That
is the exact time the estimate allows ``cost`` (if nothing else is admitted), checked with
the arithmetic the next call will use, so ``acquire(key, now + retry_after_s)`` with the same
cost is admitted.

A cost above ``limit`` could never pass; it is admitted when the key's window is empty and
counted in full, so the key waits until it has aged out (the long-run rate still holds).

Per-key state is one list ``[slice index, total of the newest slices, ring...]`` in a
:class:`~lamina_admission.limiter_keys.KeyTable` (keys whose window is empty are dropped;
``max_keys`` caps the rest). ``now`` comes from the caller (monotonic seconds): an earlier
``now`` than a key's last slice is counted in that slice.

Safe under asyncio concurrency because ``acquire`` never awaits: core calls it on the event
loop thread, so no lock is needed. Not for use from several threads at once.
"""

from __future__ import annotations

from math import floor

import attrs

from lamina_hookspecs.registration import BuildContext
from lamina_hookspecs.types import RateDecision
from lamina_admission.limiter_keys import ALLOWED, KeyedLimiterOptions, KeyTable


@attrs.frozen(kw_only=True)
class SlidingWindowOptions(KeyedLimiterOptions):
    """Stack-file options of ``sliding-window``."""

    limit: float = attrs.field(validator=attrs.validators.gt(0), metadata={
        "help": "most units each key may use in any window of window_s seconds"})
    window_s: float = attrs.field(default=1.0, validator=attrs.validators.gt(0), metadata={
        "help": "window length in seconds"})
    slices: int = attrs.field(default=10, validator=attrs.validators.ge(1), metadata={
        "help": "counters per window: more is closer to an exact moving window, at a little more "
                "memory per key"})


class SlidingWindow(KeyTable):
    """Sliding-window counters per key; see the module docstring."""

    def __init__(self, *, limit: float, window_s: float = 1.0, slices: int = 10, key_by: str = "tenant",
                 unit: str = "requests", max_keys: int = 1_000_000) -> None:
        if limit <= 0 or window_s <= 0 or slices < 1:
            raise ValueError(f"need limit > 0, window_s > 0, slices >= 1; got {limit}, {window_s}, {slices}")
        super().__init__(max_keys)
        self.key_by = key_by
        self.unit = unit
        self.limit = float(limit)
        self.window_s = float(window_s)
        self.slices = slices
        self._ring = slices + 1  # slots: the `slices` newest slices and the partly-inside oldest one
        self._slice_s = self.window_s / slices
        self._per_s = slices / self.window_s  # slice index = floor(now * _per_s)
        self._empty = (0.0,) * self._ring
        # Fractional costs added to the running total and later subtracted can leave a rounding
        # residue in it; the comparison tolerates one (integer costs are exact).
        self._ceiling = self.limit * (1.0 + 1e-9)

    def acquire(self, key: str, now: float, cost: float = 1.0) -> RateDecision:
        """Count ``cost`` units for ``key`` at ``now`` if the window's estimate leaves room."""
        state = self._table.get(key)
        pos = now * self._per_s
        current = floor(pos)
        if state is None:
            state = self._track(key, [current, 0.0, *self._empty], now)
        else:
            self._table.move_to_end(key)
        ring = self._ring
        last = state[0]
        if current > last:  # slices passed: age them out of the running total
            if current - last >= ring:
                state[1] = 0.0
                state[2:] = self._empty
            else:
                total = state[1]
                for k in range(last + 1, current + 1):
                    total -= state[2 + (k + 1) % ring]  # slice k - slices: now the partly-inside one
                    state[2 + k % ring] = 0.0  # slice k - slices - 1: gone; its slot is slice k's
                state[1] = total
            state[0] = current
        elif current < last:  # an earlier `now` than this key has seen: count it in its last slice
            current = last
            pos = float(last)
        estimate = state[1] + state[2 + (current + 1) % ring] * (current + 1 - pos)
        limit = self.limit
        if estimate + (cost if cost < limit else limit) <= self._ceiling:  # noqa: FURB136 - no min() call here
            state[1] += cost
            state[2 + current % ring] += cost
            return ALLOWED
        return self._refuse(state, now, pos, cost, estimate)

    def _refuse(self, state: list, now: float, pos: float, cost: float, estimate: float) -> RateDecision:  # type: ignore[type-arg]
        limit, current = self.limit, state[0]
        need = min(cost, limit)
        excess = estimate + need - limit  # what must drain out of the window first
        residue = self._ceiling - limit  # an excess within what the ceiling tolerates needs no more draining
        counts = self._oldest_first(state)
        # The oldest slice drains over what is left of it, then each next one over a whole slice.
        fraction = current + 1 - pos
        at = pos  # in slice units
        for count in counts:
            if count:
                inside = count * fraction
                if inside >= excess - residue:  # (a rounding residue is no reason to skip on)
                    at += fraction * (excess / inside if excess < inside else 1.0)
                    break
                excess -= inside
            at += fraction
            fraction = 1.0
        wait = at * self._slice_s - now
        step = 1e-12
        while wait <= 0.0 or self._estimate_at(state, now + wait, counts) + need > self._ceiling:  # rounding
            wait += step
            step *= 2.0
        return RateDecision(allowed=False, retry_after_s=wait, remaining=max(limit - estimate, 0.0))

    def _oldest_first(self, state: list) -> list:  # type: ignore[type-arg]
        """The ring's counts in slice order: slices ``state[0] - slices`` to ``state[0]``."""
        oldest = 2 + (state[0] + 1) % self._ring
        return state[oldest:] + state[2:oldest]

    def _estimate_at(self, state: list, now: float, counts: list | None = None) -> float:  # type: ignore[type-arg]
        """The estimate ``acquire`` would compute at ``now`` if nothing more is admitted, with
        the same floating-point operations in the same order (``counts``: :meth:`_oldest_first`)."""
        if counts is None:
            counts = self._oldest_first(state)
        last = state[0]
        pos = now * self._per_s
        current = floor(pos)
        ahead = current - last  # slices to age out, as acquire() would
        if ahead >= self._ring:
            return 0.0
        total = state[1]
        if ahead > 0:
            for count in counts[1:ahead + 1]:
                total -= count
        elif ahead < 0:
            ahead, current, pos = 0, last, float(last)
        return total + counts[ahead] * (current + 1 - pos)

    def _is_idle(self, state: list, now: float) -> bool:  # type: ignore[type-arg]
        return floor(now * self._per_s) - state[0] >= self._ring


def build_sliding_window(options: SlidingWindowOptions, context: BuildContext) -> SlidingWindow:
    """Sliding-window counter per key: limit per window_s, in slices, weighted oldest slice."""
    return SlidingWindow(limit=options.limit, window_s=options.window_s, slices=options.slices,
                         key_by=options.key_by, unit=options.unit, max_keys=options.max_keys)
