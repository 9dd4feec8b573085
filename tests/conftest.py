"""Live servers on loopback for the cross-package tests."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import uvicorn
from lamina.kernel.plugins import load_plugins
from lamina.pool import build_stack
from lamina.server.http import Server
from lamina.server.serve import build_app
from lamina.kernel.stack_config import StackConfig
from lamina_jax.testing import release_compiled_code


@pytest.fixture(autouse=True)
def _compiled_code_within_the_map_limit() -> Iterator[None]:
    """This process compiles dozens of models: `release_compiled_code` after each test that nears the limit."""
    yield
    release_compiled_code()


class Live:
    """A stack served by uvicorn on a free loopback port, in a background thread."""

    def __init__(self, config: dict[str, Any], extra: tuple[tuple[str, object], ...] = ()) -> None:
        plugins = load_plugins(extra=extra)
        self.stack = build_stack(StackConfig.from_dict(config, plugins.registry), plugins)
        self.http = Server(self.stack)
        self.server = uvicorn.Server(uvicorn.Config(build_app(self.stack, self.http), host="127.0.0.1", port=0,
                                                    log_config=None, access_log=False))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> Live:
        self.thread.start()
        deadline = time.monotonic() + 300  # a real model compiles every shape while it starts
        while not (self.server.started and self.stack.started
                   and all(e.state().healthy for e in self.stack.backends.values())):
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


@pytest.fixture
def live() -> Iterator[Callable[..., Live]]:
    """``live(stack_dict, extra_plugins)`` starts a server; stopped at teardown."""
    started: list[Live] = []

    def start(config: dict[str, Any], *extra: tuple[str, object]) -> Live:
        server = Live(config, extra).__enter__()
        started.append(server)
        return server

    yield start
    for server in started:
        server.__exit__()
