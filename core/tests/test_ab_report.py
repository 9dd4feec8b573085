"""``lamina ab report``: per-arm figures from histogram snapshots, the bootstrap intervals and
significance, ``--layer``, the renderers, and the command against a live server."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from lamina.tools.ab_report import LATENCIES, Comparison, Report, build_report
from lamina.cli import main
from lamina.server.metrics import LATENCY_BUCKETS
from lamina.tools.scrape import parse_metrics
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

CONTROL, TREATMENT = "router=control", "router=treatment"
STACK = {"executor": {"use": "echo"},
         "ab": {"router": {"sticky_by": "request", "arms": [{"name": "control", "use": "round-robin"},
                                                           {"name": "treatment", "use": "round-robin"}]}}}
CHAT = {"model": "echo", "messages": [{"role": "user", "content": "a b c"}], "stream": True}

pytestmark = pytest.mark.usefixtures("restore_logging")  # main() configures logging for the process


def exposition(arms: Mapping[str, Mapping[str, Any]]) -> str:
    """Prometheus text as a server writes it; per arm label ``{"requests": {status: count}, "ttft": [s], ...}``."""
    registry = CollectorRegistry()
    requests = Counter("lamina_requests", "", ["endpoint", "status", "tenant", "arm"], registry=registry)
    histograms = {key: Histogram(name, "", ["arm"], buckets=LATENCY_BUCKETS, registry=registry)
                  for key, _, name in LATENCIES}
    for arm, spec in arms.items():
        for status, count in spec.get("requests", {}).items():
            requests.labels("chat", str(status), "t", arm).inc(count)
        for key, histogram in histograms.items():
            for value in spec.get(key, ()):
                histogram.labels(arm).observe(value)
    return generate_latest(registry).decode()


def latencies(median: float, n: int, seed: int) -> list[float]:
    return np.random.default_rng(seed).lognormal(np.log(median), 0.4, n).tolist()


def arm(ttft_median: float, seed: int, n: int = 400) -> dict[str, Any]:
    return {"requests": {200: n}, "ttft": latencies(ttft_median, n, seed), "e2e": latencies(1.5, n, seed + 1),
            "itl": latencies(0.03, 4 * n, seed + 2)}


def report(arms: Mapping[str, Mapping[str, Any]], **options: Any) -> Report:
    return build_report(parse_metrics(exposition(arms)), **options)


def comparison(r: Report, metric: str, arm: str = TREATMENT) -> Comparison:
    return next(c for c in r.comparisons if c.metric == metric and c.arm == arm)


def test_a_slower_arm_is_significant_with_the_right_sign() -> None:
    arms = {CONTROL: arm(0.05, seed=1), TREATMENT: arm(0.08, seed=2)}
    r = report(arms)
    assert r.baseline == CONTROL
    for q in ("p50", "p95"):
        slower = comparison(r, f"ttft_{q}")
        assert slower.significant and slower.difference > 0 and 0 < slower.low <= slower.high, slower
    faster = comparison(report(arms, baseline="treatment"), "ttft_p50", arm=CONTROL)
    assert faster.significant and faster.difference < 0 and faster.low <= faster.high < 0, faster


def test_arms_from_one_distribution_are_not_flagged() -> None:
    r = report({CONTROL: arm(0.05, seed=1), TREATMENT: arm(0.05, seed=11)})
    latency = [c for c in r.comparisons if c.metric != "error_rate"]
    assert len(latency) == 9 and not any(c.significant for c in latency), [c for c in latency if c.significant]
    assert all(c.low < 0 < c.high for c in latency if c.metric.endswith("p50"))


def test_each_interval_contains_its_point_estimate_and_the_seed_fixes_it() -> None:
    arms = {CONTROL: arm(0.05, seed=1), TREATMENT: arm(0.08, seed=2)}
    r = report(arms, seed=7)
    estimates = [e for a in r.arms for latency in a.latency.values() for e in latency.quantiles.values()]
    assert len(estimates) == 18 and all(e.low <= e.value <= e.high for e in estimates), estimates
    assert r == report(arms, seed=7) and r != report(arms, seed=8)


@pytest.mark.parametrize("scipy", [True, False], ids=["fisher", "z-test"])
@pytest.mark.parametrize(("control", "treatment", "significant"), [
    ((1000, 1), (1000, 100), True),  # 0.1% vs 10%
    ((100, 1), (500, 6), False),  # 1% vs 1.2%
    ((1000, 10), (1000, 12), False),
])
def test_error_rates_are_compared_by_a_test_of_two_proportions(
        scipy: bool, control: tuple[int, int], treatment: tuple[int, int], significant: bool,
        monkeypatch: pytest.MonkeyPatch) -> None:
    if not scipy:
        monkeypatch.setitem(sys.modules, "scipy.stats", None)  # import fails as if not installed
    r = report({label: {"requests": {200: n - errors, 503: errors, 429: 3}}
                for label, (n, errors) in ((CONTROL, control), (TREATMENT, treatment))})
    assert r.error_test.startswith("Fisher" if scipy else "two-proportion z-test")
    treated = next(a for a in r.arms if a.label == TREATMENT)
    assert (treated.requests, treated.errors, treated.client_errors) == (treatment[0] + 3, treatment[1], 3)
    c = comparison(r, "error_rate")
    assert c.significant is significant and (c.p_value < 0.05) is significant
    assert c.difference == pytest.approx(treatment[1] / (treatment[0] + 3) - control[1] / (control[0] + 3))


def test_layer_groups_by_one_layers_arm_and_sums_the_others() -> None:
    arms = {f"codec={codec},router={router}": {"requests": {200: n}, "ttft": [0.03] * n}
            for codec, router, n in (("a", "control", 10), ("b", "control", 20), ("a", "treatment", 30),
                                     ("b", "treatment", 40))}
    arms |= {"codec=a": {"requests": {200: 5}}, "": {"requests": {429: 7}}}
    full = report(arms, resamples=50)
    assert [a.label for a in full.arms] == ["codec=a", *sorted(arms)[2:]] and full.unassigned == 7
    assert full.baseline == "codec=a,router=control"
    by_router = report(arms, layer="router", resamples=50)
    assert [(a.label, a.requests, a.latency["ttft"].count) for a in by_router.arms] == [
        (CONTROL, 30, 30), (TREATMENT, 70, 70)]
    assert by_router.unassigned == 12 and by_router.baseline == CONTROL
    assert [a.label for a in report(arms, layer="codec", resamples=50).arms] == ["codec=a", "codec=b"]


def test_html_has_a_plot_per_latency_and_the_arms(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    snapshot, page = tmp_path / "snapshot.txt", tmp_path / "report.html"
    snapshot.write_text(exposition({CONTROL: arm(0.05, seed=1), TREATMENT: arm(0.08, seed=2)}))
    assert main(["ab", "report", str(snapshot), "--html", str(page), "--resamples", "200"]) == 0
    html = page.read_text()
    assert html.count("<svg") == len(LATENCIES) and "<script" not in html
    for title in ("TTFT CDF", "inter-token CDF", "end-to-end CDF", CONTROL, TREATMENT):
        assert title in html
    out = capsys.readouterr().out
    slower = r"^ router=treatment +TTFT p50 +\d.* ms +\d.* ms +\+\d.* ms +\[\+.*\] +– +yes *$"
    assert re.search(slower, out, re.M), out


def test_a_source_without_arms_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    snapshot = tmp_path / "snapshot.txt"
    snapshot.write_text(exposition({"": {"requests": {200: 3}}}))
    assert main(["ab", "report", str(snapshot)]) == 2
    assert capsys.readouterr().err == f"error: no A/B arms in {snapshot}: no request metric carries an arm label " \
                                      f"(is an [ab] split configured?)\n"
    snapshot.write_text(exposition({CONTROL: {"requests": {200: 3}}}))
    assert main(["ab", "report", str(snapshot), "--layer", "codec"]) == 2
    assert capsys.readouterr().err == f"error: no A/B arms of layer 'codec' in {snapshot}: no arm label names " \
                                      f"that layer\n"
    assert main(["ab", "report", str(snapshot), "--baseline", "other"]) == 2
    assert capsys.readouterr().err == "error: --baseline 'other' matches 0 arms; arms: router=control\n"


def test_report_of_a_live_server_and_of_its_snapshot(live, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    server = live(STACK)
    sent = 20  # sticky by request: both arms get some (all in one arm: odds 2**-19)
    for _ in range(sent):
        with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=CHAT) as response:
            response.raise_for_status()
            response.read()
    assert main(["ab", "report", server.url]) == 0
    out = capsys.readouterr().out
    counts = {arm: int(n) for arm, n in re.findall(r"^ router=(control|treatment) +(\d+) +0 +0\.0% ", out, re.M)}
    assert counts.keys() == {"control", "treatment"} and sum(counts.values()) == sent, out

    snapshot = tmp_path / "snapshot.txt"
    snapshot.write_text(httpx.get(f"{server.url}/metrics").text)
    reports = []
    for source in (server.url, str(snapshot)):
        assert main(["ab", "report", source, "--json"]) == 0
        reports.append(json.loads(capsys.readouterr().out.splitlines()[-1]))
    assert reports[0].pop("source") == server.url and reports[1].pop("source") == str(snapshot)
    assert reports[0] == reports[1] and sum(a["requests"] for a in reports[0]["arms"]) == sent
