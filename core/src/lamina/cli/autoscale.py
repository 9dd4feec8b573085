"""``lamina autoscale replay``: an autoscaler against an arrival trace on a simulated pool (the
logic in :mod:`lamina.tools.autoscale_replay`)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import attrs

from lamina_hookspecs.errors import ConfigError
from lamina.cli.extras import missing_tool
from lamina.kernel.plugins import load_plugins


def _cmd_autoscale_replay(args: argparse.Namespace) -> int:
    from lamina.tools import autoscale_replay as ar

    plugins = load_plugins()
    given = {f.name: getattr(args, f.name) for f in attrs.fields(ar.PoolModel) if getattr(args, f.name) is not None}
    try:
        model = ar.PoolModel(**given)
        options = ar.parse_assignments(args.option, "--option")
        result = ar.replay(args.trace, args.policy, options, model, plugins.registry)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.html:
        ar.write_html(result, args.html)
    print(json.dumps(result, indent=1, default=str) if args.json else ar.format_text(result))
    return 0


def add_parsers(sub: Any) -> None:
    import typing

    autoscale = sub.add_parser("autoscale", help="try autoscalers offline").add_subparsers(
        dest="autoscale", required=True)
    replay = autoscale.add_parser(
        "replay", help="run an autoscaler against an arrival trace on a simulated pool",
        description="Replays an arrival trace through a simulated replica pool scaled by an autoscaler built "
                    "from the installed plugins, as a stack's [autoscaler] table builds it; reports "
                    "replica-seconds, cold starts and TTFT SLO violations.")
    try:  # the pool model's fields are the command's flags
        from lamina.tools.autoscale_replay import PoolModel
    except ModuleNotFoundError as exc:  # without the tools extra: the command says what to install
        missing = exc
        replay.add_argument("arguments", nargs=argparse.REMAINDER)
        replay.set_defaults(func=lambda args: missing_tool("autoscale replay", missing))
        return
    replay.add_argument("trace", help="synthetic:diurnal, synthetic:bursty or synthetic:step, each with "
                                      "options after a colon (synthetic:step:high_rate=80,duration_s=1800); "
                                      "or a lamina bench JSON result, or a JSON list of arrival times (s)")
    replay.add_argument("--policy", required=True, help="the autoscaler, as [autoscaler] use = ... names it")
    replay.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="an option of the autoscaler (repeat; values read as TOML)")
    for field in attrs.fields(attrs.resolve_types(PoolModel)):
        flags = [*([field.metadata["flag"]] if "flag" in field.metadata else []), f"--{field.name.replace('_', '-')}"]
        kind = typing.get_args(field.type) if typing.get_origin(field.type) is typing.Literal else None
        convert = next(a for a in (typing.get_args(field.type) or (field.type,)) if a is not type(None))
        metavar = None if kind else "SECONDS" if field.name.endswith("_s") else "N" if convert is int else "X"
        default = "" if field.default is None else f" (default {field.default:g})" if not kind else \
            f" (default {field.default})"
        replay.add_argument(*flags, dest=field.name, type=None if kind else convert, choices=kind, metavar=metavar,
                            help=field.metadata["help"] + default)
    replay.add_argument("--json", action="store_true", help="the summary, timeline and scale events as JSON")
    replay.add_argument("--html", metavar="FILE", help="also write a self-contained HTML report with plots")
    replay.set_defaults(func=_cmd_autoscale_replay)
