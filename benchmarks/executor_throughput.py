"""Throughput of the JAX executor on this machine, beside llama.cpp on the same GGUF file.

What it measures, in one run (medians over rounds; every JAX shape is compiled by an untimed
warm-up round before it is timed):

1. prefill: time to first token of a 512-token prompt with ``max_tokens=1``, and 512 / that time;
2. time to first token of a 16-token prompt;
3. decode at 1, 8, 16, 32 and 64 concurrent streams (``--quick``: 1 and 16; ``--streams``: those it
   names, and 1; 128 new tokens each, 32 with ``--quick``; greedy, ``ignore_eos``, 16-token
   prompts): per stream, from its first token to its last (prefill excluded); in aggregate, all
   decoded tokens over the span from the earliest first token to the latest last token; and end to
   end, all generated tokens over the span from submission to the latest last token;
4. peak RSS of this process (the JAX executor; ``resource.getrusage``) and KV-cache bytes per token;
5. the memory-bandwidth bound of batch-1 decode: the weights' bytes as held (all of them are read
   once per token) over a measured copy bandwidth (numpy copy of 512 MiB, best of five, counting
   bytes read plus bytes written), and the model-bandwidth utilisation (MBU) of batch-1 decode;
6. llama.cpp, natively built for this CPU (``scripts/peers/build_llama_cpp.sh``; found by
   ``llama_cpp_peer.find_peer``, or ``--peer PATH``; ``--peer none`` skips it), on the same file
   with ``-t os.cpu_count()``:

   * ``llama-bench -p 512 -n 0``: prefill tok/s (prompt processing alone, no sampling);
   * ``llama-bench -p 16 -n 0``: the time to process a 16-token prompt (beside our short TTFT);
   * ``llama-bench -p 0 -n 128``: batch-1 decode tok/s (from an empty context);
   * ``llama-batched-bench -npp 16 -ntg 128 -npl 1,8,16,32,64``: decode tok/s at each stream count,
     its S_TG t/s column (all streams' generated tokens over the generation time: our aggregate);
   * the peak RSS of the largest of these tool processes (each one's own ``ru_maxrss``, taken by
     a small launcher: a child of this large process would inherit its high-water mark).

   The tools warm up themselves; each llama-bench figure is its mean over ``-r`` repetitions.
   The engines run in alternating rounds (JAX, llama.cpp, JAX, llama.cpp, …), never both at once
   (on 2 cores llama.cpp's threads collapse under contention), and JAX ÷ llama.cpp is printed for
   prefill 512, decode at each stream count and the short prompt. Without the peer, the script
   says so and prints the JAX figures alone.

Prompts are random token ids, different in every round, so no prefix cache can serve them. The
executor decodes one token per sequence per step, as the llama.cpp tools do: prompt lookup
(``speculative_tokens``) is off here and measured by ``speculation.py``.

Run (an idle machine, nothing else running)::

    uv run python benchmarks/executor_throughput.py                  # full: 3 rounds, 1/8/16/32/64 streams
    uv run python benchmarks/executor_throughput.py --quick          # 2 rounds, 1/16 streams, 32 tokens
    uv run python benchmarks/executor_throughput.py --quick --json   # last stdout line: one JSON object
    uv run python benchmarks/executor_throughput.py --peer none      # the JAX executor alone

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
from statistics import median
from typing import Any

import attrs
import jax
import numpy as np
from tqdm import tqdm

from lamina.kernel.logging import configure_logging
from lamina_hookspecs.types import Request, SamplingParams
from lamina_jax import weight_formats
from lamina_jax.executor import JaxExecutor
from lamina_jax.model_runner import bucket
from lamina_jax.options import JaxOptions
from lamina_jax.weights.gguf import smollm2_path
from llama_cpp_peer import (add_peer_argument, describe_machine, load_at_start, machine, parse_batched_bench,
                            parse_llama_bench, peer_info, resolve_peer, run_tool)

PREFILL_LEN = 512
SHORT_LEN = 16

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


# -- the JAX executor ------------------------------------------------------------------------


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


async def jax_concurrent(executor: JaxExecutor, streams: int, max_tokens: int) -> dict[str, float]:
    """``streams`` short-prompt requests at once; and the engine's mean step time, split into the
    model runner's calls and the engine's own host work."""
    assert executor.engine is not None
    before = executor.engine.times
    results = await asyncio.gather(*(jax_stream(executor, random_prompt(SHORT_LEN, next(_seeds)), max_tokens)
                                     for _ in range(streams)))
    after = executor.engine.times
    steps = max(after.steps - before.steps, 1)
    first, last = min(r.first for r in results), max(r.last for r in results)
    return {"step_ms": 1e3 * (after.step_s - before.step_s) / steps,
            "model_ms_per_step": 1e3 * (after.model_s - before.model_s) / steps,
            "host_ms_per_step": 1e3 * (after.host_s - before.host_s) / steps,
            "per_stream_tok_s": median([r.decode_rate for r in results]),
            "aggregate_decode_tok_s": sum(r.tokens - 1 for r in results) / (last - first),
            "aggregate_e2e_tok_s": sum(r.tokens for r in results) / (last - min(r.start for r in results))}


async def jax_round(executor: JaxExecutor, levels: list[int], max_tokens: int) -> dict[str, Any]:
    """One round of every JAX figure: prefill 512, the short prompt's TTFT, decode at every level."""
    prefill = await jax_stream(executor, random_prompt(PREFILL_LEN, next(_seeds)), 1)
    short = await jax_stream(executor, random_prompt(SHORT_LEN, next(_seeds)), 1)
    single = await jax_stream(executor, random_prompt(SHORT_LEN, next(_seeds)), max_tokens)
    decode = {1: {"per_stream_tok_s": single.decode_rate, "aggregate_decode_tok_s": single.decode_rate,
                  "aggregate_e2e_tok_s": single.tokens / (single.last - single.start)}}
    for n in levels:
        if n > 1:
            decode[n] = await jax_concurrent(executor, n, max_tokens)
    return {"prefill_512_ttft_s": prefill.ttft, "ttft_short_s": short.ttft, "decode": decode}


# -- llama.cpp -------------------------------------------------------------------------------


def llama_round(folder: Path, gguf: Path, threads: int, levels: list[int], max_tokens: int,
                repetitions: int) -> dict[str, Any]:
    """One round of every llama.cpp figure, one tool at a time; each tool's argv is kept."""
    common = ["-m", str(gguf), "-t", str(threads)]
    bench = [*common, "-r", str(repetitions), "-o", "json"]
    peaks: list[int] = []

    def tool(name: str, args: list[str]) -> tuple[list[str], str]:
        argv, out, peak = run_tool(folder, name, args)
        peaks.extend([peak] if peak is not None else [])
        return argv, out

    argv_prefill, out = tool("llama-bench", [*bench, "-p", str(PREFILL_LEN), "-n", "0"])
    prefill = _test(parse_llama_bench(out), PREFILL_LEN, 0)
    argv_short, out = tool("llama-bench", [*bench, "-p", str(SHORT_LEN), "-n", "0"])
    short = _test(parse_llama_bench(out), SHORT_LEN, 0)
    argv_decode, out = tool("llama-bench", [*bench, "-p", "0", "-n", str(max_tokens)])
    decode1 = _test(parse_llama_bench(out), 0, max_tokens)
    ctx = -(-max(levels) * (SHORT_LEN + max_tokens + 16) // 256) * 256  # every stream's prompt and output
    argv_batched, out = tool("llama-batched-bench", [
        *common, "-c", str(ctx), "-npp", str(SHORT_LEN), "-ntg", str(max_tokens),
        "-npl", ",".join(map(str, levels)), "--output-format", "jsonl"])
    rows = {int(r["pl"]): r for r in parse_batched_bench(out)}
    missing = [n for n in levels if n not in rows]
    if missing:
        raise RuntimeError(f"llama-batched-bench reported no row for {missing} streams (context {ctx}):\n"
                           f"{out[-2000:]}")
    return {"prefill_tok_s": float(prefill["avg_ts"]), "prompt_short_s": SHORT_LEN / float(short["avg_ts"]),
            "decode_batch1_tok_s": float(decode1["avg_ts"]),
            "batched": {n: {"aggregate_decode_tok_s": float(rows[n]["speed_tg"]),
                            "per_stream_tok_s": float(rows[n]["speed_tg"]) / n} for n in levels},
            "peak_rss_bytes": max(peaks, default=None),
            "argv": {"prefill": argv_prefill, "prompt_short": argv_short, "decode_batch1": argv_decode,
                     "batched": argv_batched}}


def _test(tests: list[dict[str, Any]], n_prompt: int, n_gen: int) -> dict[str, Any]:
    for test in tests:
        if int(test.get("n_prompt", -1)) == n_prompt and int(test.get("n_gen", -1)) == n_gen:
            return test
    raise RuntimeError(f"llama-bench reported no pp{n_prompt}/tg{n_gen} test: {tests}")


# -- memory and bandwidth -------------------------------------------------------------------


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
    levels = args.streams or ([1, 16] if args.quick else [1, 8, 16, 32, 64])
    max_tokens = 32 if args.quick else 128
    rounds = args.rounds or (2 if args.quick else 3)
    repetitions = 2 if args.quick else 5
    threads = os.cpu_count() or 1
    peer = resolve_peer(args.peer)
    load = load_at_start()
    # Plain decoding steps, as llama-bench and llama-batched-bench run: no drafted tokens
    # (`speculation.py` measures those).
    executor = JaxExecutor(JaxOptions(weights_dtype=args.weights_dtype, max_batch=max(32, *levels),
                                      speculative_tokens=0))
    started = time.perf_counter()
    await executor.start()
    load_s = time.perf_counter() - started
    assert executor.engine is not None
    runner = executor.engine.runner
    held = {id(leaf): leaf for p in (runner.params, *(p for p, _ in runner.shape_weights.values()))
            for leaf in jax.tree.leaves(p)}
    weight_bytes = sum(leaf.nbytes for leaf in held.values())
    formats = {f"{kind} {size}": weight_formats.name(*runner.weights_for(kind, size)) for kind, size in runner.shapes()}
    decode_bytes = {n: sum(leaf.nbytes for leaf in jax.tree.leaves(runner.weights_for("decode", bucket(n))[0]))
                    for n in levels}  # the weights a decode step of n streams reads
    batch1_bytes = decode_bytes[1]
    kv_bytes_per_token = sum(a.nbytes for a in jax.tree.leaves(runner.cache)) // (runner.num_blocks * runner.block_size)
    gguf = executor.path
    jax_rounds: list[dict[str, Any]] = []
    llama_rounds: list[dict[str, Any]] = []
    try:
        # round 0 compiles every shape (untimed; llama.cpp's tools warm up themselves), then
        # JAX, llama.cpp, JAX, llama.cpp, …: never both at once
        desc = "rounds (first: JAX warm-up)" + (", JAX then llama.cpp" if peer else "")
        for round_ in tqdm(range(rounds + 1), desc=desc, file=sys.stderr):
            figures = await jax_round(executor, levels, max_tokens)
            if round_ == 0:
                continue
            jax_rounds.append(figures)
            if peer is not None:
                llama_rounds.append(llama_round(peer, gguf, threads, levels, max_tokens, repetitions))
        peak_rss = peak_rss_bytes()  # this process: the JAX executor (llama.cpp ran in child processes)
    finally:
        await executor.stop()
    bandwidth = measure_copy_bandwidth()

    prefill_ttft = median(r["prefill_512_ttft_s"] for r in jax_rounds)
    decode = [{"streams": n, **{key: median(r["decode"][n][key] for r in jax_rounds)
                                for key in ("per_stream_tok_s", "aggregate_decode_tok_s", "aggregate_e2e_tok_s",
                                            "step_ms", "model_ms_per_step", "host_ms_per_step")
                                if key in jax_rounds[0]["decode"][n]}}
              for n in levels]
    batch1 = decode[0]["per_stream_tok_s"]
    jx = {"prefill_512_ttft_s": prefill_ttft, "prefill_tok_s": PREFILL_LEN / prefill_ttft,
          "ttft_short_s": median(r["ttft_short_s"] for r in jax_rounds), "decode_batch1_tok_s": batch1,
          "decode_batch1_e2e_tok_s": decode[0]["aggregate_e2e_tok_s"], "decode": decode,
          "per_round": {"prefill_tok_s": [PREFILL_LEN / r["prefill_512_ttft_s"] for r in jax_rounds],
                        "aggregate_decode_tok_s": {str(n): [r["decode"][n]["aggregate_decode_tok_s"]
                                                            for r in jax_rounds] for n in levels}}}
    result: dict = {
        "config": {"weights_dtype": args.weights_dtype, "rounds": rounds, "quick": args.quick,
                   "streams": levels, "prefill_len": PREFILL_LEN, "short_prompt_len": SHORT_LEN,
                   "decode_tokens": max_tokens, "llama_bench_repetitions": repetitions, "threads": threads,
                   "prefill_chunk": executor.options.prefill_chunk, "model": gguf.name},
        "machine": {**machine(), "jax": jax.__version__, "numpy": np.__version__,
                    "python": platform.python_version(), "load_average_at_start": load},
        "peer": peer_info(peer),
        "load_s": load_s,
        "jax": jx,
        "memory": {"peak_rss_bytes": peak_rss, "kv_cache_bytes_per_token": kv_bytes_per_token,
                   "weights_bytes": weight_bytes, "decode_weights_bytes": {str(n): b for n, b in decode_bytes.items()}},
        "formats": formats,
        "bandwidth": {"copy_bytes_per_s": bandwidth, "batch1_bound_tok_s": bandwidth / batch1_bytes,
                      "mbu_batch1": batch1 * batch1_bytes / bandwidth},
    }
    if peer is None:
        result["llama_cpp"] = {"skipped": "no llama.cpp build (see llama_cpp_peer.py)" if args.peer != "none"
                               else "--peer none"}
        return result
    ll = {"prefill_tok_s": median(r["prefill_tok_s"] for r in llama_rounds),
          "prompt_short_s": median(r["prompt_short_s"] for r in llama_rounds),
          "decode_batch1_tok_s": median(r["decode_batch1_tok_s"] for r in llama_rounds),
          "decode": [{"streams": n, **{key: median(r["batched"][n][key] for r in llama_rounds)
                                       for key in ("per_stream_tok_s", "aggregate_decode_tok_s")}} for n in levels],
          "per_round": {"prefill_tok_s": [r["prefill_tok_s"] for r in llama_rounds],
                        "aggregate_decode_tok_s": {str(n): [r["batched"][n]["aggregate_decode_tok_s"]
                                                            for r in llama_rounds] for n in levels}},
          "argv": llama_rounds[0]["argv"],
          "peak_rss_bytes_largest_process": max((r["peak_rss_bytes"] for r in llama_rounds
                                                 if r["peak_rss_bytes"] is not None), default=None)}
    file_bytes = gguf.stat().st_size  # llama.cpp reads the quantized tensors once per token
    ll["mbu_batch1_file_bytes"] = ll["decode_batch1_tok_s"] * file_bytes / bandwidth
    result["llama_cpp"] = ll
    result["ratio_jax_over_llama_cpp"] = {
        "prefill_512_tok_s": jx["prefill_tok_s"] / ll["prefill_tok_s"],
        "decode_batch1_tok_s": batch1 / ll["decode_batch1_tok_s"],
        "short_prompt_time": jx["ttft_short_s"] / ll["prompt_short_s"],
        "aggregate_decode_tok_s": {str(j["streams"]): j["aggregate_decode_tok_s"] / l["aggregate_decode_tok_s"]
                                   for j, l in zip(jx["decode"], ll["decode"], strict=True)},
    }
    return result


def print_report(r: dict) -> None:
    m, jx, mem, bw, c = r["machine"], r["jax"], r["memory"], r["bandwidth"], r["config"]
    print(f"{describe_machine(m)} · jax {m['jax']} · numpy {m['numpy']} · Python {m['python']}")
    print(f"{c['model']}, weights {c['weights_dtype']}, medians over {c['rounds']} timed round(s), "
          f"{c['decode_tokens']} new tokens per stream, prefill chunk {c['prefill_chunk']}; load {r['load_s']:.1f} s")
    ll = r["llama_cpp"]
    peer = r["peer"]
    measured = "skipped" not in ll
    if measured:
        print(f"llama.cpp {peer['build']} (--version: {peer['version'] or '?'}) from {peer['folder']}, "
              f"-t {c['threads']}, llama-bench -r {c['llama_bench_repetitions']}; alternating rounds\n")
    else:
        print(f"llama.cpp: not measured ({ll['skipped']}); JAX figures alone. "
              "Build the peer with `bash scripts/peers/build_llama_cpp.sh`\n")
    ratio = r.get("ratio_jax_over_llama_cpp", {})

    def row(name: str, ours: float, theirs: float | None, ratio_: float | None, digits: int = 3) -> None:
        extra = (f" {theirs:18.{digits}f} {ratio_:16.2f}" if measured and theirs is not None and ratio_ is not None
                 else "")
        print(f"{name:34} {ours:10.{digits}f}{extra}")

    print(f"{'single stream':34} {'JAX':>10}" + (f" {'llama.cpp':>18} {'JAX ÷ llama.cpp':>16}" if measured else ""))
    row("prefill 512 tokens, tok/s", jx["prefill_tok_s"], ll.get("prefill_tok_s"), ratio.get("prefill_512_tok_s"), 1)
    row("prefill 512 tokens, TTFT s", jx["prefill_512_ttft_s"],
        PREFILL_LEN / ll["prefill_tok_s"] if measured else None, 1 / ratio["prefill_512_tok_s"] if measured else None)
    row(f"TTFT {SHORT_LEN}-token prompt, s", jx["ttft_short_s"], ll.get("prompt_short_s"),
        ratio.get("short_prompt_time"))
    row("decode batch 1, tok/s", jx["decode_batch1_tok_s"], ll.get("decode_batch1_tok_s"),
        ratio.get("decode_batch1_tok_s"), 1)
    if measured:
        print(f"(llama.cpp: llama-bench pp{PREFILL_LEN}, pp{SHORT_LEN} (prompt processing time, no sampling) and "
              f"tg{c['decode_tokens']}; TTFT and times: lower is better)\n")
    else:
        print()
    print(f"{'decode, streams':16} {'JAX per stream':>15} {'JAX aggregate':>14} {'JAX e2e':>9}"
          + (f" {'llama.cpp S_TG':>15} {'JAX ÷ llama.cpp':>16}" if measured else ""))
    for i, d in enumerate(jx["decode"]):
        line = (f"{d['streams']:<16} {d['per_stream_tok_s']:15.1f} {d['aggregate_decode_tok_s']:14.1f} "
                f"{d['aggregate_e2e_tok_s']:9.1f}")
        if measured:
            line += (f" {ll['decode'][i]['aggregate_decode_tok_s']:15.1f} "
                     f"{ratio['aggregate_decode_tok_s'][str(d['streams'])]:16.2f}")
        print(line)
    for d in jx["decode"][1:]:
        print(f"engine step at {d['streams']} streams: {d['step_ms']:.1f} ms, of which model runner "
              f"{d['model_ms_per_step']:.1f} ms and engine host work {d['host_ms_per_step']:.1f} ms")
    if measured:
        print(f"(aggregate decode tok/s; llama.cpp: llama-batched-bench -npp {SHORT_LEN} -ntg {c['decode_tokens']}, "
              "its S_TG t/s column)")
    print()
    print(f"peak RSS (JAX executor) {mem['peak_rss_bytes'] / 2**20:.0f} MiB"
          + (f" · llama.cpp (largest tool process) {ll['peak_rss_bytes_largest_process'] / 2**20:.0f} MiB"
             if measured and ll["peak_rss_bytes_largest_process"] else "")
          + f" · KV cache {mem['kv_cache_bytes_per_token']} bytes/token · weights "
            f"{mem['weights_bytes'] / 1e6:.0f} MB as held")
    print("weight format by shape: " + ", ".join(f"{shape} {fmt}" for shape, fmt in r["formats"].items()))
    print(f"copy bandwidth {bw['copy_bytes_per_s'] / 1e9:.1f} GB/s read + written ({bw['copy_bytes_per_s'] / 2e9:.1f} "
          f"GB/s counting the array once) → batch-1 bound "
          f"{bw['batch1_bound_tok_s']:.1f} tok/s; MBU {bw['mbu_batch1']:.0%}"
          + (f"; llama.cpp MBU (file bytes) {ll['mbu_batch1_file_bytes']:.0%}" if measured else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds, 1 and 16 streams, 32 new tokens")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line of stdout")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds per figure (default 3, quick 2)")
    parser.add_argument("--streams", type=lambda text: sorted({1, *map(int, text.split(","))}), default=None,
                        help="decode stream counts, comma-separated; 1 is always measured "
                             "(default 1,8,16,32,64; quick 1,16)")
    parser.add_argument("--weights-dtype", choices=["auto", *weight_formats.FORMATS], default="auto",
                        help="the executor's weights_dtype (default: auto, as the default stack)")
    add_peer_argument(parser)
    args = parser.parse_args()
    configure_logging(level="WARNING")  # logs to stderr: stdout is the report
    print(f"model {smollm2_path().name}, jax {jax.__version__}, {os.cpu_count()} CPUs; "
          "run on an idle machine, nothing else running", file=sys.stderr)
    result = asyncio.run(run(args))
    print_report(result)
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
