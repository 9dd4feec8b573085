"""Event rates, written by one thread and read by any: a decaying average of recent events, and
the rate the last events were spaced at."""

from __future__ import annotations

import math
from collections import deque


class EventRate:
    """Events per second, exponentially averaged over ``window_s`` and decayed to the time asked."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._last = (0.0, 0.0)  # (when, rate then): one tuple, swapped atomically

    def add(self, now: float) -> None:
        """Count one event at ``now``."""
        self._last = (now, self.at(now) + 1 / self.window_s)

    def at(self, now: float) -> float:
        """The rate at ``now``: 0 before any event, falling towards 0 while none comes."""
        when, rate = self._last
        return rate * math.exp(-max(now - when, 0.0) / self.window_s)


class SpacedRate:
    """Events per second as the last ``span`` events were spaced; None until ``minimum`` have come.
    It does not decay while none come, so a burst after a quiet spell meets the rate last sustained."""

    def __init__(self, span: int = 16, minimum: int = 4) -> None:
        self.minimum = minimum
        self._times: deque[float] = deque(maxlen=span)

    def add(self, now: float) -> None:
        self._times.append(now)

    def rate(self) -> float | None:
        times = list(self._times)
        if len(times) < self.minimum or times[-1] <= times[0]:
            return None
        return (len(times) - 1) / (times[-1] - times[0])
