"""``lamina serve`` (a stack over HTTP and gRPC) and ``lamina worker`` (one executor over gRPC, for
a gateway's ``[replicas]``)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import attrs

from lamina_hookspecs.errors import ConfigError
from lamina.kernel.plugins import load_plugins
from lamina.kernel.registry import ComponentRegistry
from lamina.kernel.stack_config import DEFAULTS, StackConfig


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


def add_parsers(sub: Any) -> None:
    serve = sub.add_parser("serve", help="serve a stack over the OpenAI-compatible HTTP API")
    serve.add_argument("stack", nargs="?", help="stack file (default: the built-in default stack)")
    serve.add_argument("--host", help="address to bind (overrides server.host; default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="HTTP port (overrides server.port; default 8000)")
    serve.add_argument("--grpc-port", type=int, help="gRPC port (overrides server.grpc_port; default 50051)")
    serve.add_argument("--replicas", type=int, help="run the executor in N supervised worker processes "
                                                    "(overrides replicas.count)")
    _add_model_arguments(serve)
    serve.set_defaults(func=_cmd_serve)

    worker = sub.add_parser("worker", help="serve one executor over gRPC for a gateway (see [replicas])")
    worker.add_argument("stack", nargs="?", help="stack file (TOML or JSON); only its executor sections are used")
    worker.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    worker.add_argument("--port", type=int, required=True, help="gRPC port")
    _add_model_arguments(worker)
    worker.set_defaults(func=_cmd_worker)


def _add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", metavar="PATH", help="serve this model (a GGUF file or a Hugging Face model "
                                                         "directory): sets the executor's model option")
    parser.add_argument("--served-model-name", metavar="NAME", help="the model id clients ask for "
                                                                    "(sets the executor's served_name option)")
