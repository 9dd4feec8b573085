"""What structured output costs the JAX executor: 16 streams, half of them JSON-Schema constrained.

SmolLM2-135M-Instruct on the default executor options, ShareGPT chat prompts, greedy. Two batches
run in alternating rounds (A B A B ...), each 16 chat requests submitted at once:

- ``free``: none constrained;
- ``mixed``: 8 (every other one) under a JSON Schema (``response_format`` json_schema: an object with at least 16
  items of a name and a score, so that every constrained stream is still inside the JSON at
  ``max_tokens``), 8 free.

Every stream generates exactly ``max_tokens`` tokens (free ones with ``ignore_eos``). For each row
kind the benchmark gives the decode rate per stream (tokens after the first ÷ the time after the
first) and TTFT, and for each batch the output tokens/s. The overheads compare the mixed batch's
constrained rows, and its free rows, with the free batch's rows; the issue's aims are ≤ 15% and
≤ 3%. Constrained and free rows share each engine step, so the mask work of the constrained rows
(computed on the host before the step) slows the free rows of the same batch too.

Run::

    uv run python benchmarks/structured_outputs.py            # 3 rounds of 64 new tokens
    uv run python benchmarks/structured_outputs.py --quick    # 2 rounds of 32
    uv run python benchmarks/structured_outputs.py --json     # last stdout line: one JSON object

Progress goes to stderr. Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import sys
import time
from typing import Any

from tqdm import tqdm

from lamina_hookspecs.stats import percentile
from lamina.tools.bench.workloads import sharegpt
from lamina.server.openai_api import parse_chat
from lamina_jax.executor import JaxExecutor
from lamina_jax.native import cpu_model
from lamina_jax.options import JaxOptions

STREAMS = 16
SCHEMA = {"type": "object", "required": ["items"], "additionalProperties": False, "properties": {"items": {
    "type": "array", "minItems": 16, "items": {
        "type": "object", "required": ["name", "score"], "additionalProperties": False,
        "properties": {"name": {"type": "string", "maxLength": 40}, "score": {"type": "integer"}}}}}}
_ids = itertools.count()


async def one(executor: JaxExecutor, messages: list[dict[str, str]], max_tokens: int,
              constrained: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"model": executor.model.id, "messages": messages, "max_tokens": max_tokens,
                            "temperature": 0, "ignore_eos": True}
    if constrained:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "items", "schema": SCHEMA}}
    request = parse_chat(body, f"s{next(_ids)}", "bench")
    start = time.perf_counter()
    first = None
    tokens = 0
    async for chunk in executor.generate(request):
        if chunk.token_ids and first is None:
            first = time.perf_counter()
        tokens += len(chunk.token_ids)
    end = time.perf_counter()
    assert first is not None and tokens == max_tokens, (tokens, max_tokens)
    return {"constrained": constrained, "ttft_s": first - start, "rate": (tokens - 1) / (end - first),
            "tokens": tokens}


async def batch(executor: JaxExecutor, prompts: list[list[dict[str, str]]], max_tokens: int,
                mixed: bool) -> dict[str, Any]:
    """All ``prompts`` at once; with ``mixed``, every other one constrained (so that both kinds
    meet the same prefill order)."""
    start = time.perf_counter()
    rows = await asyncio.gather(*(one(executor, p, max_tokens, mixed and i % 2 == 1) for i, p in enumerate(prompts)))
    return {"rows": rows, "wall_s": time.perf_counter() - start}


def summary(runs: list[dict[str, Any]], constrained: bool) -> dict[str, float] | None:
    rows = [r for run in runs for r in run["rows"] if r["constrained"] == constrained]
    if not rows:
        return None
    ttft = sorted(r["ttft_s"] for r in rows)
    return {"streams": len(rows), "rate_per_stream": statistics.mean(r["rate"] for r in rows),
            "ttft_p50_s": percentile(ttft, 50, presorted=True), "ttft_p95_s": percentile(ttft, 95, presorted=True)}


async def measure(rounds: int, max_tokens: int) -> dict[str, Any]:
    executor = JaxExecutor(JaxOptions())
    await executor.start()
    prompts = [r.chat_messages() for r in sharegpt(STREAMS, seed=1, max_prompt_len=256)]
    runs: dict[str, list[dict[str, Any]]] = {"free": [], "mixed": []}
    await batch(executor, prompts, 8, True)  # warm-up, not counted
    with tqdm(total=2 * rounds, desc="batches", file=sys.stderr) as bar:
        for _ in range(rounds):
            for name in ("free", "mixed"):
                runs[name].append(await batch(executor, prompts, max_tokens, name == "mixed"))
                bar.update()
    await executor.stop()
    free, mixed = summary(runs["free"], False), summary(runs["mixed"], False)
    guided = summary(runs["mixed"], True)
    assert free and mixed and guided
    throughput = {name: statistics.mean(sum(r["tokens"] for r in run["rows"]) / run["wall_s"] for run in batches)
                  for name, batches in runs.items()}
    return {
        "benchmark": "structured_outputs", "cpu": cpu_model(), "rounds": rounds,
        "max_tokens": max_tokens, "streams": STREAMS, "free_batch": free, "mixed_free_rows": mixed,
        "mixed_constrained_rows": guided, "output_tokens_per_s": throughput,
        "overhead_constrained": 1 - guided["rate_per_stream"] / free["rate_per_stream"],
        "overhead_free_rows": 1 - mixed["rate_per_stream"] / free["rate_per_stream"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds of 32 new tokens")
    parser.add_argument("--json", action="store_true", help="end with one JSON object on stdout")
    args = parser.parse_args()
    result = asyncio.run(measure(2 if args.quick else 3, 32 if args.quick else 64))
    print(f"{'rows':<28}{'streams':>8}{'tok/s/stream':>14}{'TTFT p50':>10}{'TTFT p95':>10}")
    for label, key in (("free batch", "free_batch"), ("mixed batch, free rows", "mixed_free_rows"),
                       ("mixed batch, constrained", "mixed_constrained_rows")):
        r = result[key]
        print(f"{label:<28}{r['streams']:>8}{r['rate_per_stream']:>14.2f}{r['ttft_p50_s']:>9.2f}s"
              f"{r['ttft_p95_s']:>9.2f}s")
    print(f"output tokens/s: free batch {result['output_tokens_per_s']['free']:.1f}, "
          f"mixed batch {result['output_tokens_per_s']['mixed']:.1f}")
    print(f"overhead per stream: constrained rows {result['overhead_constrained']:+.1%} (aim <= 15%), "
          f"free rows beside them {result['overhead_free_rows']:+.1%} (aim <= 3%)")
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
