"""Helpers the autoscalers share: picking replicas to drain and time windows of recent answers."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator
from typing import Any, Generic, TypeVar

import attrs

from lamina_hookspecs.types import PoolSnapshot

T = TypeVar("T")
_EPS = 1e-6  # seconds: a window's ends survive float rounding of snapshot.now


def drain_names(snapshot: PoolSnapshot, target: int) -> tuple[str, ...]:
    """The least-loaded serving replicas to drain when the pool shrinks to ``target``
    (fewest outstanding requests, then queue, then name); empty when it does not shrink."""
    surplus = min(snapshot.replicas - target, len(snapshot.backends))
    if surplus <= 0:
        return ()
    ranked = sorted(snapshot.backends, key=lambda b: (b.outstanding_requests, b.queue_depth, b.name))
    return tuple(b.name for b in ranked[:surplus])


class Window(Generic[T]):
    """Values stamped with ``snapshot.now``, keeping those of the last ``span_s`` seconds,
    ``[now - span_s, now]`` (the newest always, whatever its age)."""

    def __init__(self, span_s: float) -> None:
        self.span_s = span_s
        self._items: deque[tuple[float, T]] = deque()

    def add(self, now: float, value: T) -> None:
        """Record ``value`` at ``now`` and forget what fell out of the window."""
        self._items.append((now, value))
        while self._items[0][0] < now - self.span_s - _EPS and len(self._items) > 1:
            self._items.popleft()

    def __iter__(self) -> Iterator[tuple[float, T]]:
        return iter(self._items)

    def recent(self, now: float, span_s: float) -> list[T]:
        """The values of ``[now - span_s, now]``, at least the newest."""
        values = [value for t, value in self._items if t >= now - span_s - _EPS]
        return values or [self._items[-1][1]]

    def __len__(self) -> int:
        return len(self._items)


def min_replicas_field() -> Any:
    return attrs.field(default=1, validator=attrs.validators.ge(0), metadata={
        "help": "fewest replicas to keep (at least one while there is traffic)"})


def max_replicas_field() -> Any:
    return attrs.field(validator=attrs.validators.ge(1), metadata={"help": "most replicas to run"})


def cooldown_field(default: float, direction: str, pick: str) -> Any:
    return attrs.field(default=default, validator=attrs.validators.ge(0.0), metadata={
        "help": f"scale {direction} to the {pick} recommendation of this many seconds"})


def tolerance_field(help: str) -> Any:
    return attrs.field(default=0.1, validator=[attrs.validators.ge(0.0), attrs.validators.lt(1.0)],
                       metadata={"help": help})


def check_bounds(options: Any) -> None:
    """For an options class's ``__attrs_post_init__``: ``min_replicas <= max_replicas``."""
    if options.max_replicas < options.min_replicas:
        raise ValueError(f"max_replicas ({options.max_replicas}) is below min_replicas ({options.min_replicas})")


def floor(snapshot: PoolSnapshot, min_replicas: int) -> int:
    """The fewest replicas allowed now: ``min_replicas``, and one while there is traffic."""
    busy = snapshot.arrival_rate > 0 or any(b.outstanding_requests for b in snapshot.backends)
    return max(min_replicas, 1 if busy else 0)


def ceil_ratio(value: float) -> int:
    """``ceil`` that ignores float noise (``ceil(3.0000000001)`` is 3, not 4)."""
    return math.ceil(value - 1e-9)
