"""``lamina plugins``, ``lamina check`` and ``lamina route explain``: what is installed, and what a
stack file resolves to, without serving it."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import attrs

from lamina_hookspecs.errors import ConfigError
from lamina_hookspecs.layers import LAYERS
from lamina.kernel.options import describe
from lamina.kernel.plugins import load_plugins
from lamina.kernel.stack_config import StackConfig


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


def _read_stack(path: str) -> StackConfig | None:
    """The validated stack file at ``path``; None after printing its error."""
    try:
        return StackConfig.from_toml(path, load_plugins().registry)
    except ConfigError as exc:
        print(f"error: {path}: {exc}", file=sys.stderr)
        return None


def _cmd_check(args: argparse.Namespace) -> int:
    config = _read_stack(args.stack)
    if config is None:
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


def _cmd_route_explain(args: argparse.Namespace) -> int:
    from lamina_hookspecs.types import ChatMessage, Request

    config = _read_stack(args.stack)
    if config is None:
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


def add_parsers(sub: Any) -> None:
    plugins = sub.add_parser("plugins", help="list installed plugins and what each registered")
    plugins.add_argument("--json", action="store_true", help="machine-readable output")
    plugins.add_argument("-v", "--verbose", action="store_true", help="also list every component's options")
    plugins.set_defaults(func=_cmd_plugins)

    check = sub.add_parser("check", help="validate a stack file and print the resolved stack")
    check.add_argument("stack", help="path to a stack file (TOML)")
    check.add_argument("--json", action="store_true", help="machine-readable output")
    check.set_defaults(func=_cmd_check)

    route = sub.add_parser("route", help="inspect a stack's routing").add_subparsers(dest="route", required=True)
    explain = route.add_parser("explain", help="print the path a prompt takes through the routing tree")
    explain.add_argument("stack", help="stack file with a [route_tree]")
    explain.add_argument("--prompt", required=True, help="the prompt text")
    explain.add_argument("--chat", action="store_true", help="send it as a chat user message")
    explain.add_argument("--tenant", default="default", help="the tenant admission would assign")
    explain.add_argument("--model", default="auto", help="the model the client asks for")
    explain.set_defaults(func=_cmd_route_explain)
