"""Local worker processes (``lamina worker``), started, watched and restarted by the gateway.

Each worker runs the stack's executor behind the gRPC API on its own port and is reached
through a :class:`~lamina.remote.RemoteExecutor`. A watch task checks the processes twice a
second: a worker that exited is logged with its exit status, counted, and started again on
the same port after a back-off (``restart_backoff_s``, doubled for each crash in a row, at
most 30 s; a worker that ran a minute resets it). Requests it was serving fail fast — their
gRPC streams break — or, when no token was sent yet, are retried on another backend by the
pipeline. Workers get the executor's part of the stack (``WORKER_SECTIONS``) as a JSON file.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import structlog

from lamina.bench.servers import free_port
from lamina.stack_config import WORKER_SECTIONS, ReplicasConfig

log = structlog.get_logger(__name__)

WATCH_S = 0.5
MAX_BACKOFF_S = 30.0
STABLE_S = 60.0
"""A worker that ran this long before exiting restarts after the base back-off again."""


class Worker:
    """One worker process on a fixed address."""

    def __init__(self, name: str, host: str, port: int) -> None:
        self.name, self.host, self.port = name, host, port
        self.process: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0
        self.restarts = 0
        self.crashes_in_a_row = 0
        self.restart_at: float | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def spawn(self, stack_file: Path) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "lamina.cli", "worker", str(stack_file), "--host", self.host,
             "--port", str(self.port)])
        self.started_at = time.monotonic()

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class ReplicaSet:
    """``count`` workers for one stack, and the task that keeps them running."""

    def __init__(self, config: ReplicasConfig, raw_stack: Mapping[str, Any]) -> None:
        self.config = config
        self.stack = {key: value for key, value in raw_stack.items() if key in WORKER_SECTIONS}
        self.workers = [Worker(f"replica-{i}", config.host,
                               config.base_port + i if config.base_port else free_port())
                        for i in range(config.count)]
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self._watch: asyncio.Task[None] | None = None

    @property
    def stack_file(self) -> Path:
        assert self._dir is not None
        return Path(self._dir.name) / "worker-stack.json"

    def start(self) -> None:
        """Write the workers' stack, start every worker and the watch task."""
        self._dir = tempfile.TemporaryDirectory(prefix="lamina-workers-")
        self.stack_file.write_text(json.dumps(self.stack), encoding="utf-8")
        for worker in self.workers:
            worker.spawn(self.stack_file)
            log.info("replica_started", replica=worker.name, address=worker.address, pid=worker.process.pid)
        self._watch = asyncio.create_task(self._watch_loop())

    async def stop(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        await asyncio.gather(*(asyncio.to_thread(worker.stop) for worker in self.workers))
        if self._dir is not None:
            self._dir.cleanup()

    async def _watch_loop(self) -> None:
        while True:
            await asyncio.sleep(WATCH_S)
            self.check(time.monotonic())

    def check(self, now: float) -> None:
        """Notice exited workers and restart those whose back-off is over."""
        for worker in self.workers:
            process = worker.process
            if worker.restart_at is None and process is not None and process.poll() is not None:
                ran = now - worker.started_at
                worker.crashes_in_a_row = 1 if ran >= STABLE_S else worker.crashes_in_a_row + 1
                backoff = min(MAX_BACKOFF_S, self.config.restart_backoff_s * 2 ** (worker.crashes_in_a_row - 1))
                worker.restart_at = now + backoff
                log.warning("replica_exited", replica=worker.name, returncode=process.returncode,
                            ran_s=round(ran, 1), restart_in_s=backoff)
            if worker.restart_at is not None and now >= worker.restart_at:
                worker.restart_at = None
                worker.restarts += 1
                worker.spawn(self.stack_file)
                log.info("replica_restarted", replica=worker.name, restarts=worker.restarts,
                         pid=worker.process.pid if worker.process else None)
