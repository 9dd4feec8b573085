"""The ``shared-limit`` rate limiter: one limit shared by several gateway replicas, kept in
Redis or Memcached through the ``limits`` library.

Each replica runs the same stack with the same ``storage_uri``; every decision is a ``hit``
on the shared store, so ``limit`` per ``window_s`` holds across the fleet, not per replica.
Keys in the store are ``lamina/<key_by>/<key>/<limit>/<window_s>/second``: replicas share a
count only if they agree on the limit and window.

Strategies (``limits``' own):

* ``moving-window`` — exact: admits while fewer than ``limit`` units were hit in the last
  ``window_s``. The store keeps one entry per unit admitted, so a hit costs O(cost) and
  memory O(limit) per key: fine for requests, costly for large token limits.
* ``sliding-window-counter`` — two counters per key (this window and the previous one,
  aligned to multiples of ``window_s``), the previous weighted by how much of it is still
  inside; O(1) per hit.
* ``fixed-window`` — one counter per aligned window; O(1), but admits up to twice the limit
  across a window boundary.

A refusal's ``retry_after_s`` costs a second round trip (on refusals only) and is the time
until the same cost would pass if nothing else is hit meanwhile, plus a millisecond of slack:

* ``fixed-window``: the window's reset (``get_window_stats``), which frees everything; exact.
* ``moving-window``: ``get_window_stats`` says when the oldest entry leaves, which is exact
  when one unit is all the request lacks (always for requests of cost 1). When it lacks
  more, ``limits`` cannot say when enough leaves; the answer is then ``window_s``, by which
  everything counted now has left (conservative).
* ``sliding-window-counter``: computed from the store's two counters and the time left in
  the current window (``get_sliding_window``), solving ``floor(weighted) + cost <= limit``
  for the first instant it holds; exact. (Not ``get_window_stats``: it only says when one
  unit frees and, at the very start of a window, reports 0 s.)

Differences from the in-process limiters, all from ``limits``:

* **Its own clock.** ``limits`` reads the wall clock (``time.time()``) itself; the ``now``
  passed to :meth:`SharedLimit.acquire` is ignored. Replicas' clocks should agree to well
  within a window (NTP).
* **Blocking I/O on the event loop.** With a network store each ``acquire`` is one blocking
  round trip (two on a refusal) on core's event loop thread: about a network RTT added to
  every request and no other request served meanwhile. Put the store next to the gateways;
  use ``token-bucket`` or ``sliding-window`` when a per-replica limit is acceptable.
* **Whole units.** ``limits`` counts integers: a cost is rounded up, and a cost above
  ``limit`` (which ``limits`` would refuse forever) is charged as ``limit``, i.e. admitted
  only when the key's window is empty.
* **Store failures are not hidden.** If the store is unreachable ``acquire`` raises the
  storage client's error, so the request fails rather than bypassing the limit.
* Memory is bounded by the store (entries expire with their window), hence no ``max_keys``.

``memory://`` works (one process only) and is what the tests use; see
:mod:`lamina_admission.limiter_keys` for why the in-process limiters do not use it.
"""

from __future__ import annotations

import time
from math import ceil, floor
from typing import Literal

import attrs
from limits import RateLimitItemPerSecond
from limits.errors import ConfigurationError
from limits.storage import storage_from_string
from limits.strategies import STRATEGIES

from lamina_hookspecs.errors import ConfigError
from lamina_hookspecs.registration import BuildContext
from lamina_hookspecs.types import RateDecision
from lamina_admission.limiter_keys import ALLOWED, LimiterOptions

NAMESPACE = "lamina"
CLOCK_SLACK_S = 0.001
"""Added to every ``retry_after_s``: ``limits`` counts an entry as inside the window up to
and including its expiry instant, and replicas' clocks differ a little."""

Strategy = Literal["moving-window", "sliding-window-counter", "fixed-window"]


@attrs.frozen(kw_only=True)
class SharedLimitOptions(LimiterOptions):
    """Stack-file options of ``shared-limit``."""

    limit: int = attrs.field(validator=attrs.validators.ge(1), metadata={
        "help": "most units each key may use per window, across all replicas sharing the store"})
    window_s: int = attrs.field(default=1, validator=attrs.validators.ge(1), metadata={
        "help": "window length in whole seconds"})
    strategy: Strategy = attrs.field(default="moving-window", metadata={
        "help": "limits' counting strategy: moving-window (exact), sliding-window-counter (two "
                "weighted counters), fixed-window (one counter per aligned window)"})
    storage_uri: str = attrs.field(default="memory://", metadata={
        "help": "where the counts live, as limits spells it: redis://host:6379, memcached://host:11211, "
                "or memory:// (this process only)"})


class SharedLimit:
    """A ``limits`` strategy over a shared store; see the module docstring."""

    def __init__(self, *, limit: int, window_s: int = 1, strategy: Strategy = "moving-window",
                 storage_uri: str = "memory://", key_by: str = "tenant", unit: str = "requests") -> None:
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}, not {strategy!r}")
        self.key_by = key_by
        self.unit = unit
        self.limit = limit
        self.window_s = window_s
        self.strategy = strategy
        self.storage = storage_from_string(storage_uri)
        self._limiter = STRATEGIES[strategy](self.storage)
        self._item = RateLimitItemPerSecond(limit, window_s, namespace=NAMESPACE)

    def acquire(self, key: str, now: float, cost: float = 1.0) -> RateDecision:
        """Hit the shared store for ``key`` with ``cost`` (rounded up; ``now`` is ignored: ``limits``
        reads the wall clock)."""
        units = min(max(ceil(cost), 1), self.limit)
        if self._limiter.hit(self._item, self.key_by, key, cost=units):
            return ALLOWED
        if self.strategy == "sliding-window-counter":
            wait, remaining = self._counter_wait(key, units)
        else:
            reset, remaining = self._limiter.get_window_stats(self._item, self.key_by, key)
            lacking = units - remaining
            wait = reset - time.time() if lacking <= 1 or self.strategy == "fixed-window" else self.window_s
        return RateDecision(allowed=False, retry_after_s=max(wait, 0.0) + CLOCK_SLACK_S, remaining=remaining)

    def _counter_wait(self, key: str, units: int) -> tuple[float, int]:
        """Seconds until ``units`` pass the sliding-window counter, and the units left now.

        The store weights the previous window's count ``p`` by the fraction of a window left
        until the current one ends (in ``to_end`` s), then the current count ``c`` the same
        way once it has become the previous one. Admitted iff ``floor(weighted) + units <= limit``.
        """
        window = self.window_s
        previous, previous_ttl, current, current_ttl = self.storage.get_sliding_window(  # type: ignore[union-attr]
            self._item.key_for(self.key_by, key), window)
        to_end = current_ttl - window if current_ttl > 0 else previous_ttl
        remaining = max(self.limit - floor(previous * previous_ttl / window + current), 0)
        room = self.limit - units  # what floor(weighted) may be
        if current <= room:  # the previous window's share must drop below room - current + 1
            return (to_end - (room - current + 1) * window / previous if previous else 0.0), remaining
        # only once the current window is the previous one, weighted below room + 1
        return to_end + window - (room + 1) * window / current, remaining


def build_shared_limit(options: SharedLimitOptions, context: BuildContext) -> SharedLimit:
    """A limit shared by gateway replicas through Redis/Memcached (the limits library)."""
    try:
        return SharedLimit(limit=options.limit, window_s=options.window_s, strategy=options.strategy,
                           storage_uri=options.storage_uri, key_by=options.key_by, unit=options.unit)
    except ConfigurationError as exc:
        raise ConfigError("storage_uri", str(exc)) from None
    except NotImplementedError:
        raise ConfigError("strategy", f"{options.strategy} is not supported by the store at "
                                      f"{options.storage_uri}") from None
