"""The ``lamina`` command: one entry point, one module per command group.

``stack`` (plugins, check, route explain), ``serve`` (serve, worker), ``autoscale`` (autoscale
replay), ``observe`` (status, ab report) and ``bench``; the work itself lives in the kernel, the
servers and :mod:`lamina.tools`.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from lamina.cli import autoscale, bench, observe, serve, stack
from lamina.cli.extras import missing_tool
from lamina.kernel.logging import configure_logging


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lamina", description="Lamina: a plugin microkernel for LLM serving.")
    parser.add_argument("--log-level", default="WARNING", help="log level (default WARNING)")
    parser.add_argument("--log-json", action="store_true", default=None, help="JSON logs even on a TTY")
    sub = parser.add_subparsers(dest="command", required=True)
    for group in (stack, serve, autoscale, observe, bench):
        group.add_parsers(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(level=args.log_level, json=args.log_json)
    try:
        return int(args.func(args))
    except ModuleNotFoundError as exc:  # a tool's command without the tools extra
        return missing_tool(args.command, exc)
