"""The ``lamina`` command: one entry point, one subcommand per job.

``plugins``, ``check``, ``serve``, ``route explain``, ``worker``, ``autoscale replay`` (its
logic in :mod:`lamina.autoscale_replay`), ``status`` (in :mod:`lamina.status`) and
``ab report`` (in :mod:`lamina.ab_report`) are here; ``bench`` lives in
:mod:`lamina.bench.cli` and registers its own subparser.
"""

from __future__ import annotations

import argparse
import json
import sys

import attrs
from collections.abc import Sequence

from lamina_hookspecs.errors import ConfigError
from lamina_hookspecs.layers import LAYERS
from lamina.kernel.logging import configure_logging
from lamina.kernel.options import describe
from lamina.kernel.plugins import load_plugins
from lamina.kernel.registry import ComponentRegistry
from lamina.kernel.stack_config import DEFAULTS, StackConfig


def _cmd_plugins(args: argparse.Namespace) -> int:
    plugins = load_plugins()
    if args.json:
        print(json.dumps({
            "plugins": [info.to_json() for info in plugins.infos.values()],
            "components": [
                {"layer": c.layer.key, "name": c.name, "plugin": c.plugin, "summary": c.summary,
                 "options": describe(c.options)}
                for c in plugins.registry
            ],
        }, indent=2, default=str))
        return 0
    for info in sorted(plugins.infos.values(), key=lambda i: i.name):
        version = f" {info.version}" if info.version else ""
        dist = f" ({info.distribution}{version})" if info.distribution else ""
        print(f"{info.name}{dist}" + ("  FAILED" if info.error else ""))
        if info.error:
            print(f"    error: {info.error}")
        for layer in LAYERS:
            if layer.key in info.registered:
                print(f"    {layer.noun}: {', '.join(info.registered[layer.key])}")
    if args.verbose:
        print()
        for component in plugins.registry:
            print(f"{component.layer.key}.{component.name}  [{component.plugin}]  {component.summary}")
            for option in describe(component.options):
                print(f"    {option['name']}: {option['type']} = {option['default']!r}  {option['help']}")
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    plugins = load_plugins()
    try:
        config = StackConfig.from_toml(args.stack, plugins.registry)
    except ConfigError as exc:
        print(f"error: {args.stack}: {exc}", file=sys.stderr)
        return 1
    described = config.describe()
    if args.json:
        print(json.dumps(described, indent=2, default=str))
        return 0
    print(f"stack '{config.meta.name}' from {args.stack}: OK")
    for key, value in described.items():
        if key not in ("stack", "source"):
            print(f"  {key}: {json.dumps(value, default=str)}")
    return 0


def _with_model(config: StackConfig, args: argparse.Namespace, registry: ComponentRegistry) -> StackConfig:
    """``config`` with ``--model`` and ``--served-model-name`` set on its executor (the default one,
    when the stack names none), like ``vllm serve MODEL``."""
    if args.model is None and args.served_model_name is None:
        return config
    if "executor" in config.raw.get("ab", {}):
        raise ConfigError("ab.executor", "--model sets one executor's model; this stack splits the executor")
    executor = dict(config.raw.get("executor", {"use": DEFAULTS["executor"]}))
    if args.model is not None:
        executor["model"] = args.model
    if args.served_model_name is not None:
        executor["served_name"] = args.served_model_name
    return StackConfig.from_dict({**config.raw, "executor": executor}, registry, source=config.source)


def _cmd_serve(args: argparse.Namespace) -> int:
    from lamina.pool import build_stack
    from lamina.server.serve import serve

    plugins = load_plugins()
    try:
        config = (StackConfig.from_toml(args.stack, plugins.registry) if args.stack
                  else StackConfig.from_dict({}, plugins.registry))
        config = _with_model(config, args, plugins.registry)
        if args.replicas is not None:
            replicas = {**config.raw.get("replicas", {}), "count": args.replicas}
            config = StackConfig.from_dict({**config.raw, "replicas": replicas}, plugins.registry,
                                           source=config.source)
        overrides = {key: value for key, value in
                     (("host", args.host), ("port", args.port), ("grpc_port", args.grpc_port)) if value is not None}
        stack = build_stack(attrs.evolve(config, server=attrs.evolve(config.server, **overrides)), plugins)
    except ConfigError as exc:
        print(f"error: {args.stack or 'default stack'}: {exc}", file=sys.stderr)
        return 1
    return serve(stack)


def _cmd_worker(args: argparse.Namespace) -> int:
    from lamina.pool import build_stack
    from lamina.server.serve import serve_worker

    plugins = load_plugins()
    if args.stack is None and args.model is None:
        print("error: give a stack file or --model", file=sys.stderr)
        return 2
    try:
        config = (StackConfig.from_toml(args.stack, plugins.registry) if args.stack
                  else StackConfig.from_dict({}, plugins.registry))
        stack = build_stack(_with_model(config, args, plugins.registry), plugins)
    except ConfigError as exc:
        print(f"error: {args.stack or '--model'}: {exc}", file=sys.stderr)
        return 1
    return serve_worker(stack, args.host, args.port)


def _cmd_route_explain(args: argparse.Namespace) -> int:
    from lamina_hookspecs.types import ChatMessage, Request

    plugins = load_plugins()
    try:
        config = StackConfig.from_toml(args.stack, plugins.registry)
    except ConfigError as exc:
        print(f"error: {args.stack}: {exc}", file=sys.stderr)
        return 1
    if config.route_tree is None:
        print(f"{args.stack} has no [route_tree]: every request goes to the stack's router "
              f"({config.describe()['router']})")
        return 0
    prompt = {"messages": (ChatMessage(role="user", content=args.prompt),)} if args.chat else {"prompt": args.prompt}
    request = Request(id="explain", model=args.model, tenant=args.tenant, **prompt)
    features, leaf, path = config.route_tree.decide(request)
    print("features:")
    for key, value in attrs.asdict(features).items():
        print(f"  {key} = {value!r}")
    print("path:")
    for step in path:
        print(f"  {step}")
    print(f"leaf: {leaf.name} -> pool {leaf.pool!r}, router {leaf.router.name!r}")
    return 0


def _cmd_autoscale_replay(args: argparse.Namespace) -> int:
    from lamina import autoscale_replay as ar

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


def _add_autoscale_parser(sub: argparse._SubParsersAction) -> None:
    import typing

    from lamina.autoscale_replay import PoolModel

    autoscale = sub.add_parser("autoscale", help="try autoscalers offline").add_subparsers(
        dest="autoscale", required=True)
    replay = autoscale.add_parser(
        "replay", help="run an autoscaler against an arrival trace on a simulated pool",
        description="Replays an arrival trace through a simulated replica pool scaled by an autoscaler built "
                    "from the installed plugins, as a stack's [autoscaler] table builds it; reports "
                    "replica-seconds, cold starts and TTFT SLO violations.")
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


def _cmd_status(args: argparse.Namespace) -> int:
    from lamina.status import run

    return run(args.url, interval=args.interval, once=args.once)


def _cmd_ab_report(args: argparse.Namespace) -> int:
    from lamina.ab_report import run

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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lamina", description="Lamina: a plugin microkernel for LLM serving.")
    parser.add_argument("--log-level", default="WARNING", help="log level (default WARNING)")
    parser.add_argument("--log-json", action="store_true", default=None, help="JSON logs even on a TTY")
    sub = parser.add_subparsers(dest="command", required=True)

    plugins = sub.add_parser("plugins", help="list installed plugins and what each registered")
    plugins.add_argument("--json", action="store_true", help="machine-readable output")
    plugins.add_argument("-v", "--verbose", action="store_true", help="also list every component's options")
    plugins.set_defaults(func=_cmd_plugins)

    check = sub.add_parser("check", help="validate a stack file and print the resolved stack")
    check.add_argument("stack", help="path to a stack file (TOML)")
    check.add_argument("--json", action="store_true", help="machine-readable output")
    check.set_defaults(func=_cmd_check)

    serve = sub.add_parser("serve", help="serve a stack over the OpenAI-compatible HTTP API")
    serve.add_argument("stack", nargs="?", help="stack file (default: the built-in default stack)")
    serve.add_argument("--host", help="address to bind (overrides server.host; default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="HTTP port (overrides server.port; default 8000)")
    serve.add_argument("--grpc-port", type=int, help="gRPC port (overrides server.grpc_port; default 50051)")
    serve.add_argument("--replicas", type=int, help="run the executor in N supervised worker processes "
                                                    "(overrides replicas.count)")
    _add_model_arguments(serve)
    serve.set_defaults(func=_cmd_serve)

    route = sub.add_parser("route", help="inspect a stack's routing").add_subparsers(dest="route", required=True)
    explain = route.add_parser("explain", help="print the path a prompt takes through the routing tree")
    explain.add_argument("stack", help="stack file with a [route_tree]")
    explain.add_argument("--prompt", required=True, help="the prompt text")
    explain.add_argument("--chat", action="store_true", help="send it as a chat user message")
    explain.add_argument("--tenant", default="default", help="the tenant admission would assign")
    explain.add_argument("--model", default="auto", help="the model the client asks for")
    explain.set_defaults(func=_cmd_route_explain)

    _add_autoscale_parser(sub)

    worker = sub.add_parser("worker", help="serve one executor over gRPC for a gateway (see [replicas])")
    worker.add_argument("stack", nargs="?", help="stack file (TOML or JSON); only its executor sections are used")
    worker.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    worker.add_argument("--port", type=int, required=True, help="gRPC port")
    _add_model_arguments(worker)
    worker.set_defaults(func=_cmd_worker)

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

    from lamina.bench.cli import add_parser as add_bench_parser

    add_bench_parser(sub)
    return parser


def _add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", metavar="PATH", help="serve this model (a GGUF file or a Hugging Face model "
                                                         "directory): sets the executor's model option")
    parser.add_argument("--served-model-name", metavar="NAME", help="the model id clients ask for "
                                                                    "(sets the executor's served_name option)")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(level=args.log_level, json=args.log_json)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
