"""Writing results: JSON (config, summaries, comparisons, every request), a self-contained HTML
report (tables and latency CDFs as inline SVG, no scripts or network), and a text table."""

from __future__ import annotations

import html
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lamina.tools.htmlreport import line_svg, page, table

_LATENCY_ROWS = (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2e", "E2E latency"))


def write_json(result: dict[str, Any], path: str | Path) -> Path:
    path = Path(path)
    path.write_text(json.dumps(result, indent=1, default=str), encoding="utf-8")
    return path


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.2f}"


def _num(value: float | None, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}f}"


def summary_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """(name, value) lines of one target's summary."""
    rows = [("requests completed / sent", f"{summary['completed']} / {summary['requests']}"),
            ("errors", ", ".join(f"{k}: {v}" for k, v in summary["errors"].items()) or "none"),
            ("duration (s)", _num(summary["duration_s"])),
            ("request throughput (req/s)", _num(summary["request_throughput"])),
            ("output throughput (tok/s)", _num(summary["output_throughput"])),
            ("total token throughput (tok/s)", _num(summary["total_token_throughput"])),
            ("output tokens / request", _num(summary["output_tokens_per_request"], 1))]
    if "goodput" in summary:
        slo = ", ".join(f"{k}≤{v * 1000:g}ms" for k, v in summary["slo"].items())
        rows += [(f"goodput (req/s) [{slo}]", _num(summary["goodput"])),
                 ("SLO attainment", _num(summary["slo_attainment"], 3))]
    for key, name in _LATENCY_ROWS:
        stats = summary[key]
        rows.append((f"{name} mean / p50 / p90 / p99 (ms)",
                     " / ".join(_ms(stats[q]) for q in ("mean", "p50", "p90", "p99"))))
    return rows


def format_text(result: dict[str, Any]) -> str:
    """The summaries and comparisons as plain text, for the terminal."""
    out: list[str] = []
    labels = [t["label"] for t in result["config"]["targets"]]
    for level in result["levels"]:
        out.append(f"== {level['load']} ==")
        summaries = level["summaries"]
        table = [("", *labels)]
        names = [name for name, _ in summary_rows(summaries[labels[0]])]
        values = {label: dict(summary_rows(summaries[label])) for label in labels}
        table += [(name, *(values[label].get(name, "-") for label in labels)) for name in names]
        widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
        out += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in table]
        for label, comparison in level["comparisons"].items():
            out.append(f"-- {label} / {level['baseline']} (ratio, {_ci_name(result)} CI) --")
            for metric, c in comparison.items():
                out.append(f"  {metric:20s} {_num(c['ratio'], 3):>8s}  [{_num(c['ci_low'], 3)}, {_num(c['ci_high'], 3)}]")
        out.append("")
    return "\n".join(out)


def _ci_name(result: dict[str, Any]) -> str:
    config = result["config"]
    return f"{config['confidence'] * 100:g}% bootstrap over {config['bootstrap']}"


# ---------------------------------------------------------------------------------------------- HTML

def cdf_svg(series: Mapping[str, Sequence[float]], title: str, *, width: int = 460, height: int = 300) -> str:
    """An inline SVG of the empirical CDFs of ``series`` (seconds, drawn in ms)."""
    data = {k: sorted(v) for k, v in series.items() if v}
    if not data:
        return line_svg({}, title, width=width, height=height)
    lo = min(v[0] for v in data.values()) * 1000
    hi = max(v[-1] for v in data.values()) * 1000
    lo = max(0.0, lo - (hi - lo) * 0.05)
    hi = hi + (hi - lo) * 0.05 or lo + 1
    steps = {}
    for label, values in data.items():
        step = max(1, len(values) // 800)  # at most ~800 points per line
        points = [(values[0] * 1000, 0.0)]
        for i in range(0, len(values), step):
            x = values[i] * 1000
            points += [(x, i / len(values)), (x, min(i + step, len(values)) / len(values))]
        steps[label] = [*points, (values[-1] * 1000, 1.0)]
    return line_svg(steps, title, x_label="ms", width=width, height=height, x_range=(lo, hi), y_range=(0.0, 1.0))


def _verdict(c: dict[str, Any]) -> str:
    low, high = c["ci_low"], c["ci_high"]
    if low is None or high is None:
        return ""
    if low <= 1 <= high:
        return "no clear difference"
    better = (low > 1) == c["higher_is_better"]
    return "B better" if better else "B worse"


def render_html(result: dict[str, Any]) -> str:
    """The self-contained HTML report."""
    config = result["config"]
    labels = [t["label"] for t in config["targets"]]
    records = result["records"]
    sections = []
    for level in result["levels"]:
        summaries = level["summaries"]
        names = [name for name, _ in summary_rows(summaries[labels[0]])]
        values = {label: dict(summary_rows(summaries[label])) for label in labels}
        rows = [(name, *(values[label].get(name, "-") for label in labels)) for name in names]
        parts = [f"<h2>{html.escape(level['load'])}</h2>"]
        parts.append(table(("metric", *labels), rows))
        for label, comparison in level["comparisons"].items():
            parts.append(f"<h3>{html.escape(label)} vs {html.escape(level['baseline'])}: ratio B/A with "
                         f"{html.escape(_ci_name(result))} CI</h3>")
            parts.append(table(("metric", f"A = {level['baseline']}", f"B = {label}", "B/A", "CI low", "CI high", ""),
                                [(m, _num(c["a"], 4), _num(c["b"], 4), _num(c["ratio"], 3), _num(c["ci_low"], 3),
                                  _num(c["ci_high"], 3), _verdict(c)) for m, c in comparison.items()]))
        counted = [r for r in records if r["level"] == level["load"] and not r["warmup"] and r["ok"]]
        plots = []
        for key, name in _LATENCY_ROWS:
            series = {}
            for label in labels:
                mine = [r for r in counted if r["target"] == label]
                series[label] = ([g for r in mine for g in r["itl"]] if key == "itl"
                                 else [r[key] for r in mine if r[key] is not None])
            plots.append(cdf_svg(series, f"{name} CDF"))
        parts.append('<div class="plots">' + "".join(plots) + "</div>")
        sections.append("\n".join(parts))
    setup = {k: config[k] for k in ("workload", "workload_options", "num_requests", "warmup", "seed", "rounds",
                                    "duration_s", "api", "model", "ignore_eos", "slos", "bootstrap")}
    targets = table(("label", "url", "stack", "model"),
                     [(t["label"], t["url"], t["stack"] or "", str(result["models"].get(t["label"], "")))
                      for t in config["targets"]])
    return page("lamina bench", f"""<p>{html.escape(result['created'])}</p>
{targets}
<pre>{html.escape(json.dumps(setup, indent=1, default=str))}</pre>
{''.join(sections)}""")


def write_html(result: dict[str, Any], path: str | Path) -> Path:
    path = Path(path)
    path.write_text(render_html(result), encoding="utf-8")
    return path


def write_reports(result: dict[str, Any], prefix: str | Path) -> tuple[Path, Path]:
    """``PREFIX.json`` and ``PREFIX.html``; returns their paths."""
    prefix = Path(prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    return (write_json(result, prefix.with_name(prefix.name + ".json")),
            write_html(result, prefix.with_name(prefix.name + ".html")))
