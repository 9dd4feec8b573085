"""Starting stacks to benchmark: ``lamina serve STACK`` in a subprocess on free loopback ports."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Self

import httpx

from lamina.pool.replicas import free_port


class ServerProcess:
    """A server in a subprocess, its output in a temporary log; ready once ``ready_url`` answers 200."""

    def __init__(self, name: str, argv: list[str], ready_url: str, *, ready_timeout_s: float,
                 env: dict[str, str] | None = None) -> None:
        self.name, self.argv, self.ready_url, self.env = name, argv, ready_url, env
        self.ready_timeout_s = ready_timeout_s
        self.process: subprocess.Popen[bytes] | None = None
        self._log = tempfile.NamedTemporaryFile(prefix=f"{name.split()[0]}-", suffix=".log", delete=False)  # noqa: SIM115

    def log_tail(self, chars: int = 3000) -> str:
        self._log.flush()
        return Path(self._log.name).read_text(encoding="utf-8", errors="replace")[-chars:]

    def start(self) -> Self:
        self.process = subprocess.Popen(self.argv, stdout=self._log, stderr=subprocess.STDOUT, env=self.env)
        deadline = time.monotonic() + self.ready_timeout_s
        with httpx.Client(timeout=5) as client:
            while True:
                if self.process.poll() is not None:
                    raise RuntimeError(f"{self.name} exited with {self.process.returncode}:\n{self.log_tail()}")
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(self.ready_url).status_code == 200:
                        return self
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"{self.name} was not ready in {self.ready_timeout_s:g}s:\n{self.log_tail()}")
                time.sleep(0.1)

    def stop(self, timeout_s: float = 30.0) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._log.close()
        with contextlib.suppress(OSError):
            os.unlink(self._log.name)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class StackServer(ServerProcess):
    """``python -m lamina.cli serve STACK`` on free HTTP and gRPC ports; ``url`` once ready."""

    def __init__(self, stack: str | Path, *, ready_timeout_s: float = 600.0, host: str = "127.0.0.1") -> None:
        self.stack = str(stack)
        self.host = host
        self.port, self.grpc_port = free_port(), free_port()
        self.url = f"http://{host}:{self.port}"
        command = [sys.executable, "-m", "lamina.cli", "serve", self.stack, "--host", host,
                   "--port", str(self.port), "--grpc-port", str(self.grpc_port)]
        super().__init__(f"lamina serve {self.stack}", command, f"{self.url}/ready", ready_timeout_s=ready_timeout_s,
                         env={**os.environ, "PYTHONUNBUFFERED": "1"})


@contextlib.contextmanager
def serve_stacks(stacks: list[str], *, ready_timeout_s: float = 600.0) -> Iterator[list[str]]:
    """Start every stack (one after another), yield their URLs, stop them all at exit."""
    with contextlib.ExitStack() as exits:
        urls = []
        for stack in stacks:
            urls.append(exits.enter_context(StackServer(stack, ready_timeout_s=ready_timeout_s)).url)
        yield urls
