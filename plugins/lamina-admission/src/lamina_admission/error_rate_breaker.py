"""The ``error-rate`` circuit breaker: one circuit per backend.

closed → open when, over the last ``window_s``, at least ``min_requests`` requests ended and
the share that failed (5xx) reached ``failure_rate``; open → half-open after ``cooldown_s``,
when up to ``probes`` requests may go through; half-open → closed on a probe's success, back
to open (a fresh cool-down) on its failure.

Why not a library: ``circuitbreaker`` and ``pybreaker`` open on a count of consecutive
failures and wrap a function call; ``purgatory`` does the same with shareable state. Lamina
needs an error *rate* over a time window, per backend, and learns a request's outcome only
when its stream ends — a decorator around a call cannot see that. The state machine is
thirty lines; the window is a ring of ``slices`` counters, so memory per backend is fixed.
"""

from __future__ import annotations

import math

import attrs

from lamina_hookspecs.registration import BuildContext


@attrs.frozen(kw_only=True)
class ErrorRateBreakerOptions:
    """When a backend's circuit opens and how it recovers."""

    failure_rate: float = attrs.field(
        default=0.5, validator=[attrs.validators.gt(0.0), attrs.validators.le(1.0)],
        metadata={"help": "share of failed (5xx) requests in the window that opens the circuit"})
    min_requests: int = attrs.field(
        default=10, validator=attrs.validators.ge(1),
        metadata={"help": "requests the window must hold before the rate counts"})
    window_s: float = attrs.field(
        default=30.0, validator=attrs.validators.gt(0.0), metadata={"help": "how far back the error rate looks"})
    slices: int = attrs.field(
        default=10, validator=[attrs.validators.ge(1), attrs.validators.le(1000)],
        metadata={"help": "counters the window is kept in (its time resolution)"})
    cooldown_s: float = attrs.field(
        default=10.0, validator=attrs.validators.ge(0.0),
        metadata={"help": "how long an open circuit stays open before probing"})
    probes: int = attrs.field(
        default=1, validator=attrs.validators.ge(1), metadata={"help": "requests let through at once while half-open"})


@attrs.define
class Circuit:
    """One backend's circuit: its state and its windowed counts (``[requests, failures]`` per slice)."""

    slices: list[list[int]]
    state: str = "closed"
    epoch: int = 0
    opened_at: float = 0.0
    probing: int = 0


class ErrorRateBreaker:
    """Opens a backend's circuit on a high error rate; probes it after a cool-down."""

    def __init__(self, options: ErrorRateBreakerOptions) -> None:
        self.options = options
        self._slice_s = options.window_s / options.slices
        self._circuits: dict[str, Circuit] = {}

    def _circuit(self, key: str) -> Circuit:
        circuit = self._circuits.get(key)
        if circuit is None:
            circuit = self._circuits[key] = Circuit(slices=[[0, 0] for _ in range(self.options.slices)])
        return circuit

    def state(self, key: str, now: float) -> str:
        """``closed``, ``open`` or ``half-open`` (an open circuit whose cool-down has passed)."""
        circuit = self._circuits.get(key)
        if circuit is None or circuit.state == "closed":
            return "closed"
        if circuit.state == "open" and now < circuit.opened_at + self.options.cooldown_s:
            return "open"
        return "half-open"

    def retry_after(self, key: str, now: float) -> float | None:
        state = self.state(key, now)
        if state == "closed":
            return None
        circuit = self._circuits[key]
        if state == "open":
            return circuit.opened_at + self.options.cooldown_s - now
        return None if circuit.probing < self.options.probes else self._slice_s

    def started(self, key: str, now: float) -> None:
        if self.state(key, now) == "half-open":
            circuit = self._circuits[key]
            circuit.state, circuit.probing = "half-open", circuit.probing + 1

    def record(self, key: str, ok: bool, now: float) -> None:
        circuit = self._circuit(key)
        if circuit.state == "half-open":
            self._reset(circuit, "closed" if ok else "open", now)
            return
        if circuit.state == "open":
            return  # a request that started before the circuit opened
        counts = self._advance(circuit, now)
        counts[0] += 1
        counts[1] += not ok
        requests = sum(c[0] for c in circuit.slices)
        failures = sum(c[1] for c in circuit.slices)
        if requests >= self.options.min_requests and failures >= self.options.failure_rate * requests:
            self._reset(circuit, "open", now)

    def _advance(self, circuit: Circuit, now: float) -> list[int]:
        """The current slice's counters, after zeroing the slices that left the window."""
        epoch = math.floor(now / self._slice_s)
        n = len(circuit.slices)
        for e in range(max(circuit.epoch + 1, epoch - n + 1), epoch + 1):
            circuit.slices[e % n] = [0, 0]
        circuit.epoch = max(circuit.epoch, epoch)
        return circuit.slices[epoch % n]

    def _reset(self, circuit: Circuit, state: str, now: float) -> None:
        circuit.state, circuit.opened_at, circuit.probing = state, now, 0
        circuit.slices = [[0, 0] for _ in circuit.slices]


def build_error_rate_breaker(options: ErrorRateBreakerOptions, context: BuildContext) -> ErrorRateBreaker:
    """A circuit per backend that opens on a windowed error rate and probes after a cool-down."""
    return ErrorRateBreaker(options)
