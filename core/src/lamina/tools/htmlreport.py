"""Self-contained HTML reports: line plots as inline SVG, tables and the page around them (no
scripts, no network). Used by ``lamina bench`` and ``lamina autoscale replay``."""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")
STYLE = """
body { font-family: sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; font-size: 13px; }
th:first-child, td:first-child { text-align: left; }
.plots svg { margin: 4px; border: 1px solid #eee; }
pre { background: #f6f6f6; padding: 8px; font-size: 12px; }
"""

Points = Sequence[tuple[float, float]]


def line_svg(series: Mapping[str, Points], title: str, *, x_label: str = "", width: int = 460, height: int = 300,
             x_range: tuple[float, float] | None = None, y_range: tuple[float, float] | None = None,
             legend: str = "bottom-right") -> str:
    """An inline SVG plot of one polyline per series (``(x, y)`` points, in order), with a grid,
    tick labels, a legend (``bottom-right`` or ``top-left``) and "no data" when every series is empty."""
    left, right, top, bottom = 52, 12, 26, 40
    pw, ph = width - left - right, height - top - bottom
    data = {k: v for k, v in series.items() if len(v)}
    parts = [(f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
              f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">'),
             f'<text x="{width / 2}" y="16" text-anchor="middle" font-size="13">{html.escape(title)}</text>',
             f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>']
    if not data:
        parts.append(f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle">no data</text></svg>')
        return "".join(parts)
    xlo, xhi = x_range or (min(x for v in data.values() for x, _ in v), max(x for v in data.values() for x, _ in v))
    if y_range is None:
        ys = [y for v in data.values() for _, y in v]
        y_range = (min(0.0, min(ys)), _nice(max(ys) * 1.05))
    ylo, yhi = y_range
    xhi, yhi = (xhi if xhi > xlo else xlo + 1), (yhi if yhi > ylo else ylo + 1)

    def x(v: float) -> float:
        return left + (v - xlo) / (xhi - xlo) * pw

    def y(v: float) -> float:
        return top + ph - (v - ylo) / (yhi - ylo) * ph

    for i in range(6):  # grid and ticks
        xv, yv = xlo + (xhi - xlo) * i / 5, ylo + (yhi - ylo) * i / 5
        parts.append(f'<line x1="{x(xv):.1f}" y1="{top}" x2="{x(xv):.1f}" y2="{top + ph}" stroke="#eee"/>'
                     f'<text x="{x(xv):.1f}" y="{top + ph + 14}" text-anchor="middle">{xv:.3g}</text>'
                     f'<line x1="{left}" y1="{y(yv):.1f}" x2="{left + pw}" y2="{y(yv):.1f}" stroke="#eee"/>'
                     f'<text x="{left - 4}" y="{y(yv) + 4:.1f}" text-anchor="end">{yv:.3g}</text>')
    if x_label:
        parts.append(f'<text x="{left + pw / 2}" y="{height - 6}" text-anchor="middle">{html.escape(x_label)}</text>')
    for n, (label, points) in enumerate(data.items()):
        color = COLORS[n % len(COLORS)]
        line = " ".join(f"{x(a):.1f},{y(b):.1f}" for a, b in points)
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.6" points="{line}"/>')
        key_y = top + ph - 16 - 14 * n if legend == "bottom-right" else top + 8 + 14 * n
        key_x = left + pw - 120 if legend == "bottom-right" else left + 8
        parts.append(f'<rect x="{key_x}" y="{key_y}" width="10" height="3" fill="{color}"/>'
                     f'<text x="{key_x + 14}" y="{key_y + 4}">{html.escape(label)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _nice(value: float) -> float:
    """The least of 1, 2, 2.5, 5 or 10 times a power of ten that is at least ``value`` (> 0), so
    that fifths of it make round ticks."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    return next(power * m for m in (1, 2, 2.5, 5, 10) if power * m >= value * (1 - 1e-9))


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """An HTML table of text cells (escaped)."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def page(title: str, body: str) -> str:
    """A whole HTML document: ``body`` (HTML) under an ``<h1>`` of ``title``."""
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>{STYLE}</style></head><body>
<h1>{html.escape(title)}</h1>
{body}
</body></html>
"""
