"""``lamina status`` and ``lamina ab report``: a running server, read from its ``/metrics``."""

from __future__ import annotations

import argparse
from typing import Any


def _cmd_status(args: argparse.Namespace) -> int:
    from lamina.tools.status import run

    return run(args.url, interval=args.interval, once=args.once)


def _cmd_ab_report(args: argparse.Namespace) -> int:
    from lamina.tools.ab_report import run

    return run(args.source, layer=args.layer, baseline=args.baseline, html_path=args.html, as_json=args.json,
               resamples=args.resamples, confidence=args.confidence, seed=args.seed)


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0; got {text}")
    return value


def _count(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1; got {text}")
    return value


def _share(text: str) -> float:
    value = float(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1; got {text}")
    return value


def add_parsers(sub: Any) -> None:
    status = sub.add_parser("status", help="one refreshing screen on a running server: replicas, load, SLOs, A/B arms")
    status.add_argument("url", help="the server's base URL, e.g. http://127.0.0.1:8000")
    status.add_argument("--interval", type=_positive, default=2.0, metavar="SECONDS",
                        help="seconds between refreshes (default 2)")
    status.add_argument("--once", action="store_true", help="print one screen as plain text and exit")
    status.set_defaults(func=_cmd_status)

    ab = sub.add_parser("ab", help="A/B splits of a running server").add_subparsers(dest="ab", required=True)
    report = ab.add_parser("report", help="per-arm requests, errors and latency percentiles with confidence "
                                          "intervals, and which differences from the baseline are significant")
    report.add_argument("source", help="a server's base URL (reads URL/metrics) or a saved snapshot "
                                       "(curl URL/metrics > snapshot.txt)")
    report.add_argument("--layer", help="group by this split layer's arm only (e.g. router), summing the others")
    report.add_argument("--baseline", metavar="ARM", help="the arm compared against (default: control, "
                                                          "else the first by name)")
    report.add_argument("--html", metavar="FILE", help="also write a self-contained HTML page with CDF plots")
    report.add_argument("--json", action="store_true", help="print one JSON object instead of the tables")
    report.add_argument("--resamples", type=_count, default=2000, help="bootstrap redraws (default 2000)")
    report.add_argument("--confidence", type=_share, default=0.95, help="interval confidence (default 0.95)")
    report.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    report.set_defaults(func=_cmd_ab_report)
