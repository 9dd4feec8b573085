"""Figures and tables on a terminal (with ``rich``), as ``lamina status`` and ``lamina ab report`` print them."""

from __future__ import annotations

from rich import box
from rich.table import Table

DASH = "–"


def fmt_num(value: float | None, fmt: str = "{:.0f}") -> str:
    return DASH if value is None else fmt.format(value)


def fmt_pct(value: float | None) -> str:
    """A share (0 to 1) as a percentage, ``–`` for None."""
    return fmt_num(None if value is None else value * 100, "{:.1f}%")


def fmt_secs(value: float | None, *, signed: bool = False) -> str:
    """Seconds as ``"1.25 s"`` or ``"12.5 ms"`` (``"+12.5 ms"`` when ``signed``), ``–`` for None."""
    if value is None:
        return DASH
    sign = "+" if signed else ""
    return f"{value:{sign}.3g} s" if abs(value) >= 1 else f"{value * 1e3:{sign}.3g} ms"


def rich_table(title: str, *columns: str) -> Table:
    """A borderless table with a bold title; columns after the first are right-aligned."""
    table = Table(*columns, title=title, title_justify="left", title_style="bold", box=box.SIMPLE_HEAD,
                  show_edge=False)
    for column in table.columns[1:]:
        column.justify = "right"
    return table
