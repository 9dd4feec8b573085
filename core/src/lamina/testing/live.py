"""A stack served over HTTP on a free loopback port, in a background thread: for tests that talk
to a real server (the ``live`` fixture of :mod:`lamina.testing.fixtures`)."""

from __future__ import annotations

import threading
import time
from typing import Any

import uvicorn

from lamina.kernel.plugins import load_plugins
from lamina.kernel.stack_config import StackConfig
from lamina.pool import build_stack
from lamina.server.http import Server
from lamina.server.http_protocol import HeadWithFirstChunk
from lamina.server.serve import build_app

START_TIMEOUT_S = 300.0
"""How long a stack may take to serve: a real model compiles every shape while it starts."""


class LiveServer:
    """``with LiveServer(stack_dict, extra_plugins) as server:`` serves at ``server.url`` once every
    backend is healthy; ``server.stack`` is the running stack."""

    def __init__(self, config: dict[str, Any], extra: tuple[tuple[str, object], ...] = ()) -> None:
        plugins = load_plugins(extra=extra)
        self.stack = build_stack(StackConfig.from_dict(config, plugins.registry), plugins)
        self.http = Server(self.stack)
        self.server = uvicorn.Server(uvicorn.Config(build_app(self.stack, self.http), host="127.0.0.1", port=0,
                                                    log_config=None, access_log=False, http=HeadWithFirstChunk))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.url = ""

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (self.server.started and self.stack.started
                   and all(e.state().healthy for e in self.stack.backends.values())):
            if time.monotonic() > deadline or not self.thread.is_alive():
                self.__exit__()
                raise RuntimeError("the live server did not start (its log says why)")
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
