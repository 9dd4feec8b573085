"""Summaries of a run's records: latency percentiles, throughput, goodput under SLOs, and the
A/B comparison of two targets with bootstrap confidence intervals.

Definitions (as vLLM's ``benchmark_serving``): TTFT is the time from sending to the first chunk
with text; ITL each gap between successive text chunks (pooled over requests); TPOT a request's
``(e2e - ttft) / (output_tokens - 1)``; E2E the time from sending to the end of the stream.
Throughputs divide by the wall time of the runs. A request is *good* when it succeeded and
meets every SLO; goodput is good requests per second.
"""

from __future__ import annotations

import math
import random
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from lamina_hookspecs.stats import percentile
from lamina.tools.bench.load import Record

LATENCIES = ("ttft", "tpot", "itl", "e2e")
SLO_METRICS = ("ttft", "tpot", "itl", "e2e")
"""SLO keys: ``ttft``, ``tpot``, ``e2e`` bound the request's value; ``itl`` bounds its largest gap."""

_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ms|s|us|µs)?\s*$")


def parse_duration(text: str) -> float:
    """``"500ms"``, ``"0.5s"``, ``"0.5"`` (seconds) → seconds."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"not a duration: {text!r} (e.g. 500ms, 1.5s)")
    value, unit = float(match.group(1)), match.group(2) or "s"
    return value * {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6}[unit]


def parse_slo(text: str | None) -> dict[str, float]:
    """``"ttft=500ms,tpot=50ms"`` → ``{"ttft": 0.5, "tpot": 0.05}``."""
    slos: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in (text or "").split(","))):
        key, sep, value = part.partition("=")
        key = key.strip().lower().replace("e2el", "e2e")
        if not sep or key not in SLO_METRICS:
            raise ValueError(f"bad SLO {part!r}: use KEY=DURATION with KEY one of {', '.join(SLO_METRICS)}")
        slos[key] = parse_duration(value)
    return slos


def describe(values: Sequence[float]) -> dict[str, float | None]:
    """mean, std, min, p50, p90, p95, p99, max of ``values`` (all None if empty)."""
    data = sorted(values)
    if not data:
        return dict.fromkeys(("count", "mean", "std", "min", "p50", "p90", "p95", "p99", "max"))  # type: ignore[arg-type]
    mean = sum(data) / len(data)
    std = math.sqrt(sum((v - mean) ** 2 for v in data) / len(data))
    out: dict[str, float | None] = {"count": len(data), "mean": mean, "std": std, "min": data[0]}
    for q in (50, 90, 95, 99):
        out[f"p{q}"] = percentile(data, q, presorted=True)
    out["max"] = data[-1]
    return out


def meets(record: Record, slos: dict[str, float]) -> bool:
    """Whether ``record`` succeeded within every SLO."""
    if not record.ok:
        return False
    values = {"ttft": record.ttft, "tpot": record.tpot, "e2e": record.e2e,
              "itl": max(record.itl) if record.itl else None}
    for key, bound in slos.items():
        value = values[key]
        if value is None and key in ("tpot", "itl"):
            continue  # a one-token answer has no TPOT or gaps to bound
        if value is None or value > bound:
            return False
    return True


def latencies(records: Sequence[Record], name: str) -> list[float]:
    ok = [r for r in records if r.ok]
    if name == "itl":
        return [gap for r in ok for gap in r.itl]
    values = (getattr(r, name) for r in ok)
    return [v for v in values if v is not None]


def summarize(records: Sequence[Record], duration_s: float, slos: dict[str, float] | None = None) -> dict[str, Any]:
    """The summary of one target's counted records over ``duration_s`` seconds of runs."""
    slos = slos or {}
    ok = [r for r in records if r.ok]
    duration = duration_s or math.nan
    output = sum(r.output_tokens for r in ok)
    prompt = sum(r.prompt_tokens or 0 for r in ok)
    summary: dict[str, Any] = {
        "requests": len(records), "completed": len(ok), "failed": len(records) - len(ok),
        "errors": dict(Counter(r.error for r in records if not r.ok)),
        "duration_s": duration_s,
        "request_throughput": len(ok) / duration,
        "output_throughput": output / duration,
        "total_token_throughput": (output + prompt) / duration,
        "output_tokens": output, "prompt_tokens": prompt,
        "output_tokens_per_request": output / len(ok) if ok else None,
        "usage_reported": sum(r.usage for r in ok),
    }
    for name in LATENCIES:
        summary[name] = describe(latencies(records, name))
    if slos:
        good = sum(meets(r, slos) for r in records)
        summary["slo"] = slos
        summary["good"] = good
        summary["goodput"] = good / duration
        summary["slo_attainment"] = good / len(records) if records else None
    return summary


# ---------------------------------------------------------------------------------------------- A/B

@dataclass(frozen=True)
class Sample:
    """What a statistic is computed on: records and the wall time they took."""

    records: Sequence[Record]
    duration_s: float


try:  # numpy, when installed, makes the bootstrap of pooled ITL percentiles ~10x faster
    import numpy as _np
except ImportError:  # pragma: no cover
    _np = None  # type: ignore[assignment]


def _stat(name: str, q: float | str) -> Callable[[Sample], float | None]:
    def compute(sample: Sample) -> float | None:
        values = latencies(sample.records, name)
        if not values:
            return None
        if q == "mean":
            return sum(values) / len(values)
        if _np is not None:
            return float(_np.percentile(_np.asarray(values), float(q)))
        return percentile(values, float(q))
    return compute


def comparison_metrics(slos: dict[str, float] | None = None) -> dict[str, tuple[Callable[[Sample], float | None], bool]]:
    """Metric name → (statistic, whether higher is better)."""
    metrics: dict[str, tuple[Callable[[Sample], float | None], bool]] = {}
    for name in ("ttft", "tpot", "itl", "e2e"):
        for q in ("mean", 50, 99):
            metrics[f"{name}_{'mean' if q == 'mean' else f'p{q}'}"] = (_stat(name, q), False)
    metrics["output_throughput"] = (lambda s: sum(r.output_tokens for r in s.records if r.ok) / s.duration_s, True)
    metrics["request_throughput"] = (lambda s: sum(r.ok for r in s.records) / s.duration_s, True)
    if slos:
        metrics["goodput"] = (lambda s: sum(meets(r, slos) for r in s.records) / s.duration_s, True)
    metrics["error_rate"] = (lambda s: sum(not r.ok for r in s.records) / len(s.records) if s.records else None,
                             False)
    return metrics


def compare(a_rounds: Sequence[Sample], b_rounds: Sequence[Sample], *, slos: dict[str, float] | None = None,
            by: str = "requests", resamples: int = 1000, confidence: float = 0.95,
            seed: int = 0) -> dict[str, dict[str, Any]]:
    """Each metric for A and B, the ratio B/A and its bootstrap confidence interval.

    ``by="requests"`` resamples each target's requests independently (throughputs keep the
    measured wall time, so their CIs come from rounds when there are two or more);
    ``by="rounds"`` resamples round indices, the same ones for both targets,
    so that drift shared by a round stays paired."""
    if by not in ("requests", "rounds"):
        raise ValueError("bootstrap by 'requests' or 'rounds'")

    def pool(rounds: Sequence[Sample]) -> Sample:
        return Sample([r for s in rounds for r in s.records], sum(s.duration_s for s in rounds))

    a_all, b_all = pool(a_rounds), pool(b_rounds)
    rng = random.Random(seed)
    metrics = comparison_metrics(slos)
    draws: dict[str, list[float]] = {name: [] for name in metrics}
    # Throughputs vary between rounds, not between requests of a round (the wall time is one
    # number per run), so with ``by="requests"`` they still resample paired rounds when there are some.
    per_round = {"output_throughput", "request_throughput", "goodput"}
    ci_by = {name: "rounds" if by == "rounds" or (name in per_round and len(a_rounds) > 1) else "requests"
             for name in metrics}
    for _ in range(resamples):
        picks = [rng.randrange(len(a_rounds)) for _ in a_rounds]
        by_rounds = (pool([a_rounds[i] for i in picks]), pool([b_rounds[i] for i in picks]))
        by_requests = by_rounds if by == "rounds" else (
            Sample(rng.choices(a_all.records, k=len(a_all.records)) if a_all.records else [], a_all.duration_s),
            Sample(rng.choices(b_all.records, k=len(b_all.records)) if b_all.records else [], b_all.duration_s))
        for name, (stat, _) in metrics.items():
            a, b = by_rounds if ci_by[name] == "rounds" else by_requests
            va, vb = stat(a), stat(b)
            if va and vb is not None:
                draws[name].append(vb / va)
    out: dict[str, dict[str, Any]] = {}
    tail = (1 - confidence) / 2 * 100
    for name, (stat, higher_better) in metrics.items():
        va, vb = stat(a_all), stat(b_all)
        ratio = vb / va if va and vb is not None else None
        values = sorted(draws[name])
        ci = (percentile(values, tail, presorted=True), percentile(values, 100 - tail, presorted=True))
        out[name] = {"a": va, "b": vb, "ratio": ratio, "ci_low": ci[0], "ci_high": ci[1],
                     "higher_is_better": higher_better, "resamples": len(values),
                     "ci_by": ci_by[name]}
    return out
