"""The benchmark driver: one workload, one or more targets, one or more load levels, in rounds.

Every target gets the very same requests (and, open-loop, the same arrival times) for a seed.
The counted requests are split into ``rounds``; each round runs every target in turn, the order
alternating from round to round (A B, B A, ...), so drift over time hits every target alike.
A warm-up (not counted) runs against each target first.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from lamina.tools.bench.load import Endpoint, Load, Record, RunResult, discover_model, run
from lamina.tools.bench.metrics import Sample, compare, summarize
from lamina.tools.bench.workloads import BenchRequest, make_workload


@dataclass(frozen=True)
class Target:
    """An endpoint to benchmark: its label and base URL (``stack`` when the bench started it), and body
    fields sent to it alone (over the config's ``extra_body``)."""

    label: str
    url: str
    stack: str | None = None
    extra_body: dict[str, Any] = field(default_factory=dict)


@dataclass
class BenchConfig:
    """Everything a benchmark run needs; see ``lamina bench --help`` for each field."""

    targets: Sequence[Target]
    workload: str = "fixed"
    workload_options: dict[str, Any] = field(default_factory=dict)
    num_requests: int = 50
    warmup: int = 2
    seed: int = 0
    loads: Sequence[Load] = (Load("closed", concurrency=4),)
    duration_s: float | None = None
    rounds: int = 1
    slos: dict[str, float] = field(default_factory=dict)
    model: str | None = None
    api: str = "completions"
    api_key: str | None = None
    ignore_eos: bool = True
    extra_body: dict[str, Any] = field(default_factory=dict)
    timeout_s: float = 300.0
    bootstrap: str = "requests"
    resamples: int = 1000
    confidence: float = 0.95
    progress: bool = True

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["targets"] = [asdict(t) for t in self.targets]
        out["loads"] = [{**asdict(load), "rate": None if math.isinf(load.rate) else load.rate, "label": load.label}
                        for load in self.loads]
        out.pop("api_key")
        return out


def _rounds(requests: Sequence[BenchRequest], rounds: int) -> list[tuple[int, list[BenchRequest]]]:
    """Contiguous slices of ``requests``, one per round, with each slice's first index."""
    size = math.ceil(len(requests) / rounds)
    return [(i, list(requests[i:i + size])) for i in range(0, len(requests), size)]


def _order(targets: Sequence[Target], round_: int) -> list[Target]:
    """Round 0: A B C; round 1: C B A; round 2: A B C ... (two targets: A B, B A, A B ...)."""
    return list(targets) if round_ % 2 == 0 else list(reversed(targets))


async def _bench(config: BenchConfig) -> dict[str, Any]:
    if not config.targets:
        raise ValueError("no targets: give --url or --stack")
    if config.rounds < 1:
        raise ValueError("rounds must be at least 1")
    requests = make_workload(config.workload, config.num_requests, seed=config.seed, **config.workload_options)
    warmups = (make_workload(config.workload, config.warmup, seed=config.seed + 1, **config.workload_options)
               if config.warmup else [])
    endpoints: dict[str, Endpoint] = {}
    for target in config.targets:
        model = config.model or await discover_model(target.url, config.api_key)
        endpoints[target.label] = Endpoint(url=target.url, model=model, api=config.api, api_key=config.api_key,
                                           ignore_eos=config.ignore_eos,
                                           extra_body={**config.extra_body, **target.extra_body},
                                           timeout_s=config.timeout_s)
    bar = None
    if config.progress:
        from tqdm import tqdm  # type: ignore[import-untyped,unused-ignore]

        total = len(config.targets) * (len(warmups) + len(requests) * len(config.loads))
        bar = tqdm(total=total, desc="lamina bench", unit="req", dynamic_ncols=True)

    def done(record: Record) -> None:
        if bar is not None:
            bar.update(1)
            if not record.warmup:
                bar.set_postfix_str(f"{record.target} {record.level} round {record.round}", refresh=False)

    records: list[Record] = []
    levels: list[dict[str, Any]] = []
    try:
        if warmups:
            concurrency = max((ld.concurrency if ld.kind == "closed" else ld.max_concurrency or len(warmups))
                              for ld in config.loads)
            for target in config.targets:
                result = await run(endpoints[target.label], warmups, Load("closed", concurrency=min(concurrency, len(warmups))),
                                   on_done=done, tags={"target": target.label, "level": "warmup", "warmup": True})
                records.extend(result.records)
        slices = _rounds(requests, config.rounds)
        round_duration = config.duration_s / len(slices) if config.duration_s else None
        for load in config.loads:
            runs: dict[str, list[RunResult]] = {t.label: [] for t in config.targets}
            for round_, (first, chunk) in enumerate(slices):
                for target in _order(config.targets, round_):
                    result = await run(endpoints[target.label], chunk, load, seed=config.seed + round_,
                                       duration_s=round_duration, on_done=done, first_index=first,
                                       tags={"target": target.label, "level": load.label, "round": round_})
                    runs[target.label].append(result)
                    records.extend(result.records)
                    if bar is not None:  # requests never issued (duration bound) still advance the bar
                        bar.update(len(chunk) - len(result.records))
            summaries = {label: summarize([r for res in results for r in res.records],
                                          sum(res.duration_s for res in results), config.slos)
                         for label, results in runs.items()}
            baseline = config.targets[0].label
            comparisons = {}
            for target in config.targets[1:]:
                comparisons[target.label] = compare(
                    [Sample(r.records, r.duration_s) for r in runs[baseline]],
                    [Sample(r.records, r.duration_s) for r in runs[target.label]],
                    slos=config.slos, by=config.bootstrap, resamples=config.resamples,
                    confidence=config.confidence, seed=config.seed)
            levels.append({"load": load.label, "summaries": summaries, "baseline": baseline,
                           "comparisons": comparisons,
                           "round_durations_s": {label: [r.duration_s for r in results]
                                                 for label, results in runs.items()}})
    finally:
        if bar is not None:
            bar.close()
    return {"lamina_bench": 1, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "config": config.to_json(),
            "models": {label: e.model for label, e in endpoints.items()},
            "levels": levels, "records": [r.to_json() for r in records]}


def run_bench(config: BenchConfig) -> dict[str, Any]:
    """Run the benchmark ``config`` describes; returns the results (summary and raw records) as
    a JSON-ready dict: ``levels[i]["summaries"][target]``, ``levels[i]["comparisons"][target]``
    (each target against the first), ``records`` (every request, warm-up ones flagged)."""
    return asyncio.run(_bench(config))
