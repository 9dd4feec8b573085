"""``lamina status``: the summary of two scrapes, the quantile estimate, and the command
against a live server."""

from __future__ import annotations

import math
import re

import httpx
import pytest
from lamina.tools.bench.servers import free_port
from lamina.cli import main
from lamina.tools.scrape import histogram_quantile, parse_metrics
from lamina.tools.status import Snapshot, rate, render, summarize
from rich.console import Console

CHAT = {"model": "echo", "messages": [{"role": "user", "content": "a b c"}]}
STACK = {"executor": {"use": "echo"}, "slo": {"ttft_p95_s": 0.5, "error_rate": 0.01},
         "ab": {"router": {"sticky_by": "request", "arms": [{"name": "control", "use": "round-robin"},
                                                           {"name": "treatment", "use": "round-robin"}]}}}

METRICS = """\
lamina_backend_up{{backend="a"}} 1
lamina_backend_up{{backend="b"}} 0
lamina_backend_circuit_open{{backend="b"}} 1
lamina_num_requests_running 3
lamina_requests_total{{endpoint="chat",status="200",tenant="t",arm="router=control"}} {control}
lamina_requests_total{{endpoint="chat",status="503",tenant="t",arm="router=control"}} 2
lamina_requests_total{{endpoint="chat",status="200",tenant="t",arm="router=treatment"}} 10
lamina_generation_tokens_total{{tenant="t"}} {tokens}
lamina_spec_decode_num_draft_tokens_total {tokens}
lamina_spec_decode_num_accepted_tokens_total {accepted}
lamina_time_to_first_token_seconds_bucket{{arm="router=control",le="0.1"}} 4
lamina_time_to_first_token_seconds_bucket{{arm="router=control",le="0.5"}} 8
lamina_time_to_first_token_seconds_bucket{{arm="router=control",le="+Inf"}} 8
lamina_slo_threshold{{slo="ttft_p95"}} 0.5
lamina_slo_error_budget{{slo="ttft_p95"}} 0.05
lamina_slo_burn_rate{{slo="ttft_p95",window="5m"}} 14.4
lamina_slo_burn_rate{{slo="ttft_p95",window="1h"}} 0.5
"""


def snapshot(at: float, control: int = 6, tokens: int = 100, accepted: int = 60) -> Snapshot:
    return Snapshot("http://x", at, True, False, parse_metrics(METRICS.format(control=control, tokens=tokens,
                                                                              accepted=accepted)))


@pytest.mark.parametrize(("q", "expected"), [(0.5, 0.3), (0.25, 0.1), (0.125, 0.05), (1.0, 1.0)])
def test_quantile_interpolates_within_the_bucket(q: float, expected: float) -> None:
    buckets = [(0.1, 10.0), (0.5, 30.0), (1.0, 40.0), (math.inf, 40.0)]
    assert histogram_quantile(q, buckets) == pytest.approx(expected)


def test_quantile_in_the_inf_bucket_is_the_highest_finite_bound_and_none_without_observations() -> None:
    assert histogram_quantile(0.95, [(math.inf, 10.0), (0.1, 5.0)]) == 0.1
    assert histogram_quantile(0.5, [(0.1, 0.0), (math.inf, 0.0)]) is None
    assert histogram_quantile(0.5, []) is None


def test_rates_are_counter_deltas_between_scrapes() -> None:
    first, second = snapshot(10.0), snapshot(12.0, control=16, tokens=300)
    assert rate(first, None, "lamina_requests_total") is None
    assert rate(second, first, "lamina_requests_total") == pytest.approx(5.0)
    assert rate(second, first, "lamina_generation_tokens_total") == pytest.approx(100.0)
    restarted = snapshot(14.0, control=0, tokens=40)  # counters restarted: the new total is the increase
    assert rate(restarted, second, "lamina_generation_tokens_total") == pytest.approx(20.0)


def test_summary_of_two_scrapes() -> None:
    summary = summarize(snapshot(12.0, control=16, tokens=300, accepted=110), snapshot(10.0))
    assert [(r.name, r.up, r.circuit_open) for r in summary.replicas] == [("a", True, False), ("b", False, True)]
    assert (summary.load.running, summary.load.requests_per_s) == (3.0, pytest.approx(5.0))
    assert summary.load.drafts_kept == pytest.approx(50 / 200), "of the tokens drafted between the scrapes"
    (slo,) = summary.slos
    assert (slo.name, slo.threshold, slo.budget, slo.burn) == ("ttft_p95", 0.5, 0.05, {"5m": 14.4, "1h": 0.5})
    control, treatment = summary.arms
    assert (control.label, control.requests, control.error_share) == ("router=control", 18.0, pytest.approx(2 / 18))
    assert control.ttft_p50 == pytest.approx(0.1) and control.ttft_p95 == pytest.approx(0.46)
    assert (treatment.requests, treatment.error_share, treatment.ttft_p50) == (10.0, 0.0, None)
    assert summarize(snapshot(10.0)).load.requests_per_s is None
    assert summarize(snapshot(12.0), snapshot(10.0)).load.drafts_kept is None, "nothing drafted in between"


def test_burn_over_one_is_red() -> None:
    console = Console(force_terminal=True, color_system="standard", width=120)
    with console.capture() as captured:
        console.print(render(summarize(snapshot(10.0))))
    red = re.findall(r"\x1b\[1;31m *([\d.]+)\x1b\[0m", captured.get())
    assert red == ["14.40"]


def test_a_failed_refresh_marks_the_screen_stale() -> None:
    console = Console(width=120)
    with console.capture() as captured:
        console.print(render(summarize(snapshot(10.0)), interval=2, error="cannot reach http://x: refused"))
    assert "http://x  stale" in captured.get() and "cannot reach http://x: refused; retrying" in captured.get()


def test_status_once_against_a_live_server(live, capsys: pytest.CaptureFixture[str]) -> None:
    server = live(STACK)
    sent = 24  # sticky by request: both arms get some (all in one arm: odds 2**-23)
    for _ in range(sent):
        httpx.post(f"{server.url}/v1/chat/completions", json=CHAT).raise_for_status()
    assert main(["status", server.url, "--once"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^ local +yes +closed +0 +0 +0\.0% ", out, re.M), out
    assert re.search(r"^ +0 +0 +0\.0% +– +– +– *$", out, re.M), out  # one scrape: no rates yet
    assert re.search(r"^ ttft_p95 +500 ms +5\.0% +0\.00 +0\.00", out, re.M), out
    assert re.search(r"^ error_rate +1\.0% +1\.0% +0\.00 +0\.00", out, re.M), out
    counts = {arm: int(n) for arm, n in re.findall(r"^ router=(control|treatment) +(\d+) +0\.0% ", out, re.M)}
    assert counts.keys() == {"control", "treatment"} and sum(counts.values()) == sent, out


def test_status_of_an_unreachable_url_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    assert main(["status", url, "--once"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith(f"error: cannot reach {url}: ")
    assert captured.err.count("\n") == 1


def test_status_of_a_url_without_lamina_metrics_exits_2(live, capsys: pytest.CaptureFixture[str]) -> None:
    server = live({"executor": {"use": "echo"}})
    assert main(["status", f"{server.url}/v1", "--once"]) == 2
    last = capsys.readouterr().err.splitlines()[-1]  # after the server's own "ready" line
    assert last.startswith(f"error: {server.url}/v1 does not serve Lamina metrics: Client error '404 Not Found'")
