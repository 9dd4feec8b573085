"""examples/grafana: every metric the dashboard queries is one a live server exports.

A small PromQL name extractor pulls metric names (and label names) out of each panel's
``expr``; a server with every optional metric family switched on (prefix cache, ``[slo]``,
an A/B split) serves a few requests; its ``/metrics`` must hold every name the dashboard
asks for, so a renamed metric cannot leave a dashboard panel silently empty.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

GRAFANA = Path(__file__).resolve().parents[1] / "examples" / "grafana"

# PromQL's aggregations, functions, operators and modifiers: words in an expression that
# are not metric names. Compared lower-cased (PromQL keywords are case-insensitive).
PROMQL_WORDS = frozenset("""
    sum min max avg group stddev stdvar count count_values bottomk topk quantile limitk limit_ratio
    abs absent absent_over_time ceil changes clamp clamp_max clamp_min day_of_month day_of_week day_of_year
    days_in_month delta deriv exp floor histogram_avg histogram_count histogram_fraction histogram_quantile
    histogram_stddev histogram_stdvar histogram_sum holt_winters double_exponential_smoothing hour idelta
    increase info irate label_join label_replace ln log2 log10 minute month predict_linear rate resets round
    scalar sgn sort sort_desc sort_by_label sort_by_label_desc sqrt time timestamp vector year
    avg_over_time min_over_time max_over_time sum_over_time count_over_time quantile_over_time
    stddev_over_time stdvar_over_time last_over_time present_over_time mad_over_time
    acos acosh asin asinh atan atanh cos cosh sin sinh tan tanh deg rad pi
    by without on ignoring group_left group_right bool and or unless offset atan2 start end inf nan
""".split())

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_SELECTOR = re.compile(r"\{([^{}]*)\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_LABEL_LIST = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^()]*)\)", re.IGNORECASE)
_VARIABLE = re.compile(r"\$\{[^}]*\}|\$\w+|\[\[[^\]]*\]\]")  # Grafana's $var, ${var}, [[var]]
# Numbers and durations (0.95, 1e-9, 0x1f, 5m, 1h30m) before identifiers, so "1e" is no name.
_TOKEN = re.compile(r"(?P<num>(?:0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)[a-zA-Z]*)"
                    r"|(?P<ident>[a-zA-Z_:][a-zA-Z0-9_:]*)")
_MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)\s*\"((?:[^\"\\]|\\.)*)\"")


def _matchers(expr: str) -> Iterator[tuple[str, str]]:
    """``(label, value)`` of every label matcher inside ``{...}``."""
    for selector in _SELECTOR.finditer(expr):
        yield from _MATCHER.findall(selector.group(1))


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads.

    Strings, label matchers, ranges, label lists (``by (...)`` and the like), Grafana
    variables and numbers are dropped; what is left is keywords, function calls and metric
    names. A word followed by ``(`` that is not a known function is an error, not a name.
    """
    names = {value for label, value in _matchers(expr) if label == "__name__"}
    text = _STRING.sub(" ", expr)
    text = _SELECTOR.sub(" ", text)
    text = _RANGE.sub(" ", text)
    text = _LABEL_LIST.sub(r" \1 ", text)
    text = _VARIABLE.sub(" ", text)
    for token in _TOKEN.finditer(text):
        word = token.group("ident")
        if word is None or word.lower() in PROMQL_WORDS:
            continue
        if text[token.end():].lstrip().startswith("("):
            raise ValueError(f"unknown PromQL function {word!r} in {expr!r}")
        names.add(word)
    return names


def label_names(expr: str) -> set[str]:
    """The label names a PromQL expression matches on or groups by."""
    labels = {label for label, _ in _matchers(expr) if label != "__name__"}
    for clause in _LABEL_LIST.finditer(_STRING.sub(" ", expr)):
        labels.update(name.strip() for name in clause.group(2).split(",") if name.strip())
    return labels


def test_the_extractor_finds_metric_names_and_nothing_else() -> None:
    expr = ('histogram_quantile(0.95, sum by (le, arm) (rate(lamina_time_to_first_token_seconds_bucket'
            '{job=~"$job", status!="rate"}[$__rate_interval])))')
    assert metric_names(expr) == {"lamina_time_to_first_token_seconds_bucket"}
    assert label_names(expr) == {"le", "arm", "job", "status"}

    expr = ('(sum by (slo) (rate(bad_total{a="x"}[5m] offset 1h)) / clamp_min(SUM(rate(all_total[1h:1m])), 1e-9))'
            ' / on (slo) group_left max without (instance) (budget) > bool 14.4 or vector(0)'
            ' unless ignoring(x) label_replace(up, "arm", "(none)", "arm", "") and ns:recorded:rate5m * 0x1F')
    assert metric_names(expr) == {"bad_total", "all_total", "budget", "up", "ns:recorded:rate5m"}
    assert label_names(expr) == {"a", "slo", "instance", "x"}

    assert metric_names('{__name__="lamina_backend_up", backend="b"} + ${offset_var} * [[old_style]]') \
        == {"lamina_backend_up"}
    with pytest.raises(ValueError, match="unknown PromQL function 'histogram_quantil'"):
        metric_names("histogram_quantil(0.5, x_bucket)")


def load_dashboard() -> dict[str, Any]:
    return json.loads((GRAFANA / "dashboard.json").read_text())


def all_panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])  # a collapsed row keeps its panels inside


def exprs(dashboard: dict[str, Any]) -> list[str]:
    """Every panel target's expression, plus the expression inside each variable's label_values()."""
    out = [target["expr"] for panel in all_panels(dashboard) for target in panel.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
            match = re.fullmatch(r"\s*label_values\((?:(.*),)?\s*(\w+)\s*\)\s*", query)
            assert match, f"variable {variable['name']}: not a label_values() query: {query!r}"
            if match.group(1):
                out.append(f"{match.group(1)} by ({match.group(2)})")  # the label must exist too
    return out


def test_the_dashboard_is_well_formed() -> None:
    dashboard = load_dashboard()
    assert 36 <= dashboard["schemaVersion"] <= 41
    assert dashboard["uid"] and dashboard["title"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"

    panels = list(all_panels(dashboard))
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids)), f"duplicate panel ids: {sorted(i for i in ids if ids.count(i) > 1)}"
    taken: set[tuple[int, int]] = set()
    for panel in panels:
        pos = panel["gridPos"]
        assert pos["w"] > 0 and pos["h"] > 0 and 0 <= pos["x"] and pos["x"] + pos["w"] <= 24, panel["title"]
        cells = {(x, y) for x in range(pos["x"], pos["x"] + pos["w"]) for y in range(pos["y"], pos["y"] + pos["h"])}
        assert not cells & taken, f"panel {panel['title']!r} overlaps another"
        taken |= cells
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], f"panel {panel['title']!r} has no queries"
        refs = [target["refId"] for target in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            assert target["expr"].strip() and "legendFormat" in target, panel["title"]
            for opening, closing in ("()", "{}", "[]"):
                assert target["expr"].count(opening) == target["expr"].count(closing), target["expr"]

    titles = " ".join(panel["title"] for panel in panels).lower()
    for topic in ("latency", "throughput", "queue", "kv", "prefix", "backend", "slo", "arm"):
        assert topic in titles, f"no panel about {topic}"


def scrape(url: str) -> str:
    """Send a few streamed and non-streamed chat completions, then read /metrics."""
    with httpx.Client(base_url=url, timeout=30) as client:
        for i in range(8):
            body = {"model": "echo", "messages": [{"role": "user", "content": f"a b c {i}"}], "stream": i % 2 == 0}
            if body["stream"]:
                with client.stream("POST", "/v1/chat/completions", json=body) as response:
                    assert response.status_code == 200
                    assert "[DONE]" in "".join(response.iter_text())
            else:
                response = client.post("/v1/chat/completions", json=body)
                assert response.status_code == 200, response.text
        response = client.get("/metrics")
        assert response.status_code == 200
        return response.text


def test_every_metric_the_dashboard_queries_is_exported(live: Any) -> None:
    server = live({
        "executor": {"use": "echo"},
        "prefix_cache": {"use": "radix"},
        "slo": {"ttft_p95_s": 0.5, "itl_p95_s": 0.1, "error_rate": 0.01},
        "ab": {"router": {"sticky_by": "request", "arms": [{"name": "control", "use": "round-robin"},
                                                           {"name": "treatment", "use": "round-robin"}]}},
    })
    samples = [sample for family in text_string_to_metric_families(scrape(server.url))
               for sample in family.samples]
    exported = {sample.name for sample in samples}
    # job and instance are the labels Prometheus adds to every scraped series
    exported_labels = {label for sample in samples for label in sample.labels} | {"job", "instance"}
    assert any(sample.labels.get("arm", "").startswith("router=") for sample in samples
               if sample.name == "lamina_requests_total"), "the A/B split put no arm label on requests"

    dashboard = load_dashboard()
    queried: dict[str, list[str]] = {}
    labels: set[str] = set()
    for expr in exprs(dashboard):
        for name in metric_names(expr):
            queried.setdefault(name, []).append(expr)
        labels |= label_names(expr)
    for panel in all_panels(dashboard):
        for target in panel.get("targets", []):
            labels.update(re.findall(r"\{\{\s*(\w+)\s*\}\}", target.get("legendFormat", "")))

    assert len(queried) >= 20, f"the dashboard queries only {sorted(queried)}"
    missing = {name: queried[name][0] for name in sorted(set(queried) - exported)}
    assert not missing, "the dashboard queries metrics the server does not export:\n" + "\n".join(
        f"  {name}  (in: {expr})" for name, expr in missing.items())
    unknown = sorted(labels - exported_labels)
    assert not unknown, f"the dashboard uses labels no exported series has: {unknown}"


def test_prometheus_config_scrapes_lamina_metrics() -> None:
    text = (GRAFANA / "prometheus.yml").read_text()
    try:
        import yaml
    except ImportError:  # PyYAML is not a dependency of ours; check the text instead
        for needle in ("scrape_configs:", "metrics_path: /metrics", "127.0.0.1:8000", "scrape_interval: 5s"):
            assert needle in text
        return
    config = yaml.safe_load(text)
    (job,) = [job for job in config["scrape_configs"] if job["job_name"] == "lamina"]
    assert job.get("metrics_path", "/metrics") == "/metrics"
    assert job.get("scheme", "http") == "http"
    assert "127.0.0.1:8000" in [target for static in job["static_configs"] for target in static["targets"]]
    assert job.get("scrape_interval", config.get("global", {}).get("scrape_interval")) == "5s"
