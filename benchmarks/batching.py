"""Batching policies on the JAX executor: no policy vs fixed vs adaptive (DBS-Adapt), one p99 target.

The three serve the same open-loop Poisson load, at the same p99 time-to-first-token target.

The executor is the real SmolLM2-135M GGUF model loaded as ``executor_throughput.py`` does (or,
with ``--tiny``, the tiny random test model: same engine, toy compute). Requests are short chats:
random-token prompts of ``--prompt-len`` tokens (±50%), ``--max-tokens`` greedy tokens each,
arriving as a Poisson process at ``--rate`` requests/s (one rate, or several measured one after
another) for ``--duration`` seconds. Every policy
serves the same arrivals in a round; rounds alternate the order (A B C, B C A, ...). First, bursts
of requests compile every prefill and decode shape the load can produce, and an untimed warm-up
round runs each policy (``compiles`` in the table counts any compile left in the timed runs).
One executor serves every run: the policy is
swapped while it is idle, and the ``adaptive`` instance keeps its state across rounds, as a
server's would.

Policies, all for the p99 TTFT target ``--target`` (seconds):

- ``none``: the executor without ``[batching]``: one prefill per step, started at once;
- ``fixed``: window W = target / 10, B = ``--max-prefills`` new sequences per step (packed into one
  prefill call);
- ``adaptive``: window in [0, target / 4] steered toward a first-token latency of target / 2 (its
  feedback is each step's longest TTFT, a high-percentile proxy, so half the p99 target leaves
  headroom), same B, ``qps0`` = the offered rate.

Printed per policy (pooled over rounds): completed requests, throughput (completed requests and
generated tokens per second of wall time from the first arrival to the last completion, as vLLM's
``benchmark_serving``: the drain after the last arrival counts, so a slower policy scores lower
even where it keeps up, and every figure stays below the offered rate), TTFT
and end-to-end p50/p99 (from the scheduled arrival, so a late sender counts against the
server), whether p99 TTFT meets the target, sequences per prefill call, and the adaptive
window; then, per policy, the highest of the offered rates at which it met the target (the
seed design's "throughput at the same p99 target"). Other jobs on the machine skew the figures:
compare within one run.

    uv run python benchmarks/batching.py                   # real model, 7, 10 and 13 req/s, 3 rounds of 30 s
    uv run python benchmarks/batching.py --quick --json    # 7 req/s, 2 rounds of 12 s; last line: one JSON object
    uv run python benchmarks/batching.py --quick --rate 7,10,13
    uv run python benchmarks/batching.py --tiny --rate 40  # the tiny test model
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import attrs
import jax
import numpy as np
from tqdm import tqdm

from lamina.tools.bench.load import Load
from lamina_hookspecs.stats import percentile
from lamina.kernel.logging import configure_logging
from lamina_autoscale.adaptive_batching import Adaptive, AdaptiveOptions
from lamina_autoscale.batching import Fixed, FixedOptions
from lamina_hookspecs.errors import ServiceUnavailableError
from lamina_hookspecs.protocols import BatchingPolicy
from lamina_hookspecs.types import Request, SamplingParams
from lamina_jax.executor import JaxExecutor
from lamina_jax.options import JaxOptions

POLICIES = ("none", "fixed", "adaptive")
_ids = itertools.count()


@attrs.frozen
class Arrival:
    at: float
    prompt: list[int]


@attrs.define
class Served:
    """One request: seconds from its scheduled arrival to the first and the last token."""

    ttft: float | None = None
    e2e: float | None = None
    tokens: int = 0
    rejected: bool = False


def trace(rate: float, duration: float, prompt_len: int, vocab: int, seed: int) -> list[Arrival]:
    """Poisson arrivals over ``duration`` seconds, each with a fresh random prompt."""
    times = [t for t in Load(kind="poisson", rate=rate).arrivals(int(rate * duration * 2) + 10, seed) if t < duration]
    rng = np.random.default_rng(seed)
    low = min(max(vocab // 50, 3), vocab - 2)
    lengths = rng.integers(max(prompt_len // 2, 1), prompt_len * 3 // 2 + 1, len(times))
    return [Arrival(t, rng.integers(low, vocab - 1, int(n)).tolist()) for t, n in zip(times, lengths, strict=True)]


async def serve_one(executor: JaxExecutor, arrival: Arrival, start: float, max_tokens: int) -> Served:
    await asyncio.sleep(max(start + arrival.at - time.perf_counter(), 0.0))
    request = Request(id=f"b{next(_ids)}", model=executor.model.id, prompt_token_ids=arrival.prompt,
                      sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
    served = Served()
    try:
        async for chunk in executor.generate(request):
            now = time.perf_counter() - start - arrival.at
            if chunk.token_ids and served.ttft is None:
                served.ttft = now
            served.tokens += len(chunk.token_ids)
        served.e2e = time.perf_counter() - start - arrival.at
    except ServiceUnavailableError:
        served.rejected = True
    return served


async def run_load(executor: JaxExecutor, arrivals: list[Arrival], max_tokens: int) -> tuple[list[Served], float]:
    """Serve ``arrivals`` open-loop; return each request's outcome and the wall time to the last completion."""
    start = time.perf_counter()
    served = await asyncio.gather(*(serve_one(executor, a, start, max_tokens) for a in arrivals))
    return list(served), time.perf_counter() - start


async def compile_shapes(executor: JaxExecutor, lengths: range, max_tokens: int, max_prefills: int,
                         max_batch: int) -> int:
    """Compile every prefill shape the load can produce before anything is timed: one burst per
    (sequences, tokens, blocks) bucket reachable with prompts of ``lengths``, packed together by a
    fixed window; then ``max_batch`` requests at once, of the shortest and of the longest prompts,
    long enough to all decode together, for the decode batch sizes. Returns the bursts run."""
    from lamina_jax.block_manager import blocks_for
    from lamina_jax.model_runner import bucket

    assert executor.engine is not None
    scheduler, size = executor.engine.scheduler, executor.options.block_size
    examples: dict[tuple[int, int, int], tuple[int, ...]] = {}
    for count in range(1, max_prefills + 1):
        for lens in itertools.combinations_with_replacement(lengths, count):
            shape = (bucket(count), bucket(sum(lens), 16), bucket(sum(blocks_for(n, size) for n in lens), 4))
            examples.setdefault(shape, lens)
    scheduler.batching = Fixed(FixedOptions(window_s=0.5, max_prefills=max_prefills))
    bursts = [*examples.values(), (lengths[0],) * max_batch, (lengths[-1],) * max_batch]
    for lens in tqdm(bursts, desc="compiling shapes", leave=False):
        arrivals = [Arrival(0.0, [100 + i] * n) for i, n in enumerate(lens)]
        await run_load(executor, arrivals, max(max_tokens, max_batch // max_prefills + 2))
    return len(bursts)


def policies(args: argparse.Namespace, rate: float) -> dict[str, BatchingPolicy | None]:
    target = args.target
    return {
        "none": None,
        "fixed": Fixed(FixedOptions(window_s=target / 10, max_prefills=args.max_prefills)),
        "adaptive": Adaptive(AdaptiveOptions(w_min_s=0.0, w_max_s=target / 4, target_latency_s=target / 2,
                                             qps0=rate, max_prefills=args.max_prefills)),
    }


def summarize(runs: list[tuple[list[Served], float]], target: float) -> dict[str, Any]:
    served = [s for outcome, _ in runs for s in outcome]
    done = [s for s in served if s.e2e is not None]
    wall = sum(w for _, w in runs)
    ttft, e2e = sorted(s.ttft for s in done if s.ttft is not None), sorted(s.e2e for s in done)
    p99 = percentile(ttft, 99, presorted=True)
    return {
        "sent": len(served), "completed": len(done), "rejected": sum(s.rejected for s in served),
        "throughput_rps": len(done) / wall, "throughput_tok_s": sum(s.tokens for s in done) / wall,
        "ttft_p50_s": percentile(ttft, 50, presorted=True), "ttft_p99_s": p99,
        "e2e_p50_s": percentile(e2e, 50, presorted=True), "e2e_p99_s": percentile(e2e, 99, presorted=True),
        "meets_target": p99 is not None and p99 <= target and len(done) == len(served),
    }


def tiny_model() -> Path:
    from lamina_jax.testing import write_tiny_gguf

    return write_tiny_gguf(Path(tempfile.mkdtemp(prefix="lamina-bench-")) / "tiny-llama.gguf")


class Bench:
    """One executor, instrumented: sequences per prefill call and compiles, counted per run."""

    def __init__(self, executor: JaxExecutor) -> None:
        assert executor.engine is not None and executor.tokenizer is not None
        self.executor, self.engine = executor, executor.engine
        self.vocab = executor.tokenizer.backend.get_vocab_size()
        self.calls: list[int] = []
        self.compiles = 0
        prefill = self.engine.runner.prefill

        def counted(works: list[Any]) -> list[Any]:
            self.calls.append(len(works))
            return prefill(works)

        self.engine.runner.prefill = counted  # type: ignore[method-assign]
        jax.monitoring.register_event_duration_secs_listener(self._on_event)

    def _on_event(self, name: str, duration: float, **kw: Any) -> None:
        self.compiles += name.endswith("backend_compile_duration")

    async def rate(self, args: argparse.Namespace, rate: float) -> dict[str, Any]:
        """Every policy at ``rate``: a warm-up round, then ``args.rounds`` timed ones in alternating order."""
        chosen = policies(args, rate)
        runs: dict[str, list[tuple[list[Served], float]]] = {name: [] for name in POLICIES}
        stats = {name: {"prefill_calls": 0, "prefilled": 0, "compiles": 0} for name in POLICIES}
        windows: list[float] = []
        for round_ in tqdm(range(args.rounds + 1), desc=f"{rate:g} req/s, rounds (first: warm-up)", leave=False):
            arrivals = trace(rate, args.warmup if round_ == 0 else args.duration, args.prompt_len, self.vocab,
                             seed=round_)
            for name in POLICIES[round_ % 3:] + POLICIES[: round_ % 3]:
                self.engine.scheduler.batching = chosen[name]  # the engine is idle between runs
                self.calls.clear()
                before = self.compiles
                outcome = await run_load(self.executor, arrivals, args.max_tokens)
                if round_ == 0:
                    continue
                runs[name].append(outcome)
                stat = stats[name]
                stat["prefill_calls"] += len(self.calls)
                stat["prefilled"] += sum(self.calls)
                stat["compiles"] += self.compiles - before
                if name == "adaptive":
                    windows.append(chosen[name].window_s)  # type: ignore[union-attr]
        results: dict[str, Any] = {
            name: {**summarize(runs[name], args.target),
                   "seqs_per_prefill_call": stats[name]["prefilled"] / max(stats[name]["prefill_calls"], 1),
                   "compiles_while_timed": stats[name]["compiles"]}
            for name in POLICIES}
        results["adaptive"]["window_s_after_each_round"] = windows

        def ratio(a: str, b: str, key: str) -> float | None:
            x, y = results[a][key], results[b][key]
            return x / y if x and y else None

        return {"rate_rps": rate, "policies": results,
                "ratios": {f"{a}_over_{b}_{key}": ratio(a, b, key)
                           for a, b in (("adaptive", "fixed"), ("fixed", "none"), ("adaptive", "none"))
                           for key in ("throughput_rps", "ttft_p99_s", "e2e_p99_s")}}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    model = str(tiny_model()) if args.tiny else JaxOptions().model
    executor = JaxExecutor(JaxOptions(model=model, max_batch=args.max_batch))
    await executor.start()
    try:
        bench = Bench(executor)
        low = max(args.prompt_len // 2, 1)
        bursts = await compile_shapes(executor, range(low, args.prompt_len * 3 // 2 + 1), args.max_tokens,
                                      args.max_prefills, args.max_batch)
        by_rate = [await bench.rate(args, rate) for rate in args.rates]
    finally:
        await executor.stop()
    best = {name: max((r["rate_rps"] for r in by_rate if r["policies"][name]["meets_target"]), default=None)
            for name in POLICIES}
    return {
        "config": {"model": Path(model).name if args.tiny else model, "tiny": args.tiny, "rates_rps": args.rates,
                   "duration_s": args.duration, "rounds": args.rounds, "prompt_len": args.prompt_len,
                   "max_tokens": args.max_tokens, "max_batch": args.max_batch, "max_prefills": args.max_prefills,
                   "target_p99_ttft_s": args.target, "quick": args.quick, "compile_bursts": bursts,
                   "fixed": attrs.asdict(policies(args, 1.0)["fixed"].options),  # type: ignore[union-attr]
                   "adaptive": {**attrs.asdict(policies(args, 1.0)["adaptive"].options),  # type: ignore[union-attr]
                                "qps0": "the offered rate"}},
        "machine": {"cpu_count": os.cpu_count(), "jax": jax.__version__},
        "rates": by_rate,
        "highest_rate_meeting_target_rps": best,
    }


def print_report(r: dict[str, Any]) -> None:
    c = r["config"]
    model = f"{c['model']} (the tiny random test model)" if c["tiny"] else f"{c['model']} (the real model)"
    print(f"{model}; Poisson arrivals for {c['duration_s']:g} s x {c['rounds']} round(s) per rate, prompts "
          f"~{c['prompt_len']} tokens, {c['max_tokens']} new tokens; max_batch {c['max_batch']}, B = "
          f"{c['max_prefills']}; p99 TTFT target {c['target_p99_ttft_s'] * 1000:.0f} ms; "
          f"{r['machine']['cpu_count']} CPUs (noisy: other jobs share them)")
    for at in r["rates"]:
        print(f"\noffered {at['rate_rps']:g} req/s")
        print(f"{'policy':9} {'done/sent':>10} {'req/s':>7} {'tok/s':>7} {'TTFT p50':>9} {'TTFT p99':>9} "
              f"{'e2e p50':>8} {'e2e p99':>8} {'target':>7} {'seq/call':>8} {'compiles':>8}")
        for name, p in at["policies"].items():
            print(f"{name:9} {p['completed']:>5}/{p['sent']:<4} {p['throughput_rps']:7.2f} "
                  f"{p['throughput_tok_s']:7.1f} {_ms(p['ttft_p50_s'])} {_ms(p['ttft_p99_s'])} "
                  f"{_ms(p['e2e_p50_s'], 8)} {_ms(p['e2e_p99_s'], 8)} {'met' if p['meets_target'] else 'missed':>7} "
                  f"{p['seqs_per_prefill_call']:8.2f} {p['compiles_while_timed']:8}")
        windows = at["policies"]["adaptive"]["window_s_after_each_round"]
        print("adaptive window after each round: " + ", ".join(f"{w * 1000:.1f} ms" for w in windows))
        print("ratios: " + ", ".join(f"{k} {v:.2f}" for k, v in at["ratios"].items() if v is not None))
    best = r["highest_rate_meeting_target_rps"]
    print("\nhighest offered rate meeting the p99 TTFT target: "
          + ", ".join(f"{name} {'none of these' if v is None else f'{v:g} req/s'}" for name, v in best.items()))


def _ms(seconds: float | None, width: int = 9) -> str:
    return f"{'-':>{width}}" if seconds is None else f"{seconds * 1000:{width}.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds of 12 s (warm-up 8 s)")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line of stdout")
    parser.add_argument("--tiny", action="store_true", help="the tiny random test model instead of SmolLM2")
    parser.add_argument("--rate", default=None,
                        help="offered requests/s, or several comma-separated (default 7, full run 7,10,13; tiny 40)")
    parser.add_argument("--duration", type=float, default=None, help="seconds of arrivals per timed run (30; quick 12)")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds (3; quick 2)")
    parser.add_argument("--target", type=float, default=1.0, help="p99 TTFT target, seconds")
    parser.add_argument("--prompt-len", type=int, default=24, help="mean prompt tokens (uniform ±50%%)")
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens generated per request")
    parser.add_argument("--max-batch", type=int, default=32, help="the executor's max_batch")
    parser.add_argument("--max-prefills", type=int, default=4, help="B of fixed and adaptive")
    args = parser.parse_args()
    default_rates = "40" if args.tiny else "7" if args.quick else "7,10,13"
    args.rates = [float(r) for r in (args.rate or default_rates).split(",")]
    args.duration = args.duration or (12.0 if args.quick else 30.0)
    args.rounds = args.rounds or (2 if args.quick else 3)
    args.warmup = 8.0 if args.quick else 15.0
    configure_logging(level="WARNING")  # logs to stderr: stdout is the report
    print(f"jax {jax.__version__}, {os.cpu_count()} CPUs", file=sys.stderr)
    result = asyncio.run(run(args))
    print_report(result)
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
