"""Upstreams for the tests: ``lamina serve`` with the echo executor, on free loopback ports."""

from __future__ import annotations

import json

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from lamina.tools.bench.servers import StackServer

ECHO_STACK = """
[stack]
name = "upstream-echo"
[executor]
use = "echo"
model = "echo-up"
token_delay_s = {delay}
"""


def write_stack(folder: Path, name: str, text: str) -> Path:
    path = folder / f"{name}.toml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def echo_upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StackServer]:
    """An echo upstream that answers at once, shared by a module's tests."""
    folder = tmp_path_factory.mktemp("upstream")
    with StackServer(write_stack(folder, "echo", ECHO_STACK.format(delay=0.0)), ready_timeout_s=60) as server:
        yield server


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[[str], StackServer]]:
    """Starts ``lamina serve`` on a stack text; every server is stopped after the test."""
    servers: list[StackServer] = []

    def start(text: str) -> StackServer:
        server = StackServer(write_stack(tmp_path, f"stack{len(servers)}", text), ready_timeout_s=60)
        servers.append(server)
        return server.start()

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def front(serve: Callable[[str], StackServer]) -> Callable[..., StackServer]:
    """Starts ``lamina serve`` with ``openai-upstream`` in front of a URL, with more executor options."""

    def start(url: str, **options: str | int | float) -> StackServer:
        extra = "".join(f"{key} = {json.dumps(value)}\n" for key, value in options.items())  # JSON scalars are TOML
        return serve(f'[stack]\nname = "front"\n[executor]\nuse = "openai-upstream"\nurl = "{url}"\n'
                     f'poll_interval_s = 0.1\n{extra}')

    return start
