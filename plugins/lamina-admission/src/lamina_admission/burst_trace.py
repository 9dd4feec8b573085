"""A bursty request trace and the exact answer to "was this within the limit", for checking
the rate limiters' accuracy on a simulated clock (``tests/test_burst_accuracy.py`` and
``benchmarks/admission.py`` both use it).

The reference is the exact moving window: a request at ``t`` is admitted iff fewer than
``limit`` requests were admitted in ``(t - window_s, t]``. :func:`max_in_window` measures
what a limiter let through at worst: the most admissions in any window of ``window_s``.

``limits`` reads the wall clock itself; :func:`limits_on_clock` points it (and
``shared-limit``) at a :class:`SimulatedClock` so its strategies can replay the same trace.
"""

from __future__ import annotations

import bisect
import contextlib
from collections import deque
from collections.abc import Iterator, Sequence
from types import ModuleType

import limits.storage.memory
import limits.strategies

from lamina_hookspecs.protocols import RateLimiter
from lamina_admission import shared_limit


def burst_trace(*, duration_s: float = 10.0, steady_per_s: float = 80.0, burst_size: int = 500,
                burst_span_s: float = 0.05, burst_every_s: float = 2.0, first_burst_s: float = 1.0) -> list[float]:
    """Request times: ``steady_per_s`` evenly spaced over ``duration_s``, plus bursts of
    ``burst_size`` evenly spaced over ``burst_span_s`` every ``burst_every_s`` from
    ``first_burst_s``; sorted (at equal times the steady request comes first)."""
    steady = [i / steady_per_s for i in range(round(duration_s * steady_per_s))]
    bursts = []
    start = first_burst_s
    while start < duration_s:
        bursts += [start + burst_span_s * j / burst_size for j in range(burst_size)]
        start += burst_every_s
    return sorted(steady + bursts)


def exact_moving_window(times: Sequence[float], limit: int, window_s: float = 1.0) -> list[bool]:
    """For each request time, whether the exact moving window admits it."""
    admitted: deque[float] = deque()
    decisions = []
    for t in times:
        while admitted and admitted[0] <= t - window_s:
            admitted.popleft()
        ok = len(admitted) < limit
        if ok:
            admitted.append(t)
        decisions.append(ok)
    return decisions


def max_in_window(times: Sequence[float], decisions: Sequence[bool], window_s: float = 1.0) -> int:
    """The most admitted requests in any interval ``(s - window_s, s]``."""
    admitted = [t for t, ok in zip(times, decisions, strict=True) if ok]
    # The busiest interval can be taken to end at an admission.
    return max((i + 1 - bisect.bisect_right(admitted, t - window_s) for i, t in enumerate(admitted)), default=0)


def disagreement(decisions: Sequence[bool], reference: Sequence[bool]) -> float:
    """The fraction of requests decided differently from ``reference``."""
    return sum(a != b for a, b in zip(decisions, reference, strict=True)) / len(reference)


class SimulatedClock:
    """A wall clock that reads ``now``, set by whoever replays a trace."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def time(self) -> float:
        return self.now


def replay(limiter: RateLimiter, times: Sequence[float], *, key: str = "k",
           clock: SimulatedClock | None = None) -> list[bool]:
    """Each request of ``times`` through ``limiter.acquire`` (cost 1, one key); with ``clock``,
    its ``now`` is set to each request's time first (for limiters on :func:`limits_on_clock`)."""
    decisions = []
    for t in times:
        if clock is not None:
            clock.now = t
        decisions.append(limiter.acquire(key, t).allowed)
    return decisions


@contextlib.contextmanager
def limits_on_clock(clock: SimulatedClock) -> Iterator[SimulatedClock]:
    """Within the block, ``limits``' memory storage and strategies and ``shared-limit`` read
    the time from ``clock`` (each reads ``time.time()`` through its module's ``time`` name,
    which is replaced here and restored after)."""
    modules: list[ModuleType] = [limits.storage.memory, limits.strategies, shared_limit]
    saved = [module.time for module in modules]  # type: ignore[attr-defined]
    try:
        for module in modules:
            module.time = clock  # type: ignore[attr-defined]
        yield clock
    finally:
        for module, original in zip(modules, saved, strict=True):
            module.time = original  # type: ignore[attr-defined]
