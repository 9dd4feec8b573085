"""What the rate limiters share: their common options and the bounded per-key table.

Every limiter names the key core passes (``key_by``) and what a unit is (``unit``). The two
in-process limiters (``token-bucket``, ``sliding-window``) also keep one small state list per
key in a :class:`KeyTable`, an ``OrderedDict`` in least-recently-used order, whose memory
stays bounded however many distinct keys arrive:

* **Idle keys go.** A key whose state is back to "nothing consumed" (a full bucket, an
  empty window) behaves exactly like a key never seen, so dropping it changes no decision.
  Each time a new key is added, up to :data:`SWEEP` of the least recently used keys are
  dropped if idle; a stream of new keys therefore never grows the table beyond the keys
  still active (plus the few waiting behind an active one at the front).
* **A hard cap.** Beyond ``max_keys`` the least recently used key is dropped even if it is
  not idle (that key then starts afresh, i.e. is treated more leniently);
  :attr:`KeyTable.forced_evictions` counts these, and a growing count means ``max_keys`` is
  below the number of keys active at once.

Why our own in-process limiters rather than the ``limits`` library's memory storage:

* **Cost.** A decision here is a dict lookup and a few float operations on a list. Measured
  by ``benchmarks/admission.py`` (CPython 3.11, a shared 2-core machine, so ±20%): an
  admitted decision on a hot key costs 0.15 µs (token bucket) / 0.23 µs (sliding window)
  against 3.9 µs for ``limits``' sliding-window counter; with 100,000 keys in turn 0.5 µs
  (sliding window) / 1.0 µs (token bucket, which also re-adds each key it forgot as idle)
  against 9.6 µs for ``limits``' moving window; a refusal 0.7 µs / 1.8 µs (0.4 µs of it is
  building the ``RateDecision``) against 1.8 µs. ``limits``' memory storage takes a lock
  per call, runs a timer thread that rescans every key each 10 ms (holding the GIL), and
  its moving window keeps one list entry per admitted unit, inserted at the head: O(limit)
  per hit, ruinous for token limits.
* **Clock.** ``limits`` reads the wall clock itself; ours take ``now`` from the caller, so
  tests and the accuracy checks replay traces on a simulated clock, without sleeping.

``shared-limit`` keeps ``limits`` for what it is for: one limit shared by several gateway
replicas through Redis or Memcached.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Literal

import attrs

from lamina_hookspecs.types import RateDecision

ALLOWED = RateDecision(allowed=True)
"""The one decision returned for every admitted request: building a frozen attrs object per
admission would cost more than the decision itself, so ``remaining`` is left ``None``."""

SWEEP = 2
"""Least recently used keys checked for idleness (and dropped if idle) per new key."""


@attrs.frozen(kw_only=True)
class LimiterOptions:
    """Stack-file options every rate limiter has."""

    key_by: Literal["tenant", "api_key", "client"] = attrs.field(default="tenant", metadata={
        "help": "what a limit applies to: each tenant, each API key, or each client address"})
    unit: Literal["requests", "tokens"] = attrs.field(default="requests", metadata={
        "help": "what is counted: 1 per request, or its estimated prompt tokens plus max_tokens per choice"})


@attrs.frozen(kw_only=True)
class KeyedLimiterOptions(LimiterOptions):
    """Stack-file options of the in-process limiters, which hold per-key state themselves."""

    max_keys: int = attrs.field(default=1_000_000, validator=attrs.validators.ge(1), metadata={
        "help": "most keys tracked at once; beyond it the least recently used key is forgotten "
                "(idle keys are dropped long before)"})


class KeyTable:
    """Per-key state lists in least-recently-used order, bounded as the module says.

    Subclasses look keys up in ``self._table`` themselves on their hot path (``get`` then
    ``move_to_end``), call :meth:`_track` for a key not yet present, and define
    :meth:`_is_idle`.
    """

    def __init__(self, max_keys: int) -> None:
        if max_keys < 1:
            raise ValueError(f"max_keys must be >= 1, not {max_keys}")
        self.max_keys = max_keys
        self.forced_evictions = 0
        self._table: OrderedDict[str, list] = OrderedDict()  # type: ignore[type-arg]

    @property
    def tracked_keys(self) -> int:
        """How many keys hold state now."""
        return len(self._table)

    def _is_idle(self, state: list, now: float) -> bool:  # type: ignore[type-arg]
        """Whether ``state`` at ``now`` is the state of a fresh key."""
        raise NotImplementedError

    def _track(self, key: str, state: list, now: float) -> list:  # type: ignore[type-arg]
        """Add ``key`` with ``state`` as the most recently used key, first dropping idle
        keys at the front and, at the cap, the least recently used one; return ``state``."""
        table = self._table
        for _ in range(SWEEP):
            if not table:
                break
            oldest_key, oldest = next(iter(table.items()))
            if not self._is_idle(oldest, now):
                break
            del table[oldest_key]
        if len(table) >= self.max_keys:
            table.popitem(last=False)
            self.forced_evictions += 1
        table[key] = state
        return state
