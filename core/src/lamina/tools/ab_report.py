"""``lamina ab report SOURCE``: each A/B arm's requests, error rates and TTFT / inter-token /
end-to-end percentiles with bootstrap confidence intervals, and whether each arm differs from
the baseline arm.

SOURCE is a running server's URL (its ``/metrics`` is read) or a saved snapshot of it
(``curl URL/metrics > snapshot.txt``). :func:`build_report` turns the samples into plain data;
:func:`render_text` and :func:`render_html` draw it.

Latencies are Prometheus histograms, so only bucket counts are known. A percentile is
interpolated linearly within the bucket it falls in (:func:`lamina.tools.scrape.histogram_quantile`),
so its resolution is limited by the bucket bounds (:data:`lamina.server.metrics.LATENCY_BUCKETS`):
arms whose percentiles fall in the same bucket differ only by the interpolation, and one past
the last finite bound reads as that bound. The bootstrap redraws an arm's ``n`` observations
from its bucket shares (a multinomial, ``n`` the observed count), recomputes the percentile,
and takes the percentile interval of those redraws; an arm differs significantly from the
baseline when the interval of (arm − baseline), from independent redraws of both, excludes 0.
Error rates (5xx shares) are compared with Fisher's exact test when scipy is installed, else
a two-proportion z-test.

Caveats: the redraws treat observations as independent, which the inter-token gaps of one
request are not, so inter-token intervals come out too narrow when requests differ a lot. Each
figure is tested on its own, with no correction for the ten per arm: at 95%, about one figure
in twenty is flagged by chance alone.
"""

from __future__ import annotations

import html
import json
import math
import sys
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from statistics import NormalDist
from typing import Any

import attrs
import httpx
import numpy as np
from rich.console import Console, Group, RenderableType
from rich.padding import Padding
from rich.text import Text

from lamina.tools import htmlreport
from lamina.kernel import metric_names as m
from lamina.tools.scrape import TIMEOUT_S, Labels, Samples, ScrapeError, fetch_metrics, histogram_quantile, parse_metrics
from lamina.tools.terminal import DASH, fmt_pct, fmt_secs, rich_table

LATENCIES = (("ttft", "TTFT", m.TTFT),
             ("itl", "inter-token", m.ITL),
             ("e2e", "end-to-end", m.E2E))
"""(key, title, histogram) of each latency reported."""
QUANTILES = (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))
Buckets = tuple[tuple[float, float], ...]
"""A histogram's cumulative ``(le, count)`` buckets in order of ``le``, ``+Inf`` last."""


class ReportError(Exception):
    """The source cannot be read or holds nothing to report."""


@attrs.frozen
class Estimate:
    value: float | None  # None without observations
    low: float | None
    high: float | None


@attrs.frozen
class Latency:
    count: float
    buckets: Buckets
    quantiles: dict[str, Estimate]  # "p50" → estimate


@attrs.frozen
class ArmReport:
    label: str  # "router=treatment"; with --layer, that layer's assignment only
    requests: float
    errors: float  # 5xx
    error_rate: float | None
    client_errors: float  # 4xx
    client_error_rate: float | None
    latency: dict[str, Latency]  # "ttft" → latency


@attrs.frozen
class Comparison:
    """One figure of an arm against the baseline: ``difference`` is arm − baseline."""

    arm: str
    metric: str  # "ttft_p50", ..., "error_rate"
    baseline_value: float | None
    value: float | None
    difference: float | None
    low: float | None
    high: float | None
    p_value: float | None  # error rate only
    significant: bool


@attrs.frozen
class Report:
    source: str
    layer: str | None
    baseline: str
    confidence: float
    resamples: int
    seed: int
    error_test: str
    unassigned: float  # requests without an arm (refused before assignment, or outside --layer's split)
    arms: list[ArmReport]
    comparisons: list[Comparison]


# ---------------------------------------------------------------------------------------------- data

def load(source: str) -> Samples:
    """The samples of a server's ``/metrics`` (an http(s) URL) or of a saved snapshot file."""
    if source.startswith(("http://", "https://")):
        with httpx.Client(timeout=TIMEOUT_S) as client:
            return fetch_metrics(client, source.rstrip("/"))
    try:
        return parse_metrics(Path(source).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ReportError(f"cannot read {source}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ReportError(f"{source} is not Prometheus text: {(str(exc).splitlines() or ['?'])[0]}") from None


def _arm(labels: Labels, layer: str | None) -> str:
    """The group of a series: its arm label, or with ``layer`` that layer's part of it ("" if none)."""
    label = labels.get("arm", "")
    if layer is None:
        return label
    arms = dict(part.partition("=")[::2] for part in label.split(",") if part)
    return f"{layer}={arms[layer]}" if layer in arms else ""


def _requests(samples: Samples, layer: str | None) -> dict[str, dict[str, float]]:
    """Arm → {"requests", "5xx", "4xx"} counts."""
    counts: dict[str, dict[str, float]] = defaultdict(lambda: {"requests": 0.0, "5xx": 0.0, "4xx": 0.0})
    for labels, value in samples.get(m.REQUESTS + "_total", ()):
        arm, status = counts[_arm(labels, layer)], int(labels.get("status", "0"))
        arm["requests"] += value
        if status >= 400:
            arm["5xx" if status >= 500 else "4xx"] += value
    return counts


def _buckets(samples: Samples, histogram: str, layer: str | None) -> dict[str, Buckets]:
    """Arm → ``histogram``'s cumulative buckets, summed over the series of the arm."""
    summed: dict[str, dict[float, float]] = defaultdict(lambda: defaultdict(float))
    for labels, value in samples.get(f"{histogram}_bucket", ()):
        summed[_arm(labels, layer)][float(labels["le"])] += value
    return {arm: tuple(sorted(by_le.items())) for arm, by_le in summed.items()}


def _names(arm: str) -> set[str]:
    return {part.partition("=")[2] for part in arm.split(",")}


def _baseline(arms: Sequence[str], wanted: str | None) -> str:
    """``wanted`` (a label or an arm name in it), else the arm named "control", else the first."""
    if wanted is None:
        return next((arm for arm in arms if "control" in _names(arm)), arms[0])
    matches = [arm for arm in arms if wanted == arm] or [arm for arm in arms if wanted in _names(arm)]
    if len(matches) != 1:
        raise ReportError(f"--baseline {wanted!r} matches {len(matches)} arms; arms: {', '.join(arms)}")
    return matches[0]


def _redraws(buckets: Buckets, rng: np.random.Generator, resamples: int) -> np.ndarray | None:
    """The :data:`QUANTILES` of ``resamples`` multinomial redraws of ``buckets``, one row each; None if empty."""
    n = round(buckets[-1][1]) if buckets else 0
    if n <= 0:
        return None
    bounds = [le for le, _ in buckets]
    shares = np.diff([count for _, count in buckets], prepend=0.0).clip(min=0)
    redrawn = np.cumsum(rng.multinomial(n, shares / shares.sum(), size=resamples), axis=1).tolist()
    return np.array([[histogram_quantile(q, zip(bounds, row)) for _, q in QUANTILES] for row in redrawn])


def _interval(draws: np.ndarray, confidence: float) -> tuple[float, float]:
    tail = (1 - confidence) / 2
    low, high = np.quantile(draws, [tail, 1 - tail])
    return float(low), float(high)


def _latency(buckets: Buckets, draws: np.ndarray | None, confidence: float) -> Latency:
    quantiles = {}
    for j, (name, q) in enumerate(QUANTILES):
        ci = (None, None) if draws is None else _interval(draws[:, j], confidence)
        quantiles[name] = Estimate(histogram_quantile(q, buckets), *ci)
    return Latency(buckets[-1][1] if buckets else 0.0, buckets, quantiles)


def _share(part: float, whole: float) -> float | None:
    return part / whole if whole else None


def z_test(x1: float, n1: float, x2: float, n2: float) -> float:
    """The two-sided p-value of the pooled two-proportion z-test of ``x1/n1`` against ``x2/n2``."""
    pooled = (x1 + x2) / (n1 + n2)
    se = math.sqrt(pooled * (1 - pooled) * (1 / n1 + 1 / n2))
    return 1.0 if se == 0 else 2 * (1 - NormalDist().cdf(abs(x1 / n1 - x2 / n2) / se))


def error_test() -> tuple[str, Callable[[float, float, float, float], float]]:
    """(name, p-value of ``x1/n1`` against ``x2/n2``): Fisher's exact test, or the z-test without scipy."""
    try:
        from scipy.stats import fisher_exact
    except ImportError:
        return "two-proportion z-test (install scipy for Fisher's exact test)", z_test

    def fisher(x1: float, n1: float, x2: float, n2: float) -> float:
        table = [[round(x1), round(n1 - x1)], [round(x2), round(n2 - x2)]]
        return float(fisher_exact(table).pvalue)

    return "Fisher's exact test", fisher


def _error_comparison(arm: ArmReport, base: ArmReport, confidence: float,
                      p_value: Callable[[float, float, float, float], float]) -> Comparison:
    if arm.error_rate is None or base.error_rate is None:
        return Comparison(arm.label, "error_rate", base.error_rate, arm.error_rate, None, None, None, None, False)
    p1, p2 = arm.error_rate, base.error_rate
    half = NormalDist().inv_cdf((1 + confidence) / 2) * math.sqrt(
        p1 * (1 - p1) / arm.requests + p2 * (1 - p2) / base.requests)  # Wald interval of the difference
    p = p_value(arm.errors, arm.requests, base.errors, base.requests)
    return Comparison(arm.label, "error_rate", p2, p1, p1 - p2, p1 - p2 - half, p1 - p2 + half, p,
                      p < 1 - confidence)


def _latency_comparisons(arm: ArmReport, base: ArmReport, draws: dict[str, dict[str, np.ndarray | None]],
                         confidence: float) -> Iterable[Comparison]:
    for key, _, _ in LATENCIES:
        mine, theirs = draws[arm.label][key], draws[base.label][key]
        for j, (q, _) in enumerate(QUANTILES):
            value, baseline = arm.latency[key].quantiles[q].value, base.latency[key].quantiles[q].value
            if mine is None or theirs is None or value is None or baseline is None:
                yield Comparison(arm.label, f"{key}_{q}", baseline, value, None, None, None, None, False)
                continue
            low, high = _interval(mine[:, j] - theirs[:, j], confidence)
            yield Comparison(arm.label, f"{key}_{q}", baseline, value, value - baseline, low, high, None,
                             low > 0 or high < 0)


def build_report(samples: Samples, *, source: str = "the metrics", layer: str | None = None,
                 baseline: str | None = None, resamples: int = 2000, confidence: float = 0.95, seed: int = 0) -> Report:
    """The report of ``samples`` (one scrape of ``/metrics``); :class:`ReportError` without arms."""
    requests = _requests(samples, layer)
    buckets = {key: _buckets(samples, histogram, layer) for key, _, histogram in LATENCIES}
    labels = sorted({*requests, *(arm for by_arm in buckets.values() for arm in by_arm)} - {""})
    if not labels:
        why = f"of layer {layer!r} in {source}: no arm label names that layer" if layer else \
            f"in {source}: no request metric carries an arm label (is an [ab] split configured?)"
        raise ReportError(f"no A/B arms {why}")
    base_label = _baseline(labels, baseline)
    rng = np.random.default_rng(seed)
    draws = {arm: {key: _redraws(buckets[key].get(arm, ()), rng, resamples) for key, _, _ in LATENCIES}
             for arm in labels}
    arms = []
    for arm in labels:
        counts = requests[arm]
        arms.append(ArmReport(
            arm, counts["requests"], counts["5xx"], _share(counts["5xx"], counts["requests"]),
            counts["4xx"], _share(counts["4xx"], counts["requests"]),
            {key: _latency(buckets[key].get(arm, ()), draws[arm][key], confidence) for key, _, _ in LATENCIES}))
    base = next(arm for arm in arms if arm.label == base_label)
    test_name, p_value = error_test()
    comparisons = [c for arm in arms if arm is not base
                   for c in (*_latency_comparisons(arm, base, draws, confidence),
                             _error_comparison(arm, base, confidence, p_value))]
    return Report(source, layer, base_label, confidence, resamples, seed, test_name,
                  requests[""]["requests"] if "" in requests else 0.0, arms, comparisons)


def to_json(report: Report) -> dict[str, Any]:
    """The report as JSON-ready data (the figures, without the raw buckets)."""
    return attrs.asdict(report, filter=lambda attribute, _: attribute.name != "buckets")


# ---------------------------------------------------------------------------------------------- rendering

Table = tuple[str, Sequence[str], list[Sequence[str]]]
"""(title, header, rows) of formatted cells, drawn by both renderers."""


def _estimate(e: Estimate) -> str:
    return DASH if e.value is None else f"{fmt_secs(e.value)} [{fmt_secs(e.low)}, {fmt_secs(e.high)}]"


def _points(value: float | None) -> str:
    return DASH if value is None else f"{value * 100:+.2f} pp"


def _metric_title(metric: str) -> str:
    if metric == "error_rate":
        return "5xx share"
    key, _, q = metric.rpartition("_")
    return f"{next(title for k, title, _ in LATENCIES if k == key)} {q}"


def _comparison_row(c: Comparison) -> Sequence[str]:
    rate = c.metric == "error_rate"
    fmt = fmt_pct if rate else fmt_secs
    diff = _points if rate else lambda v: fmt_secs(v, signed=True)
    ci = DASH if c.low is None else f"[{diff(c.low)}, {diff(c.high)}]"
    return (c.arm, _metric_title(c.metric), fmt(c.baseline_value), fmt(c.value), diff(c.difference), ci,
            DASH if c.p_value is None else f"{c.p_value:.3g}", "yes" if c.significant else "no")


def tables(report: Report) -> list[Table]:
    """The report's tables: one per latency, requests and errors, the comparison with the baseline."""
    ci = f"{report.confidence * 100:g}% CI"
    out: list[Table] = [
        (f"{title} latency: percentile [{ci}]", ("arm", "count", "p50", "p95", "p99"),
         [(arm.label, f"{arm.latency[key].count:.0f}",
           *(_estimate(arm.latency[key].quantiles[q]) for q, _ in QUANTILES)) for arm in report.arms])
        for key, title, _ in LATENCIES]
    out.append(("Requests and errors", ("arm", "requests", "5xx", "5xx share", "4xx", "4xx share"),
                [(arm.label, f"{arm.requests:.0f}", f"{arm.errors:.0f}", fmt_pct(arm.error_rate),
                  f"{arm.client_errors:.0f}", fmt_pct(arm.client_error_rate)) for arm in report.arms]))
    if report.comparisons:
        out.append((f"Compared with {report.baseline} (arm − baseline)",
                    ("arm", "metric", "baseline", "arm", "difference", ci, "p", "significant"),
                    [_comparison_row(c) for c in report.comparisons]))
    return out


def notes(report: Report) -> list[str]:
    """The lines under the tables: method, and unassigned requests."""
    method = (f"Percentiles interpolated within the /metrics histogram buckets (resolution is the bucket "
              f"bounds); {report.confidence * 100:g}% bootstrap intervals from {report.resamples} redraws "
              f"(seed {report.seed}); significant: the interval of the difference excludes 0. "
              f"5xx shares: {report.error_test}, significant at p < {1 - report.confidence:.3g}.")
    lines = [method]
    if report.unassigned:
        why = f"of layer {report.layer!r} (refused before routing, or outside that split)" if report.layer else \
            "(refused before routing)"
        lines.append(f"Unassigned: {report.unassigned:.0f} requests without an arm {why}.")
    return lines


def _heading(report: Report) -> str:
    layer = f", layer {report.layer}" if report.layer else ""
    return f"A/B report of {report.source}{layer}: baseline {report.baseline}"


def render_text(report: Report) -> RenderableType:
    """The tables for the terminal, with ``rich``."""
    drawn = []
    for title, header, rows in tables(report):
        table = rich_table(title, *header)
        for row in rows:
            table.add_row(*row)
        drawn.append(Padding(table, (1, 0, 0, 0), expand=False))
    return Group(Text(_heading(report), style="bold"), *drawn, Text("\n" + "\n".join(notes(report))))


def _cdf(buckets: Buckets) -> list[tuple[float, float]]:
    """The CDF at the finite bucket bounds (linear in between, as the percentiles), from the last empty
    bound to the first full one."""
    total = buckets[-1][1]
    points = [(0.0, 0.0), *((le, count / total) for le, count in buckets if not math.isinf(le))]
    first = sum(share == 0 for _, share in points) - 1
    last = next((i for i, (_, share) in enumerate(points) if share >= 1), len(points) - 1)
    return points[first:last + 1]


def render_html(report: Report) -> str:
    """A self-contained page: the tables and, per latency, each arm's CDF from its buckets."""
    plots = [htmlreport.line_svg({arm.label: [(seconds * 1000, share) for seconds, share in _cdf(arm.latency[key].buckets)]
                       for arm in report.arms if arm.latency[key].count},
                      f"{title} CDF (from buckets)", x_label="ms", y_range=(0.0, 1.0)) for key, title, _ in LATENCIES]
    body = "\n".join([*(f"<h2>{html.escape(title)}</h2>{htmlreport.table(header, rows)}"
                        for title, header, rows in tables(report)),
                      *(f"<p>{html.escape(line)}</p>" for line in notes(report)),
                      '<div class="plots">' + "".join(plots) + "</div>"])
    return htmlreport.page(_heading(report), body)


def run(source: str, *, layer: str | None, baseline: str | None, html_path: str | None, as_json: bool,
        resamples: int, confidence: float, seed: int) -> int:
    """Print ``source``'s report (text, or one JSON line) and write the HTML page; exit code 2 on errors."""
    try:
        report = build_report(load(source), source=source, layer=layer, baseline=baseline, resamples=resamples,
                              confidence=confidence, seed=seed)
    except (ScrapeError, ReportError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if html_path:
        Path(html_path).write_text(render_html(report), encoding="utf-8")
    if as_json:
        print(json.dumps(to_json(report)))
    else:
        Console(color_system=None, highlight=False, width=200).print(render_text(report), soft_wrap=True)
    return 0
