"""Writing results: JSON (config, summaries, comparisons, every request), a self-contained HTML
report (tables and latency CDFs as inline SVG, no scripts or network), and a text table."""

from __future__ import annotations

import html
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")
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
    return curves_svg({label: _ecdf(sorted(values)) for label, values in series.items() if values}, title,
                      width=width, height=height)


def _ecdf(values: Sequence[float]) -> list[tuple[float, float]]:
    """The steps of sorted ``values``' empirical CDF, at most ~800 of them."""
    step = max(1, len(values) // 800)
    points = [(values[0], 0.0)]
    for i in range(0, len(values), step):
        points += [(values[i], i / len(values)), (values[i], min(i + step, len(values)) / len(values))]
    return [*points, (values[-1], 1.0)]


def curves_svg(curves: Mapping[str, Sequence[tuple[float, float]]], title: str, *, width: int = 460,
               height: int = 300) -> str:
    """An inline SVG of CDF curves: per label, ``(seconds, share 0 to 1)`` points joined by lines, drawn in ms."""
    left, right, top, bottom = 52, 12, 26, 40
    pw, ph = width - left - right, height - top - bottom
    data = {k: v for k, v in curves.items() if v}
    parts = [(f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
              f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">'),
             f'<text x="{width / 2}" y="16" text-anchor="middle" font-size="13">{html.escape(title)}</text>',
             f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>']
    if not data:
        parts.append(f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle">no data</text></svg>')
        return "".join(parts)
    lo = min(v for points in data.values() for v, _ in points) * 1000
    hi = max(v for points in data.values() for v, _ in points) * 1000
    lo = max(0.0, lo - (hi - lo) * 0.05)
    hi = max(hi + (hi - lo) * 0.05, lo + 1)  # one distinct value still spans 1 ms
    def x(v: float) -> float:
        return left + (v * 1000 - lo) / (hi - lo) * pw
    def y(p: float) -> float:
        return top + ph - p * ph
    for i in range(6):  # grid and ticks
        xv, yv = lo + (hi - lo) * i / 5, i / 5
        xp = left + pw * i / 5
        parts.append(f'<line x1="{xp:.1f}" y1="{top}" x2="{xp:.1f}" y2="{top + ph}" stroke="#eee"/>'
                     f'<text x="{xp:.1f}" y="{top + ph + 14}" text-anchor="middle">{xv:.3g}</text>'
                     f'<line x1="{left}" y1="{y(yv):.1f}" x2="{left + pw}" y2="{y(yv):.1f}" stroke="#eee"/>'
                     f'<text x="{left - 4}" y="{y(yv) + 4:.1f}" text-anchor="end">{yv:.1f}</text>')
    parts.append(f'<text x="{left + pw / 2}" y="{height - 6}" text-anchor="middle">ms</text>')
    for n, (label, points) in enumerate(data.items()):
        color = _COLORS[n % len(_COLORS)]
        line = " ".join(f"{x(v):.1f},{y(p):.1f}" for v, p in points)
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.6" points="{line}"/>')
        parts.append(f'<rect x="{left + pw - 120}" y="{top + ph - 16 - 14 * n}" width="10" height="3" fill="{color}"/>'
                     f'<text x="{left + pw - 106}" y="{top + ph - 12 - 14 * n}">{html.escape(label)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def html_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """An HTML table of formatted cells (escaped here)."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def html_page(title: str, body: str) -> str:
    """A self-contained page (inline style; no scripts, no network) with heading ``title`` over ``body``."""
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; margin: 0.5em 0 1.5em; }}
th, td {{ border: 1px solid #ccc; padding: 3px 8px; text-align: right; font-size: 13px; }}
th:first-child, td:first-child {{ text-align: left; }}
.plots svg {{ margin: 4px; border: 1px solid #eee; }}
pre {{ background: #f6f6f6; padding: 8px; font-size: 12px; }}
</style></head><body>
<h1>{html.escape(title)}</h1>
{body}
</body></html>
"""


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
        parts.append(html_table(("metric", *labels), rows))
        for label, comparison in level["comparisons"].items():
            parts.append(f"<h3>{html.escape(label)} vs {html.escape(level['baseline'])}: ratio B/A with "
                         f"{html.escape(_ci_name(result))} CI</h3>")
            header = ("metric", f"A = {level['baseline']}", f"B = {label}", "B/A", "CI low", "CI high", "")
            parts.append(html_table(header, [(m, _num(c["a"], 4), _num(c["b"], 4), _num(c["ratio"], 3),
                                              _num(c["ci_low"], 3), _num(c["ci_high"], 3), _verdict(c))
                                             for m, c in comparison.items()]))
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
    targets = html_table(("label", "url", "stack", "model"),
                         [(t["label"], t["url"], t["stack"] or "", str(result["models"].get(t["label"], "")))
                          for t in config["targets"]])
    body = (f"<p>{html.escape(result['created'])}</p>\n{targets}\n"
            f"<pre>{html.escape(json.dumps(setup, indent=1, default=str))}</pre>\n{''.join(sections)}")
    return html_page("lamina bench", body)


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
