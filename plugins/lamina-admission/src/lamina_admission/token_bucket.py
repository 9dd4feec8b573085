"""The ``token-bucket`` rate limiter: per key, a bucket of ``capacity`` units refilled at
``rate`` units per second.

A new key starts with a full bucket. A request costing ``cost`` passes when the bucket holds
at least ``cost`` and takes it out, so a key may burst ``capacity`` at once and sustain
``rate`` per second: over any ``T`` seconds it is admitted at most ``capacity + rate * T``.
Refill is computed lazily from the time of the key's last decision (one multiply per
decision; no timers).

A refusal's ``retry_after_s`` is the time until the bucket holds ``cost`` again, checked
with the same arithmetic the next call will use, so ``acquire(key, now + retry_after_s)``
with the same cost is admitted if nothing else was taken meanwhile.

Costs above ``capacity`` (a request estimated at more tokens than the bucket holds) could
never pass a plain bucket, and a 429 whose ``Retry-After`` never comes true is worse than
useless. Such a request is admitted when the bucket is full and leaves it in debt (negative):
the key then waits until the debt is repaid, so the long-run rate still holds. Its refusal
says when the bucket will be full.

Per-key state is a two-item list ``[tokens, time]`` in a :class:`~lamina_admission.limiter_keys.KeyTable`
(idle keys, i.e. full buckets, are dropped; ``max_keys`` caps the rest). ``now`` comes from
the caller (monotonic seconds): an earlier ``now`` than a key's last one is read as that
last time (no refill, never a negative one).

Safe under asyncio concurrency because ``acquire`` never awaits: core calls it on the event
loop thread, so no lock is needed. Not for use from several threads at once.
"""

from __future__ import annotations

import attrs

from lamina_hookspecs.registration import BuildContext
from lamina_hookspecs.types import RateDecision
from lamina_admission.limiter_keys import ALLOWED, KeyedLimiterOptions, KeyTable


@attrs.frozen(kw_only=True)
class TokenBucketOptions(KeyedLimiterOptions):
    """Stack-file options of ``token-bucket``."""

    capacity: float = attrs.field(validator=attrs.validators.gt(0), metadata={
        "help": "bucket size: the most units a key may use at once (its burst)"})
    rate: float = attrs.field(validator=attrs.validators.gt(0), metadata={
        "help": "units added back to each key's bucket per second (its sustained rate)"})


class TokenBucket(KeyTable):
    """Token buckets per key; see the module docstring."""

    def __init__(self, *, capacity: float, rate: float, key_by: str = "tenant", unit: str = "requests",
                 max_keys: int = 1_000_000) -> None:
        if capacity <= 0 or rate <= 0:
            raise ValueError(f"capacity and rate must be > 0, not {capacity} and {rate}")
        super().__init__(max_keys)
        self.key_by = key_by
        self.unit = unit
        self.capacity = float(capacity)
        self.rate = float(rate)

    def acquire(self, key: str, now: float, cost: float = 1.0) -> RateDecision:
        """Take ``cost`` units from ``key``'s bucket at ``now`` if it holds them (or, for a cost
        above ``capacity``, if it is full)."""
        state = self._table.get(key)
        if state is None:
            state = self._track(key, [self.capacity, now], now)
        else:
            self._table.move_to_end(key)
        tokens, last = state
        capacity = self.capacity
        if now > last:
            tokens += (now - last) * self.rate
            if tokens > capacity:  # noqa: PLR1730 - no min() call on the hot path
                tokens = capacity
            last = now
        if tokens >= (cost if cost < capacity else capacity):  # noqa: FURB136 - as above
            state[0] = tokens - cost
            state[1] = last
            return ALLOWED
        return self._refuse(state, tokens, cost, now)

    def _refuse(self, state: list, tokens: float, cost: float, now: float) -> RateDecision:  # type: ignore[type-arg]
        capacity, rate = self.capacity, self.rate
        need = min(cost, capacity)
        held, last = state
        wait = (need - tokens) / rate
        if last > now:  # refill starts at the key's last time
            wait += last - now
        step = 1e-12
        # Rounding: make the promise hold with the arithmetic acquire() will use at now + wait
        # (`need` <= capacity, so the cap at capacity plays no part).
        while held + ((now + wait) - last) * rate < need:
            wait += step
            step *= 2.0
        return RateDecision(allowed=False, retry_after_s=wait, remaining=max(tokens, 0.0))

    def _is_idle(self, state: list, now: float) -> bool:  # type: ignore[type-arg]
        return state[0] + (now - state[1]) * self.rate >= self.capacity


def build_token_bucket(options: TokenBucketOptions, context: BuildContext) -> TokenBucket:
    """Token bucket per key: bursts up to capacity, sustained rate per second, lazy refill."""
    return TokenBucket(capacity=options.capacity, rate=options.rate, key_by=options.key_by, unit=options.unit,
                       max_keys=options.max_keys)
