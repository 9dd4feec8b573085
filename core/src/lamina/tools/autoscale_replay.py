"""``lamina autoscale replay``: an autoscaler against an arrival trace, on a simulated pool.

The policy is built from the plugin registry exactly as a stack file's ``[autoscaler]`` table
builds it (:func:`build_policy`), so the object replayed here is the one a live pool runs.

The pool is simulated in fixed steps (``step_s``, default 0.5 s), vectorised with numpy so a
day of traffic over hundreds of replicas takes seconds:

* Each replica serves at most ``concurrency`` requests at once, each for a service time drawn
  from a lognormal of mean ``service_s`` (``service_sigma`` the σ of its log) or fixed at it.
  A request's TTFT is its wait for a slot plus ``first_token_s``.
* Arrivals wait in one FIFO queue at the gateway, which hands each to the least-loaded replica
  with a free slot (water-filling the free slots). Slots freed within a step take new requests
  from the next step on; a request that finds a free slot starts when it arrives.
* Every ``interval_s`` the policy sees a :class:`PoolSnapshot` (serving replicas with their
  running requests, an even share of the gateway queue as each one's ``queue_depth`` — what
  least-loaded routing to per-replica queues would leave — and KV usage = running/concurrency;
  replicas starting; the arrival rate and TTFT p95 of requests started over the interval; the
  last 20 measured cold starts) and its ``ScaleDecision`` is applied: replicas started take a
  cold start of ``cold_start_s`` × U(1 − jitter, 1 + jitter) before serving; on scale-down the
  ones named in ``drain`` drain first, then starting ones are cancelled, then the least loaded
  drain. A draining replica takes no new requests and stops when its last one ends; scaling up
  again takes draining replicas back before starting new ones.
* Replica-seconds count every replica from its start until it stops (cold start and draining
  included). Requests still queued when the trace ends count with the wait they had so far.

Arrivals come from a trace: ``synthetic:diurnal`` (a day-shaped sine), ``synthetic:bursty``
(a base rate with periodic bursts) and ``synthetic:step`` (low, high, low), each a Poisson
process with options after a colon (``synthetic:step:high_rate=80,duration_s=1800``), or a JSON
file from ``lamina bench`` (the request start times of its first target/level/round) or a JSON
list of arrival times in seconds. Arrivals, service times and cold starts each have their own
random stream from ``seed``, so every policy sees the same arrivals.
"""

from __future__ import annotations

import html
import json
import math
import time
import tomllib
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import attrs
import numpy as np

from lamina_hookspecs import layers
from lamina_hookspecs.errors import ConfigError
from lamina_hookspecs.protocols import Autoscaler
from lamina_hookspecs.registration import BuildContext
from lamina_hookspecs.stats import percentile
from lamina_hookspecs.types import BackendState, PoolSnapshot, ScaleDecision
from lamina.tools.htmlreport import line_svg, page, table
from lamina.kernel.options import build_options
from lamina.kernel.registry import ComponentRegistry
from lamina.kernel.stack import instantiate
from lamina.kernel.stack_config import component_spec

# ---------------------------------------------------------------------------------------------- policy


def build_policy(name: str, options: Mapping[str, Any], registry: ComponentRegistry) -> Autoscaler:
    """The autoscaler ``name`` with ``options``, built as ``[autoscaler] use = name`` would be."""
    spec = component_spec((layers.AUTOSCALER,), {"use": name, **options}, layers.AUTOSCALER.key, registry)
    return instantiate(spec, BuildContext(stack_name="replay"))


def parse_assignments(items: Sequence[str], what: str) -> dict[str, Any]:
    """``KEY=VALUE`` strings into a table; each value read as TOML (``3``, ``0.5``, ``true``,
    ``[10, 600]``, ``"x"``), or taken as a plain string when it is not TOML."""
    table: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(what, f"expected KEY=VALUE; got {item!r}")
        try:
            table[key.strip()] = tomllib.loads(f"v = {value.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            table[key.strip()] = value.strip()
    return table


# ---------------------------------------------------------------------------------------------- traces


def _rate(default: float, help: str) -> Any:
    return attrs.field(default=default, validator=attrs.validators.ge(0.0), metadata={"help": f"requests/s {help}"})


def _seconds(default: float, help: str) -> Any:
    return attrs.field(default=default, validator=attrs.validators.gt(0.0), metadata={"help": help})


@attrs.frozen(kw_only=True)
class DiurnalTrace:
    """``synthetic:diurnal``: a day-shaped sine from ``base_rate`` (at 0 and at the end) to
    ``peak_rate`` (half-way), over one ``period_s`` (default: the whole duration)."""

    peak_rate: float = _rate(100.0, "at the peak")
    base_rate: float = _rate(10.0, "at the trough")
    duration_s: float = _seconds(86400.0, "length of the trace")
    period_s: float | None = attrs.field(default=None, validator=attrs.validators.optional(attrs.validators.gt(0.0)),
                                         metadata={"help": "length of one day; unset: the duration"})

    def rate(self, t: np.ndarray) -> np.ndarray:
        phase = 2 * np.pi * t / (self.period_s or self.duration_s)
        return self.base_rate + (self.peak_rate - self.base_rate) * (1 - np.cos(phase)) / 2


@attrs.frozen(kw_only=True)
class BurstyTrace:
    """``synthetic:bursty``: ``base_rate``, and ``burst_rate`` for ``burst_s`` every ``burst_every_s``
    (the first burst one period in)."""

    base_rate: float = _rate(20.0, "between bursts")
    burst_rate: float = _rate(100.0, "during a burst")
    burst_every_s: float = _seconds(600.0, "seconds from one burst's start to the next")
    burst_s: float = _seconds(60.0, "length of a burst")
    duration_s: float = _seconds(3600.0, "length of the trace")

    def rate(self, t: np.ndarray) -> np.ndarray:
        in_burst = (t >= self.burst_every_s) & (np.mod(t, self.burst_every_s) < self.burst_s)
        return np.where(in_burst, self.burst_rate, self.base_rate)


@attrs.frozen(kw_only=True)
class StepTrace:
    """``synthetic:step``: ``low_rate``, ``high_rate`` over the middle third, ``low_rate`` again."""

    low_rate: float = _rate(10.0, "in the first and last thirds")
    high_rate: float = _rate(60.0, "in the middle third")
    duration_s: float = _seconds(3600.0, "length of the trace")

    def rate(self, t: np.ndarray) -> np.ndarray:
        high = (t >= self.duration_s / 3) & (t < 2 * self.duration_s / 3)
        return np.where(high, self.high_rate, self.low_rate)


SYNTHETIC: dict[str, type] = {"diurnal": DiurnalTrace, "bursty": BurstyTrace, "step": StepTrace}


@attrs.frozen(kw_only=True)
class Trace:
    """Arrivals: a Poisson process of rate ``shape.rate(t)``, or recorded ``times`` (seconds)."""

    name: str
    duration_s: float
    shape: DiurnalTrace | BurstyTrace | StepTrace | None = None
    times: np.ndarray | None = attrs.field(default=None, eq=False, repr=False)

    def mean_rate(self, t0: float, t1: float) -> float:
        """The expected arrival rate over ``[t0, t1)``."""
        if self.shape is not None:
            return float(np.mean(self.shape.rate(np.linspace(t0, t1, 16, endpoint=False))))
        assert self.times is not None
        return float(np.count_nonzero((self.times >= t0) & (self.times < t1))) / (t1 - t0)

    def by_step(self, step_s: float, steps: int, rng: np.random.Generator) -> Iterator[np.ndarray]:
        """The sorted arrival times of each step ``[i·step_s, (i+1)·step_s)``."""
        if self.shape is not None:
            counts = rng.poisson(self.shape.rate((np.arange(steps) + 0.5) * step_s) * step_s)
            for i, n in enumerate(counts.tolist()):
                yield (i + np.sort(rng.random(n))) * step_s
            return
        assert self.times is not None
        edges = np.searchsorted(self.times, np.arange(steps + 1) * step_s)
        for i in range(steps):
            yield self.times[edges[i]:edges[i + 1]]


def parse_trace(spec: str) -> Trace:
    """``synthetic:NAME[:KEY=VALUE,...]``, a ``lamina bench`` JSON result or a JSON list of times."""
    if spec.startswith("synthetic:"):
        name, _, rest = spec.removeprefix("synthetic:").partition(":")
        if name not in SYNTHETIC:
            raise ConfigError("trace", f"no synthetic trace {name!r}; choose one of {', '.join(SYNTHETIC)}")
        options = parse_assignments([item for item in rest.split(",") if item], f"trace {name}")
        shape = build_options(SYNTHETIC[name], options, f"synthetic:{name}")
        described = ", ".join(f"{k}={v:g}" for k, v in attrs.asdict(shape).items() if v is not None)
        return Trace(name=f"synthetic:{name} ({described})", duration_s=shape.duration_s, shape=shape)
    path = Path(spec)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError("trace", f"cannot read {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError("trace", f"{path} is not JSON: {exc}") from None
    name = str(path)
    if isinstance(data, Mapping) and isinstance(data.get("records"), list):
        records = [r for r in data["records"] if not r.get("warmup")]
        if not records:
            raise ConfigError("trace", f"{path} has no (non-warm-up) records")
        first = records[0]
        group = (first.get("target"), first.get("level"), first.get("round"))
        starts = [r["start"] for r in records if (r.get("target"), r.get("level"), r.get("round")) == group]
        name = f"{path} (target {group[0]!r}, load {group[1]!r}, round {group[2]})"
    elif isinstance(data, list):
        starts = data
    else:
        raise ConfigError("trace", f"{path}: expected a lamina bench result (with records) or a list of times")
    try:
        times = np.sort(np.asarray(starts, dtype=float))
    except (TypeError, ValueError):
        raise ConfigError("trace", f"{path}: arrival times must be numbers") from None
    if not len(times) or times[0] < 0:
        raise ConfigError("trace", f"{path}: needs at least one arrival time, none negative")
    return Trace(name=name, duration_s=float(times[-1]) + 1.0, times=times)


# ---------------------------------------------------------------------------------------------- pool


def _positive(instance: Any, attribute: attrs.Attribute, value: float) -> None:
    if not value > 0:
        raise ValueError(f"must be > 0; got {value}")


@attrs.frozen(kw_only=True)
class PoolModel:
    """The simulated pool; each field is a ``lamina autoscale replay`` flag (``--service-s``)."""

    concurrency: int = attrs.field(default=8, validator=attrs.validators.ge(1),
                                   metadata={"help": "requests one replica serves at once"})
    service_s: float = attrs.field(default=4.0, validator=_positive,
                                   metadata={"help": "mean service time of a request, seconds"})
    service_dist: Literal["lognormal", "fixed"] = attrs.field(
        default="lognormal", validator=attrs.validators.in_(("lognormal", "fixed")),
        metadata={"help": "service time distribution"})
    service_sigma: float = attrs.field(default=0.5, validator=attrs.validators.ge(0.0),
                                       metadata={"help": "σ of the log of a lognormal service time"})
    first_token_s: float = attrs.field(default=0.2, validator=attrs.validators.ge(0.0),
                                       metadata={"help": "time from a request's start to its first token"})
    cold_start_s: float = attrs.field(default=60.0, validator=attrs.validators.ge(0.0),
                                      metadata={"help": "mean time from starting a replica to it serving"})
    cold_start_jitter: float = attrs.field(
        default=0.2, validator=[attrs.validators.ge(0.0), attrs.validators.le(1.0)],
        metadata={"help": "cold starts are uniform within ± this fraction of --cold-start-s"})
    interval_s: float = attrs.field(default=10.0, validator=_positive,
                                    metadata={"help": "seconds between decisions", "flag": "--interval"})
    step_s: float = attrs.field(default=0.5, validator=_positive,
                                metadata={"help": "simulation step, seconds (divides --interval)"})
    slo_ttft_s: float = attrs.field(default=2.0, validator=_positive,
                                    metadata={"help": "a request whose TTFT exceeds this violates the SLO"})
    initial_replicas: int | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.ge(0)),
        metadata={"help": "replicas serving at time 0; default: the policy's answer for an idle pool, "
                          "or enough for the trace's opening rate if that is more"})
    seed: int = attrs.field(default=0, metadata={"help": "seed of arrivals, service times and cold starts"})

    def __attrs_post_init__(self) -> None:
        ratio = self.interval_s / self.step_s
        if abs(ratio - round(ratio)) > 1e-9:
            raise ValueError(f"--step-s ({self.step_s}) must divide --interval ({self.interval_s})")

    @property
    def capacity_rate(self) -> float:
        """Requests/s one replica completes when busy."""
        return self.concurrency / self.service_s


_FREE, _STARTING, _SERVING, _DRAINING = 0, 1, 2, 3
_COLD_STARTS_SEEN = 20
_WAIT_BIN = math.log(1.01)  # the wait histogram's bins are 1% wide ...
_WAIT_MIN = 1e-4  # ... from 0.1 ms up
_WAIT_BINS = 2400  # ... to about 2.4e6 s


class _Pool:
    """Replica slots as numpy arrays: state, running requests, when a start ends, and a ring of
    completions per future step (``done[slot, step % horizon]``)."""

    def __init__(self, model: PoolModel, horizon: int, rng: np.random.Generator) -> None:
        self.model, self.horizon, self.rng = model, horizon, rng
        self.state = np.zeros(0, np.int8)
        self.busy = np.zeros(0, np.int64)
        self.started_at = np.zeros(0)
        self.ready_at = np.zeros(0)
        self.done = np.zeros((0, horizon), np.int32)
        self.names: list[str] = []
        self.serials: list[int] = []
        self.slot_of: dict[str, int] = {}
        self.counts = {_STARTING: 0, _SERVING: 0, _DRAINING: 0}
        self.serial = self.cold_starts = 0
        self.measured: deque[float] = deque(maxlen=_COLD_STARTS_SEEN)
        self._free = np.zeros(0, np.int64)
        self._rows = np.zeros(0, np.int64)
        self._states: dict[int, dict[tuple[int, int], BackendState]] = {}
        """Each replica's BackendState per (running, queued), by serial: most repeat between snapshots."""

    @property
    def alive(self) -> int:
        return self.counts[_STARTING] + self.counts[_SERVING] + self.counts[_DRAINING]

    def _set(self, slots: np.ndarray | int, state: int) -> None:
        slots = np.atleast_1d(slots)
        for old in (_STARTING, _SERVING, _DRAINING):
            self.counts[old] -= int(np.count_nonzero(self.state[slots] == old))
        self.state[slots] = state
        if state != _FREE:
            self.counts[state] += len(slots)
        else:
            for slot in slots.tolist():
                del self.slot_of[self.names[slot]]
                self._states.pop(self.serials[slot], None)

    def _new_slot(self) -> int:
        free = np.flatnonzero(self.state == _FREE)
        if len(free):
            return int(free[0])
        grow = max(8, len(self.state))
        self.state = np.concatenate([self.state, np.zeros(grow, np.int8)])
        self.busy = np.concatenate([self.busy, np.zeros(grow, np.int64)])
        self.started_at = np.concatenate([self.started_at, np.zeros(grow)])
        self.ready_at = np.concatenate([self.ready_at, np.zeros(grow)])
        self.done = np.concatenate([self.done, np.zeros((grow, self.horizon), np.int32)])
        self._rows = np.arange(len(self.state)) * self.horizon
        self.names += [""] * grow
        self.serials += [0] * grow
        return len(self.state) - grow

    def start(self, now: float, n: int, *, cold: bool = True) -> None:
        m = self.model
        for _ in range(n):
            slot = self._new_slot()
            self.names[slot], self.serials[slot] = f"replica-{self.serial}", self.serial
            self.slot_of[self.names[slot]] = slot
            self.serial += 1
            self.started_at[slot] = now
            if cold:
                self.ready_at[slot] = now + m.cold_start_s * self.rng.uniform(1 - m.cold_start_jitter,
                                                                                 1 + m.cold_start_jitter)
                self.cold_starts += 1
                self._set(slot, _STARTING)
            else:
                self._set(slot, _SERVING)

    def advance(self, step: int, now: float) -> None:
        """Completions due at this step; then :meth:`settle`."""
        column = self.done[:, step % self.horizon]
        if column.any():
            self.busy -= column
            column[:] = 0
        self.settle(now)

    def settle(self, now: float) -> None:
        """Replicas whose cold start is over serve; draining ones with nothing left stop."""
        if self.counts[_STARTING]:
            ready = np.flatnonzero((self.state == _STARTING) & (self.ready_at <= now + 1e-9))
            if len(ready):
                self.measured.extend((self.ready_at[ready] - self.started_at[ready]).tolist())
                self._set(ready, _SERVING)
        if self.counts[_DRAINING]:
            idle = np.flatnonzero((self.state == _DRAINING) & (self.busy == 0))
            if len(idle):
                self._set(idle, _FREE)

    def room(self) -> int:
        """Free slots on the serving replicas (and remembers them per replica for :meth:`assign`)."""
        self._free = np.where(self.state == _SERVING, self.model.concurrency - self.busy, 0)
        return int(self._free.sum())

    def assign(self, n: int, end_step: np.ndarray) -> None:
        """Start ``n`` requests (at most :meth:`room`) ending at ``end_step``, least-loaded replica
        first: water-filling, every replica's free slots brought down to one level."""
        free = self._free
        counts = np.bincount(free).tolist()  # replicas by free slots
        level, left, above = len(counts) - 1, 0, 0  # left: free slots above `level`, over all replicas
        while level > 0:
            above += counts[level]  # replicas with at least `level` free slots
            if left + above > n:
                break
            left += above
            level -= 1
        take = free - level
        np.maximum(take, 0, out=take)
        if n > left:  # one more on n - left of the replicas at the level
            take[np.flatnonzero(free >= level)[:n - left]] += 1
        self.busy += take
        cells = np.repeat(self._rows[:len(free)], take)
        cells += end_step % self.horizon
        cells.sort()
        ring = self.done.reshape(-1)
        ring[cells] += 1  # once per distinct cell; then once more per repeat
        np.add.at(ring, cells[1:][cells[1:] == cells[:-1]], 1)

    def scale(self, decision: ScaleDecision, now: float) -> None:
        """Move to ``decision.target`` replicas serving or starting."""
        current = self.counts[_SERVING] + self.counts[_STARTING]
        target = decision.target
        if target > current:
            draining = np.flatnonzero(self.state == _DRAINING)
            back = draining[np.argsort(-self.busy[draining], kind="stable")][:target - current]
            if len(back):
                self._set(back, _SERVING)
            self.start(now, target - current - len(back))
            return
        excess = current - target
        named = [self.slot_of[n] for n in dict.fromkeys(decision.drain)
                 if n in self.slot_of and self.state[self.slot_of[n]] == _SERVING][:excess]
        if named:
            self._set(np.array(named), _DRAINING)
            excess -= len(named)
        if excess:
            starting = np.flatnonzero(self.state == _STARTING)
            cancel = starting[np.argsort(-self.ready_at[starting], kind="stable")][:excess]
            if len(cancel):
                self._set(cancel, _FREE)
                excess -= len(cancel)
        if excess:
            serving = np.flatnonzero(self.state == _SERVING)
            self._set(serving[np.argsort(self.busy[serving], kind="stable")][:excess], _DRAINING)

    def _backend(self, slot: int, running: int, queued: int) -> BackendState:
        known = self._states.setdefault(self.serials[slot], {})
        state = known.get((running, queued))
        if state is None:
            state = known[running, queued] = BackendState(
                name=self.names[slot], model="replay", outstanding_requests=running + queued, queue_depth=queued,
                kv_blocks_used=running, kv_blocks_total=self.model.concurrency)
        return state

    def snapshot(self, now: float, queued: int, **traffic: Any) -> PoolSnapshot:
        serving = np.flatnonzero(self.state == _SERVING)
        share, extra = divmod(queued, len(serving)) if len(serving) else (0, 0)
        backends = tuple(self._backend(slot, busy, share + (i < extra))
                         for i, (slot, busy) in enumerate(zip(serving.tolist(), self.busy[serving].tolist())))
        return PoolSnapshot(now=now, backends=backends, starting=self.counts[_STARTING],
                            cold_starts_s=tuple(self.measured), **traffic)


class _Waits:
    """TTFT waits: exact counts of zero waits and of SLO violations, a 1%-bin histogram of the
    others (for percentiles), and the current interval's (for its p95)."""

    def __init__(self, slo_wait_s: float) -> None:
        self.slo_wait_s = slo_wait_s
        self.zero = self.violations = self.interval_zero = 0
        self.histogram = np.zeros(_WAIT_BINS + 1, np.int64)
        self.interval: list[np.ndarray] = []

    def add_zero(self, n: int) -> None:
        self.zero += n
        self.interval_zero += n
        if self.slo_wait_s < 0:
            self.violations += n

    def add(self, waits: np.ndarray, *, interval: bool = True) -> None:
        positive = waits[waits > 0]
        zero = len(waits) - len(positive)
        self.zero += zero
        self.violations += int(np.count_nonzero(waits > self.slo_wait_s))
        if len(positive):
            bins = np.log(np.maximum(positive, _WAIT_MIN) * (1 / _WAIT_MIN)) * (1 / _WAIT_BIN)
            counts = np.bincount(np.minimum(bins, _WAIT_BINS).astype(np.int64))
            self.histogram[:len(counts)] += counts
        if interval:
            self.interval_zero += zero
            self.interval.append(positive)

    def interval_p95(self) -> float | None:
        """The p95 wait of the requests started since the last call (``None``: none started)."""
        waits = np.concatenate([np.zeros(self.interval_zero), *self.interval])
        self.interval, self.interval_zero = [], 0
        return percentile(np.sort(waits), 95, presorted=True)

    def quantile(self, q: float) -> float | None:
        total = self.zero + int(self.histogram.sum())
        if not total:
            return None
        rank = q * (total - 1)
        if rank < self.zero:
            return 0.0
        index = int(np.searchsorted(np.cumsum(self.histogram), rank - self.zero, side="right"))
        return _WAIT_MIN * math.exp((index + 0.5) * _WAIT_BIN)


class _Draws:
    """Service times and rounding noise, drawn a million at a time (one numpy call per step is
    most of a step's cost)."""

    BATCH = 1 << 20

    def __init__(self, model: PoolModel, longest: float, rng: np.random.Generator) -> None:
        self.model, self.longest, self.rng = model, longest, rng
        self.service = self.noise = np.zeros(0)
        self.at = 0

    def take(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """``n`` service times and ``n`` uniforms in [0, 1)."""
        if self.at + n > len(self.service):
            size, m = max(n, self.BATCH), self.model
            if m.service_dist == "fixed":
                service = np.full(size, m.service_s)
            else:
                log_mean = math.log(m.service_s) - m.service_sigma ** 2 / 2
                service = np.minimum(np.exp(log_mean + m.service_sigma * self.rng.standard_normal(size)), self.longest)
            self.service = np.concatenate([self.service[self.at:], service])
            self.noise = np.concatenate([self.noise[self.at:], self.rng.random(size)])
            self.at = 0
        self.at += n
        return self.service[self.at - n:self.at], self.noise[self.at - n:self.at]


def _service_horizon(model: PoolModel) -> tuple[float, int]:
    """The longest service time drawn (lognormals are cut at 4σ above the log-mean, 3e-5 of
    them) and the completion ring's length in steps."""
    if model.service_dist == "fixed":
        longest = model.service_s
    else:
        longest = model.service_s * math.exp(4 * model.service_sigma - model.service_sigma ** 2 / 2)
    return longest, math.ceil(longest / model.step_s) + 3


def simulate(policy: Autoscaler, trace: Trace, model: PoolModel) -> dict[str, Any]:
    """Replay ``trace`` through a simulated pool that ``policy`` scales; returns the summary,
    the timeline (one entry per decision) and the scale events."""
    began = time.perf_counter()
    arrivals_rng, service_rng, cold_rng = map(np.random.default_rng, np.random.SeedSequence(model.seed).spawn(3))
    dt, first_token = model.step_s, model.first_token_s
    per_interval = round(model.interval_s / dt)
    steps = math.ceil(trace.duration_s / dt)
    longest, horizon = _service_horizon(model)
    draws = _Draws(model, longest, service_rng)
    pool = _Pool(model, horizon, cold_rng)
    waits = _Waits(model.slo_ttft_s - first_token)
    queue: deque[np.ndarray] = deque()
    queued = arrived = interval_arrived = started = max_alive = 0
    replica_seconds = 0.0
    timeline: dict[str, list[Any]] = {k: [] for k in ("t", "arrival_rate", "serving", "starting", "draining",
                                                      "target", "queue", "ttft_p95_s")}
    events: list[dict[str, Any]] = []

    first = policy.decide(PoolSnapshot(now=0.0))
    initial = model.initial_replicas
    if initial is None:
        opening = trace.mean_rate(0.0, min(model.interval_s, trace.duration_s))
        initial = max(first.target, math.ceil(opening / model.capacity_rate - 1e-9))
    pool.start(0.0, initial, cold=False)
    last_target = initial

    for step, arrivals in enumerate(trace.by_step(dt, steps, arrivals_rng)):
        now = step * dt
        pool.advance(step, now)
        arrived += len(arrivals)
        interval_arrived += len(arrivals)
        waiting = queued + len(arrivals)
        room = pool.room() if waiting else 0
        if room:
            n = min(room, waiting)
            from_queue = min(n, queued)
            fresh = arrivals[:n - from_queue]
            arrivals = arrivals[n - from_queue:]
            if from_queue:
                parts, taken = [], 0
                while taken < from_queue:
                    head = queue[0]
                    if len(head) <= from_queue - taken:
                        parts.append(queue.popleft())
                    else:
                        parts.append(head[:from_queue - taken])
                        queue[0] = head[from_queue - taken:]
                    taken += len(parts[-1])
                queued -= from_queue
                waited = np.concatenate(parts)
                waits.add(now - waited)
                start = np.concatenate([np.full(from_queue, now), fresh])
            else:
                start = fresh
            waits.add_zero(len(fresh))
            service, noise = draws.take(n)
            end_step = ((start + service) * (1 / dt) + noise).astype(np.int64)  # rounded up or down, unbiased
            np.clip(end_step, step + 1, step + horizon - 1, out=end_step)
            pool.assign(n, end_step)
            started += n
        if len(arrivals):
            queue.append(arrivals)
            queued += len(arrivals)
        alive = pool.alive
        replica_seconds += alive * dt
        max_alive = max(max_alive, alive)

        if (step + 1) % per_interval == 0:
            now = (step + 1) * dt
            pool.settle(now)
            p95 = waits.interval_p95()
            traffic = {"arrival_rate": interval_arrived / model.interval_s,
                       "ttft_p95_s": None if p95 is None else p95 + first_token}
            decision = policy.decide(pool.snapshot(now, queued, **traffic))
            for key, value in (("t", now), ("serving", pool.counts[_SERVING]), ("starting", pool.counts[_STARTING]),
                               ("draining", pool.counts[_DRAINING]), ("target", decision.target),
                               ("queue", queued), *traffic.items()):
                timeline[key].append(value)
            if decision.target != last_target:
                events.append({"t": now, "from": last_target, "to": decision.target, "warm": decision.warm,
                               "drain": list(decision.drain), "reason": decision.reason})
                last_target = decision.target
            pool.scale(decision, now)
            interval_arrived = 0

    end = steps * dt
    if queued:  # never started: count the wait they had so far
        waits.add(end - np.concatenate(list(queue)), interval=False)
    summary = {
        "requests": arrived,
        "started": started,
        "unserved": queued,
        "duration_s": end,
        "replica_seconds": replica_seconds,
        "replica_hours": replica_seconds / 3600,
        "mean_replicas": replica_seconds / end if end else 0.0,
        "max_replicas": max_alive,
        "initial_replicas": initial,
        "cold_starts": pool.cold_starts,
        "scale_events": len(events),
        **{f"ttft_{name}_s": None if (w := waits.quantile(q)) is None else w + first_token
           for name, q in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))},
        "slo_ttft_s": model.slo_ttft_s,
        "slo_violations": waits.violations,
        "slo_violation_share": waits.violations / arrived if arrived else 0.0,
        "wall_s": time.perf_counter() - began,
    }
    return {"summary": summary, "timeline": timeline, "events": events}


def replay(trace: str | Trace, policy_name: str, options: Mapping[str, Any], model: PoolModel,
           registry: ComponentRegistry) -> dict[str, Any]:
    """Build the policy from the registry, replay the trace; the result with its configuration."""
    policy = build_policy(policy_name, options, registry)
    trace = parse_trace(trace) if isinstance(trace, str) else trace
    return {"policy": policy_name, "options": dict(options), "trace": trace.name, "model": attrs.asdict(model),
            **simulate(policy, trace, model)}


# ---------------------------------------------------------------------------------------------- reports


def _num(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}g}"


def summary_rows(result: dict[str, Any]) -> list[tuple[str, str]]:
    s = result["summary"]
    return [
        ("requests", f"{s['requests']:,} ({s['unserved']:,} still queued at the end)"),
        ("replica-seconds", f"{s['replica_seconds']:,.0f} ({s['replica_hours']:.1f} replica-hours, mean "
                            f"{s['mean_replicas']:.1f}, max {s['max_replicas']}, initial {s['initial_replicas']})"),
        ("cold starts", f"{s['cold_starts']:,}"),
        ("scale events", f"{s['scale_events']:,}"),
        ("TTFT p50 / p95 / p99 (s)", " / ".join(_num(s[f"ttft_{q}_s"]) for q in ("p50", "p95", "p99"))),
        (f"SLO violations (TTFT > {s['slo_ttft_s']:g} s)",
         f"{s['slo_violation_share']:.2%} ({s['slo_violations']:,} requests)"),
    ]


def _describe(result: dict[str, Any]) -> tuple[str, str]:
    options = ", ".join(f"{k}={v}" for k, v in result["options"].items())
    m = result["model"]
    service = (f"{m['service_dist']} mean {m['service_s']:g} s" +
               (f" (σ {m['service_sigma']:g})" if m["service_dist"] == "lognormal" else ""))
    pool = (f"concurrency {m['concurrency']}, service {service}, first token {m['first_token_s']:g} s, "
            f"cold start {m['cold_start_s']:g} s ± {m['cold_start_jitter']:.0%}, decisions every "
            f"{m['interval_s']:g} s, step {m['step_s']:g} s, seed {m['seed']}")
    return f"policy {result['policy']}" + (f" ({options})" if options else "") + f" on {result['trace']}", pool


def format_text(result: dict[str, Any]) -> str:
    title, pool = _describe(result)
    rows = summary_rows(result)
    width = max(len(name) for name, _ in rows)
    return "\n".join([title, f"pool: {pool}", *(f"  {name.ljust(width)}  {value}" for name, value in rows),
                      f"  simulated in {result['summary']['wall_s']:.2f} s"])


def render_html(result: dict[str, Any]) -> str:
    """A self-contained page: the summary, replicas, arrival rate and TTFT p95 over time."""
    title, pool = _describe(result)
    line = result["timeline"]
    t = np.asarray(line["t"], dtype=float)
    unit, scale = ("h", 3600.0) if t.size and t[-1] > 7200 else ("min", 60.0) if t.size and t[-1] > 120 else ("s", 1.0)
    stride = max(1, len(t) // 1500)

    def points(values: Sequence[Any]) -> list[tuple[float, float]]:
        return [(t[i] / scale, float(values[i])) for i in range(0, len(t), stride) if values[i] is not None]

    serving, slo = np.asarray(line["serving"]), result["summary"]["slo_ttft_s"]
    axis = {"x_label": f"time ({unit})", "x_range": (0.0, result["summary"]["duration_s"] / scale), "width": 900,
            "legend": "top-left"}
    plots = [
        line_svg({"serving": points(serving), "serving + starting": points(serving + np.asarray(line["starting"])),
                  "policy target": points(line["target"]), "draining": points(line["draining"])},
                 "replicas", height=280, **axis),
        line_svg({"arrival rate (req/s)": points(line["arrival_rate"])}, "arrival rate (req/s)", height=220, **axis),
        line_svg({"TTFT p95 (s)": points(line["ttft_p95_s"]),
                  "SLO": [(t[0] / scale, slo), (t[-1] / scale, slo)] if t.size else []},
                 "TTFT p95 per interval (s)", height=220, **axis),
    ]
    return page("lamina autoscale replay", f"""<p>{html.escape(title)}</p>
<p>pool: {html.escape(pool)}</p>
{table(("metric", "value"), summary_rows(result))}
<div class="plots">{''.join(plots)}</div>""")


def write_html(result: dict[str, Any], path: str | Path) -> Path:
    path = Path(path)
    path.write_text(render_html(result), encoding="utf-8")
    return path
