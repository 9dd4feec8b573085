"""Event rates as exponentially decaying averages, written by one thread and read by any."""

from __future__ import annotations

import math


class EventRate:
    """Events per second, exponentially averaged over ``window_s`` and decayed to the time asked."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._last = (0.0, 0.0)  # (when, rate then): one tuple, swapped atomically

    def add(self, now: float, count: float = 1.0) -> None:
        """Count ``count`` events at ``now``."""
        self._last = (now, self.at(now) + count / self.window_s)

    def at(self, now: float) -> float:
        """The rate at ``now``: 0 before any event, falling towards 0 while none comes."""
        when, rate = self._last
        return rate * math.exp(-max(now - when, 0.0) / self.window_s)
