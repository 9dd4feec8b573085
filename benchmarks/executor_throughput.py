"""Throughput of the JAX executor on this machine, beside llama.cpp on the same GGUF file.

What it measures, in one run (medians over rounds; every shape is compiled by an untimed
warm-up round before it is timed):

1. prefill: time to first token of a 512-token prompt with ``max_tokens=1``, and 512 / that time;
2. time to first token of a 16-token prompt;
3. decode at 1, 8, 16 and 32 concurrent streams (128 new tokens each, greedy, ``ignore_eos``):
   per stream, from its first token to its last (prefill excluded); in aggregate, all decoded
   tokens over the span from the earliest first token to the latest last token; and end to end,
   all generated tokens over the span from submission to the latest last token;
4. peak RSS (``resource.getrusage``, taken before llama.cpp is loaded) and KV-cache bytes per token;
5. the memory-bandwidth bound of batch-1 decode: the weights' bytes as held (all of them are read
   once per token) over a measured copy bandwidth (numpy copy of 512 MiB, best of five, counting
   bytes read plus bytes written), and the model-bandwidth utilisation (MBU) of batch-1 decode;
6. llama.cpp (llama-cpp-python, when importable) on the same prompts: prefill 512, TTFT of the
   short prompt and batch-1 decode, run in alternating rounds with the JAX executor (never both at
   once: on 2 cores llama.cpp's OpenMP threads collapse under contention), and JAX ÷ llama.cpp.
   Without llama_cpp, the figures of ``NOTES-executor.md`` are printed as a cited reference.

Prompts are random token ids, different in every round, so no prefix cache can serve them.

Run::

    uv run python benchmarks/executor_throughput.py            # full: 5 rounds, 1/8/16/32 streams
    uv run python benchmarks/executor_throughput.py --quick    # 2 rounds, 1/8/16 streams, 32 tokens
    uv run python benchmarks/executor_throughput.py --quick --json   # last stdout line: one JSON object

Progress goes to stderr. Other jobs on the machine skew the figures: compare within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import resource
import sys
import time
from pathlib import Path
from typing import Any
from statistics import median

import attrs
import jax
import numpy as np
from tqdm import tqdm

from lamina.logging import configure_logging
from lamina_hookspecs.types import Request, SamplingParams
from lamina_jax.executor import JaxExecutor
from lamina_jax.options import JaxOptions
from lamina_jax.weights.gguf import smollm2_path

PREFILL_LEN = 512
SHORT_LEN = 16

# Not measured here: llama-cpp-python 0.3.36, 2 threads, idle machine (/work/shared/NOTES-executor.md).
CITED_LLAMA_CPP = {
    "source": "/work/shared/NOTES-executor.md",
    "prefill_512_tok_s": 200.0,
    "ttft_5_token_prompt_s": 0.033,
    "decode_batch1_short_prompt_tok_s": 89.0,
    "decode_batch1_after_512_prompt_tok_s": 75.0,
    "batch_api_aggregate_tok_s": {"1": 84.0, "4": 131.0, "16": 148.0},
    "python_server_aggregate_tok_s": {"1": 67.0, "4": 27.0, "16": 27.0},
}

_request_ids = itertools.count()
_seeds = itertools.count(1)  # one fresh prompt per request


@attrs.frozen
class Stream:
    """Timestamps (``time.perf_counter``) of one generation and the number of tokens it produced."""

    start: float
    first: float
    last: float
    tokens: int

    @property
    def ttft(self) -> float:
        return self.first - self.start

    @property
    def decode_rate(self) -> float:
        """Tokens after the first, per second from the first token to the last."""
        return (self.tokens - 1) / (self.last - self.first)


def random_prompt(length: int, seed: int) -> list[int]:
    """Ordinary (non-special) token ids; a fresh seed gives a prompt no cache has seen."""
    return np.random.default_rng(seed).integers(1000, 40000, length).tolist()


# -- the two engines ---------------------------------------------------------------------


async def jax_stream(executor: JaxExecutor, ids: list[int], max_tokens: int) -> Stream:
    request = Request(id=f"bench-{next(_request_ids)}", model=executor.model.id, prompt_token_ids=ids,
                      sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
    start = time.perf_counter()
    first, count = None, 0
    async for chunk in executor.generate(request):
        if chunk.token_ids:
            now = time.perf_counter()
            first = now if first is None else first
            count += len(chunk.token_ids)
    assert first is not None and count == max_tokens, (first, count)
    return Stream(start, first, now, count)


def llama_cpp_stream(llm: Any, ids: list[int], max_tokens: int) -> Stream:
    llm.reset()  # drop the previous prompt: no prefix reuse
    start = time.perf_counter()
    first, count = None, 0
    for _ in llm.generate(ids, top_k=1, temp=0.0, repeat_penalty=1.0):  # greedy; never stops at EOS
        now = time.perf_counter()
        first = now if first is None else first
        count += 1
        if count == max_tokens:
            break
    assert first is not None
    return Stream(start, first, now, count)


def load_llama_cpp(path: Path) -> Any:
    try:
        import llama_cpp
    except ImportError:
        return None
    threads = os.cpu_count() or 1
    return llama_cpp.Llama(model_path=str(path), n_ctx=1024, n_batch=512, n_threads=threads,
                           n_threads_batch=threads, verbose=False)


# -- what is measured ----------------------------------------------------------------------


async def measure_concurrent_decode(executor: JaxExecutor, streams: int, max_tokens: int, rounds: int) -> dict:
    """``streams`` short-prompt requests at once; one untimed warm-up round compiles the shapes."""
    per_stream, aggregate, end_to_end = [], [], []
    for round_ in tqdm(range(rounds + 1), desc=f"decode x{streams}", leave=False):
        results = await asyncio.gather(*(jax_stream(executor, random_prompt(SHORT_LEN, next(_seeds)), max_tokens)
                                         for _ in range(streams)))
        if round_ == 0:
            continue  # warm-up
        first, last = min(r.first for r in results), max(r.last for r in results)
        per_stream.append(median([r.decode_rate for r in results]))
        aggregate.append(sum(r.tokens - 1 for r in results) / (last - first))
        end_to_end.append(sum(r.tokens for r in results) / (last - min(r.start for r in results)))
    return {"streams": streams, "per_stream_tok_s": median(per_stream), "aggregate_decode_tok_s": median(aggregate),
            "aggregate_e2e_tok_s": median(end_to_end)}


async def measure_single_stream(executor: JaxExecutor, llm: Any, max_tokens: int, rounds: int) -> dict:
    """Prefill 512, short-prompt TTFT and batch-1 decode, JAX and llama.cpp in alternating rounds."""
    engines = {"jax": lambda ids, n: jax_stream(executor, ids, n)}
    if llm is not None:
        async def llama(ids: list[int], n: int) -> Stream:
            return llama_cpp_stream(llm, ids, n)
        engines["llama_cpp"] = llama
    samples: dict[str, dict[str, list[float]]] = {
        name: {"prefill": [], "ttft": [], "decode": [], "e2e": []} for name in engines}
    for round_ in tqdm(range(rounds + 1), desc="single stream" + (" (A/B)" if llm else ""), leave=False):
        for name, stream in engines.items():  # A B A B …: never both at once
            prefill = await stream(random_prompt(PREFILL_LEN, next(_seeds)), 1)
            short = await stream(random_prompt(SHORT_LEN, next(_seeds)), 1)
            decode = await stream(random_prompt(SHORT_LEN, next(_seeds)), max_tokens)
            if round_ > 0:  # round 0 is the warm-up
                samples[name]["prefill"].append(prefill.ttft)
                samples[name]["ttft"].append(short.ttft)
                samples[name]["decode"].append(decode.decode_rate)
                samples[name]["e2e"].append(decode.tokens / (decode.last - decode.start))
    return {name: {"prefill_512_ttft_s": median(s["prefill"]), "prefill_tok_s": PREFILL_LEN / median(s["prefill"]),
                   "ttft_short_s": median(s["ttft"]), "decode_batch1_tok_s": median(s["decode"]),
                   "decode_batch1_e2e_tok_s": median(s["e2e"])}
            for name, s in samples.items()}


def measure_copy_bandwidth(mib: int = 512, repeats: int = 5) -> float:
    """Bytes moved per second (read + written) by a numpy copy of ``mib`` MiB, best of ``repeats``."""
    src = np.ones(mib * 2**20 // 8)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - start)
    return 2 * src.nbytes / best


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


# -- the run -------------------------------------------------------------------------------


async def run(args: argparse.Namespace) -> dict:
    levels = [1, 8, 16] if args.quick else [1, 8, 16, 32]
    max_tokens = 32 if args.quick else 128
    rounds = args.rounds or (2 if args.quick else 5)
    executor = JaxExecutor(JaxOptions(weights_dtype=args.weights_dtype, max_batch=max(32, *levels)))
    started = time.perf_counter()
    await executor.start()
    load_s = time.perf_counter() - started
    assert executor.engine is not None
    runner = executor.engine.runner
    weight_bytes = sum(leaf.nbytes for leaf in jax.tree.leaves(runner.params))
    kv_bytes_per_token = sum(a.nbytes for a in jax.tree.leaves(runner.cache)) // (runner.num_blocks * runner.block_size)
    try:
        # compile the prefill-512 shapes now, so that the peak RSS read below covers them
        await jax_stream(executor, random_prompt(PREFILL_LEN, next(_seeds)), 1)
        multi = [await measure_concurrent_decode(executor, n, max_tokens, rounds) for n in levels if n > 1]
        peak_rss = peak_rss_bytes()  # the JAX executor alone: llama.cpp is not loaded yet
        llm = load_llama_cpp(executor.path)
        single = await measure_single_stream(executor, llm, max_tokens, rounds)
    finally:
        await executor.stop()
    bandwidth = measure_copy_bandwidth()
    jax_single = single["jax"]
    batch1 = jax_single["decode_batch1_tok_s"]
    decode = [{"streams": 1, "per_stream_tok_s": batch1, "aggregate_decode_tok_s": batch1,
               "aggregate_e2e_tok_s": jax_single["decode_batch1_e2e_tok_s"]}, *multi]
    result: dict = {
        "config": {"weights_dtype": args.weights_dtype, "rounds": rounds, "quick": args.quick,
                   "streams": levels, "prefill_len": PREFILL_LEN, "short_prompt_len": SHORT_LEN,
                   "decode_tokens": max_tokens,
                   "prefill_chunk": executor.options.prefill_chunk, "model": executor.path.name},
        "machine": {"cpu_count": os.cpu_count(), "python": platform.python_version(), "jax": jax.__version__,
                    "numpy": np.__version__, "llama_cpp": getattr(sys.modules.get("llama_cpp"), "__version__", None)},
        "load_s": load_s,
        "jax": {**jax_single, "decode": decode},
        "memory": {"peak_rss_bytes": peak_rss, "kv_cache_bytes_per_token": kv_bytes_per_token,
                   "weights_bytes": weight_bytes},
        "bandwidth": {"copy_bytes_per_s": bandwidth, "batch1_bound_tok_s": bandwidth / weight_bytes,
                      "mbu_batch1": batch1 * weight_bytes / bandwidth},
    }
    if "llama_cpp" in single:
        peer = single["llama_cpp"]
        file_bytes = executor.path.stat().st_size  # llama.cpp reads the quantized tensors once per token
        result["llama_cpp"] = {**peer, "measured": True,
                               "mbu_batch1_file_bytes": peer["decode_batch1_tok_s"] * file_bytes / bandwidth}
    else:  # the cited figures under the measured names; "measured": False says what they are
        cited = CITED_LLAMA_CPP
        peer = {"prefill_512_ttft_s": PREFILL_LEN / cited["prefill_512_tok_s"],
                "prefill_tok_s": cited["prefill_512_tok_s"], "ttft_short_s": cited["ttft_5_token_prompt_s"],
                "decode_batch1_tok_s": cited["decode_batch1_short_prompt_tok_s"]}
        result["llama_cpp"] = {**peer, "measured": False, "skipped": "llama_cpp is not importable", "cited": cited}
    ratio_key = "ratio_jax_over_llama_cpp" if result["llama_cpp"]["measured"] else "ratio_jax_over_cited_llama_cpp"
    result[ratio_key] = {key: jax_single[key] / peer[key] for key in peer if key in jax_single}
    return result


def print_report(r: dict) -> None:
    m, jx, mem, bw = r["machine"], r["jax"], r["memory"], r["bandwidth"]
    print(f"jax {m['jax']} · numpy {m['numpy']} · Python {m['python']} · {m['cpu_count']} CPUs · "
          f"llama_cpp {m['llama_cpp'] or 'not installed'}")
    c = r["config"]
    print(f"{c['model']}, weights {c['weights_dtype']}, medians over {c['rounds']} timed round(s), "
          f"{c['decode_tokens']} new tokens per stream, prefill chunk {c['prefill_chunk']}; load {r['load_s']:.1f} s\n")
    peer = r["llama_cpp"]
    measured = peer["measured"]
    ratio = r["ratio_jax_over_llama_cpp" if measured else "ratio_jax_over_cited_llama_cpp"]
    label = "llama.cpp" if measured else "llama.cpp (cited)"
    rows = [("prefill 512 tokens, tok/s", "prefill_tok_s"), ("prefill 512 tokens, TTFT s", "prefill_512_ttft_s"),
            (f"TTFT {SHORT_LEN}-token prompt, s", "ttft_short_s"), ("decode batch 1, tok/s", "decode_batch1_tok_s")]
    print(f"{'single stream':30} {'JAX':>10} {label:>18} {'JAX ÷ llama.cpp':>16}")
    for name, key in rows:
        print(f"{name:30} {jx[key]:10.3f} {peer[key]:18.3f} {ratio[key]:16.2f}")
    if measured:
        print("(TTFT: lower is better; measured in alternating rounds)\n")
    else:
        print(f"(TTFT: lower is better. {peer['skipped']}, so llama.cpp was skipped: its column is CITED, not "
              f"measured, from {CITED_LLAMA_CPP['source']} (another run, idle machine; TTFT for a 5-token prompt))\n")
    print(f"{'decode, streams':16} {'per stream tok/s':>17} {'aggregate decode':>17} {'aggregate e2e':>14}")
    for d in jx["decode"]:
        print(f"{d['streams']:<16} {d['per_stream_tok_s']:17.1f} {d['aggregate_decode_tok_s']:17.1f} "
              f"{d['aggregate_e2e_tok_s']:14.1f}")
    print("llama.cpp with several streams: not measured (it needs the low-level batch API); CITED from "
          f"NOTES-executor.md, aggregate tok/s by streams: batch API {CITED_LLAMA_CPP['batch_api_aggregate_tok_s']}, "
          f"Python server {CITED_LLAMA_CPP['python_server_aggregate_tok_s']}\n")
    print(f"peak RSS (JAX executor) {mem['peak_rss_bytes'] / 2**20:.0f} MiB · KV cache "
          f"{mem['kv_cache_bytes_per_token']} bytes/token · weights {mem['weights_bytes'] / 1e6:.0f} MB as held")
    print(f"copy bandwidth {bw['copy_bytes_per_s'] / 1e9:.1f} GB/s read + written ({bw['copy_bytes_per_s'] / 2e9:.1f} "
          f"GB/s counting the array once) → batch-1 bound "
          f"{bw['batch1_bound_tok_s']:.1f} tok/s; MBU {bw['mbu_batch1']:.0%}"
          + (f"; llama.cpp MBU (file bytes) {peer['mbu_batch1_file_bytes']:.0%}" if measured else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds, 1, 8 and 16 streams, 32 new tokens")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line of stdout")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds per figure (default 5, quick 2)")
    parser.add_argument("--weights-dtype", choices=["float32", "bfloat16"], default="float32")
    args = parser.parse_args()
    configure_logging(level="WARNING")  # logs to stderr: stdout is the report
    print(f"model {smollm2_path().name}, jax {jax.__version__}, {os.cpu_count()} CPUs", file=sys.stderr)
    result = asyncio.run(run(args))
    print_report(result)
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
