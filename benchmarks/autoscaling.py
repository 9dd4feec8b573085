"""Autoscalers on a load step (low → high → low arrival rate): static vs target vs predictive.

Each policy drives a live pool of ``lamina worker`` replicas behind one gateway (``[replicas]``
starting at 1, ``[autoscaler]`` deciding every second). The replicas are ``echo`` executors
with the cost model (:mod:`lamina_echo.cost_model`) calibrated on our JAX executor's measured
prefill and decode times (``NOTES-executor.md``) and sped up by ``--time-scale``, including a
simulated model load (``--cold-start-s``) so a new replica takes time to help. The gateway's
``/metrics`` is sampled twice a second for the replica count.

Printed per policy: replica-seconds used, replicas started (cold starts), TTFT p95 per phase,
share of requests over the TTFT SLO, and, for replicas started by the policy, the time from
the load step to the pool's first added replica being ready. ``--html`` writes the replica
counts over time with the arrival rate.

    uv run python benchmarks/autoscaling.py --quick --json
    uv run python benchmarks/autoscaling.py --html autoscaling.html
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families
from tqdm import tqdm

from lamina.tools.bench.load import Endpoint, Load, run
from lamina.tools.bench.metrics import describe
from lamina.tools.bench.servers import serve_stacks
from lamina.tools.bench.workloads import BenchRequest, sharegpt_answers

# Our JAX executor on this CPU (NOTES-executor.md), seconds.
PREFILL_S_PER_TOKEN, DECODE_S_PER_TOKEN, BATCH_SLOWDOWN = 1.0e-3, 19e-3, 0.13
PROMPT_WORDS, OUTPUT_TOKENS = 300, 24


@dataclass(frozen=True)
class StepLoad(Load):
    """Poisson arrivals whose rate follows ``phases``: (duration s, rate req/s) in order."""

    phases: tuple[tuple[float, float], ...] = ()

    def arrivals(self, n: int, seed: int) -> list[float]:
        rng, out, start = random.Random(seed), [], 0.0
        for duration, rate in self.phases:
            t = start + rng.expovariate(rate)
            while t < start + duration and len(out) < n:
                out.append(t)
                t += rng.expovariate(rate)
            start += duration
        return out


def policies(per_replica_rate: float, peak: int) -> dict[str, str]:
    """Each policy's ``[autoscaler]`` table."""
    return {
        "static": f'use = "static"\nreplicas = {peak}\n',
        "target": ('use = "target"\nmetric = "arrival_per_replica"\n'
                   f"target = {per_replica_rate:.3f}\nmin_replicas = 1\nmax_replicas = {peak + 1}\n"
                   "scale_up_cooldown_s = 2\nscale_down_cooldown_s = 8\n"),
        "predictive": ('use = "predictive"\n'
                       f"per_replica_rate = {per_replica_rate:.3f}\nmin_replicas = 1\nmax_replicas = {peak + 1}\n"
                       "window_s = 8\nlead_clamp_s = [2, 30]\nscale_up_cooldown_s = 2\nscale_down_cooldown_s = 8\n"),
    }


def stack_toml(autoscaler: str, scale: float, cold_start_s: float) -> str:
    return ('[stack]\nname = "autoscaling"\n[executor]\nuse = "echo"\ncontext_length = 8192\n'
            f"prefill_s_per_token = {PREFILL_S_PER_TOKEN * scale}\ntoken_delay_s = {DECODE_S_PER_TOKEN * scale}\n"
            f"batch_slowdown = {BATCH_SLOWDOWN}\nstartup_s = {cold_start_s}\n"
            "[replicas]\ncount = 1\nautoscale_interval_s = 1.0\n[server]\ngrpc = false\n"
            f"[autoscaler]\n{autoscaler}")


class ReplicaSampler:
    """Samples ``lamina_replicas`` and spawn counts from ``/metrics`` on a thread."""

    def __init__(self, url: str, every_s: float = 0.5) -> None:
        self.url, self.every_s = url, every_s
        self.samples: list[tuple[float, float, float]] = []  # (t, serving, starting)
        self.spawns = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.began = time.perf_counter()

    def __enter__(self) -> ReplicaSampler:
        self.began = time.perf_counter()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        with httpx.Client(timeout=5) as client:
            while not self._stop.wait(self.every_s):
                states, spawns = {}, 0.0
                for family in text_string_to_metric_families(client.get(f"{self.url}/metrics").text):
                    for sample in family.samples:
                        if sample.name == "lamina_replicas":
                            states[sample.labels["state"]] = sample.value
                        elif sample.name == "lamina_replica_actions_total" and sample.labels["action"] == "spawn":
                            spawns += sample.value
                self.samples.append((time.perf_counter() - self.began, states.get("serving", 0.0),
                                     states.get("starting", 0.0)))
                self.spawns = spawns

    def replica_seconds(self) -> float:
        return sum((b[0] - a[0]) * (a[1] + a[2]) for a, b in zip(self.samples, self.samples[1:]))

    def first_added_ready(self, after_s: float) -> float | None:
        """Seconds from ``after_s`` until more replicas serve than at ``after_s``."""
        base = next((s[1] for s in self.samples if s[0] >= after_s), None)
        for t, serving, _ in self.samples:
            if t >= after_s and base is not None and serving > base:
                return t - after_s
        return None


def workload(n: int, seed: int) -> list[BenchRequest]:
    """Prompts of ``PROMPT_WORDS`` words cut from ShareGPT answers (each distinct)."""
    rng, words = random.Random(seed), " ".join(a for _, a in zip(range(4000), sharegpt_answers())).split()
    out = []
    for _ in range(n):
        start = rng.randrange(0, len(words) - PROMPT_WORDS)
        out.append(BenchRequest(prompt=" ".join(words[start:start + PROMPT_WORDS]), max_tokens=OUTPUT_TOKENS,
                                prompt_tokens=PROMPT_WORDS))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter phases (about 40 s per policy)")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    parser.add_argument("--html", help="write replicas over time per policy to this HTML file")
    parser.add_argument("--time-scale", type=float, default=0.1, help="multiplies every simulated duration")
    parser.add_argument("--cold-start-s", type=float, default=3.0, help="simulated model load of a new replica")
    parser.add_argument("--slo-ttft-s", type=float, default=0.25)
    parser.add_argument("--policies", default="static,target,predictive")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    scale = args.time_scale
    per_replica = 0.6 / (PROMPT_WORDS * PREFILL_S_PER_TOKEN * scale)  # 60% of one replica's prefill capacity
    low, high = per_replica * 0.8, per_replica * 3.0
    phase_s = (10.0, 15.0, 10.0) if args.quick else (20.0, 40.0, 20.0)
    phases = ((phase_s[0], low), (phase_s[1], high), (phase_s[2], low))
    load = StepLoad(kind="poisson", rate=high, phases=phases)
    requests = workload(int(sum(d * r for d, r in phases) * 1.5) + 10, args.seed)
    peak = -(-high // per_replica)
    configs = policies(per_replica, int(peak))
    print(f"phases {phases[0][1]:.1f} → {phases[1][1]:.1f} → {phases[2][1]:.1f} req/s for "
          f"{'/'.join(f'{d:g}' for d in phase_s)} s; one replica sustains ~{per_replica:.1f} req/s at 60% "
          f"prefill load; cold start ~{args.cold_start_s:g} s + process start", file=sys.stderr)
    results: dict[str, Any] = {}
    timelines: dict[str, list[tuple[float, float, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in tqdm(args.policies.split(","), desc="policies", file=sys.stderr):
            stack = Path(tmp) / f"{name}.toml"
            stack.write_text(stack_toml(configs[name], scale, args.cold_start_s))
            with serve_stacks([str(stack)]) as (url,), ReplicaSampler(url) as sampler:
                outcome = asyncio.run(run(Endpoint(url=url, model="echo"), requests, load, seed=args.seed))
            results[name] = summarize(outcome.records, phases, args.slo_ttft_s, sampler)
            timelines[name] = sampler.samples
    print(f"{'policy':>11} {'replica-s':>10} {'started':>8} {'TTFT p95 low':>13} {'high':>8} {'low':>8} "
          f"{'over SLO':>9} {'step→+1 ready':>14}")
    for name, r in results.items():
        p95 = r["ttft_p95_by_phase"]
        print(f"{name:>11} {r['replica_seconds']:>10.1f} {r['replicas_started']:>8.0f} {_s(p95[0]):>13} "
              f"{_s(p95[1]):>8} {_s(p95[2]):>8} {r['over_slo']:>9.1%} {_s(r['step_to_added_ready_s']):>14}")
    if args.html:
        Path(args.html).write_text(_html(timelines, phases), encoding="utf-8")
        print(f"wrote {args.html}", file=sys.stderr)
    if args.json:
        print(json.dumps({"phases": phases, "slo_ttft_s": args.slo_ttft_s, "time_scale": scale,
                          "policies": results}))


def summarize(records: list[Any], phases: tuple[tuple[float, float], ...], slo_s: float,
              sampler: ReplicaSampler) -> dict[str, Any]:
    bounds, t = [], 0.0
    for duration, _ in phases:
        bounds.append((t, t + duration))
        t += duration
    ok = [r for r in records if r.ok and r.ttft is not None]
    by_phase = [describe([r.ttft for r in ok if lo <= r.start < hi])["p95"] for lo, hi in bounds]
    return {"requests": len(records), "errors": len(records) - len(ok), "ttft_p95_by_phase": by_phase,
            "over_slo": sum(r.ttft > slo_s for r in ok) / len(ok) if ok else 0.0,
            "replica_seconds": sampler.replica_seconds(), "replicas_started": sampler.spawns,
            "step_to_added_ready_s": sampler.first_added_ready(bounds[1][0])}


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _html(timelines: dict[str, list[tuple[float, float, float]]], phases: tuple[tuple[float, float], ...]) -> str:
    from lamina.tools.htmlreport import line_svg, page

    series = {name: [(t, serving + starting) for t, serving, starting in samples]
              for name, samples in timelines.items()}
    rate, t = [], 0.0
    for duration, r in phases:
        rate += [(t, r), (t + duration, r)]
        t += duration
    return page("Autoscaling on a load step",
                '<div class="plots">' + line_svg(series, "replicas (serving + starting) over time", x_label="s",
                                                 legend="top-left")
                + line_svg({"arrival rate (req/s)": rate}, "arrival rate", x_label="s", legend="top-left") + "</div>")


if __name__ == "__main__":
    main()
