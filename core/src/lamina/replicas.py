"""Local worker processes (``lamina worker``): started, watched, restarted, scaled and drained.

Each worker runs the stack's executor behind the gRPC API on its own port and is reached
through a :class:`~lamina.remote.RemoteExecutor`, which joins the stack's backends once the
worker is ready (the time from spawn to ready is kept as a measured cold start). A watch task
checks the processes twice a second: a worker that exited is logged with its exit status,
counted, and started again on the same port after a back-off (``restart_backoff_s``, doubled
for each crash in a row, at most 30 s; a worker that ran a minute resets it). Requests it was
serving fail fast — their gRPC streams break — or, when no token was sent yet, are retried on
another backend by the pipeline.

:meth:`ReplicaSet.scale_to` grows the pool by spawning workers and shrinks it by draining:
a draining replica takes no new requests (routers see ``draining``), finishes those it has
(for up to ``drain_timeout_s``), then stops. :meth:`ReplicaSet.restart` drains one replica and
starts it again (self-healing). Workers get the executor's part of the stack
(``WORKER_SECTIONS``) as a JSON file.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping, MutableMapping
from pathlib import Path
from typing import Any

import structlog

from lamina_hookspecs.protocols import Executor
from lamina.bench.servers import free_port
from lamina.remote import RemoteExecutor
from lamina.stack_config import WORKER_SECTIONS, ReplicasConfig

log = structlog.get_logger(__name__)

WATCH_S = 0.5
MAX_BACKOFF_S = 30.0
STABLE_S = 60.0
"""A worker that ran this long before exiting restarts after the base back-off again."""
COLD_STARTS_KEPT = 20


class Worker:
    """One worker process on a fixed address, and the backend that reaches it."""

    def __init__(self, name: str, host: str, port: int, executor: RemoteExecutor) -> None:
        self.name, self.host, self.port, self.executor = name, host, port, executor
        self.process: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0
        self.restarts = 0
        self.crashes_in_a_row = 0
        self.restart_at: float | None = None
        self.ready = False
        self.draining = False

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
    """The stack's worker pool; ready workers are entries of ``backends`` (the stack's own dict)."""

    def __init__(self, config: ReplicasConfig, raw_stack: Mapping[str, Any],
                 backends: MutableMapping[str, Executor], *, drain_timeout_s: float = 30.0) -> None:
        self.config, self.backends, self.drain_timeout_s = config, backends, drain_timeout_s
        self.stack = {key: value for key, value in raw_stack.items() if key in WORKER_SECTIONS}
        self.workers: list[Worker] = []
        self.cold_starts_s: deque[float] = deque(maxlen=COLD_STARTS_KEPT)
        self.actions: Counter[tuple[str, str]] = Counter()
        """(action, reason) → times taken: spawn, drain, restart; for metrics."""
        self.on_change: Callable[[], None] = lambda: None
        self._next = 0
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def stack_file(self) -> Path:
        assert self._dir is not None
        return Path(self._dir.name) / "worker-stack.json"

    @property
    def serving(self) -> list[Worker]:
        return [w for w in self.workers if w.ready and not w.draining]

    @property
    def starting(self) -> list[Worker]:
        return [w for w in self.workers if not w.ready and not w.draining]

    async def start(self) -> None:
        """Write the workers' stack, start ``count`` workers, return once all are ready."""
        self._dir = tempfile.TemporaryDirectory(prefix="lamina-workers-")
        self.stack_file.write_text(json.dumps(self.stack), encoding="utf-8")
        workers = [self._spawn("start") for _ in range(self.config.count)]
        await asyncio.gather(*(self._bring_up(w) for w in workers))
        self._spawn_task(self._watch_loop())

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for worker in self.workers:
            await worker.executor.stop()
        await asyncio.gather(*(asyncio.to_thread(worker.stop) for worker in self.workers))
        if self._dir is not None:
            self._dir.cleanup()

    def scale_to(self, target: int, drain: tuple[str, ...] = (), reason: str = "") -> None:
        """Start workers or drain some until ``target`` are serving or starting."""
        active = self.serving + self.starting
        for _ in range(target - len(active)):
            self._spawn_task(self._bring_up(self._spawn(reason or "scale_up")))
        surplus = len(active) - target
        if surplus > 0:
            named = [w for w in self.serving if w.name in drain]
            rest = sorted((w for w in self.serving if w not in named),
                          key=lambda w: w.executor.state().outstanding_requests)
            for worker in (named + rest)[:surplus]:
                self._spawn_task(self._retire(worker, reason or "scale_down"))

    def restart(self, worker: Worker, reason: str) -> None:
        """Drain ``worker``, then start it again (self-healing)."""
        self._spawn_task(self._retire(worker, reason, restart=True))

    def _spawn(self, reason: str) -> Worker:
        name = f"replica-{self._next}"
        self._next += 1
        port = self.config.base_port + self._next - 1 if self.config.base_port else free_port()
        worker = Worker(name, self.config.host, port,
                        RemoteExecutor(name, f"{self.config.host}:{port}",
                                       connect_timeout_s=self.config.start_timeout_s))
        self.workers.append(worker)
        worker.spawn(self.stack_file)
        self.actions["spawn", reason] += 1
        log.info("replica_started", replica=name, address=worker.address, reason=reason,
                 pid=worker.process.pid if worker.process else None)
        return worker

    async def _bring_up(self, worker: Worker) -> None:
        await worker.executor.start()
        self.cold_starts_s.append(time.monotonic() - worker.started_at)
        worker.ready = True
        self.backends[worker.name] = worker.executor
        self.on_change()
        log.info("replica_ready", replica=worker.name, cold_start_s=round(self.cold_starts_s[-1], 2))

    async def _retire(self, worker: Worker, reason: str, *, restart: bool = False) -> None:
        worker.draining = True
        worker.executor.draining = True
        self.actions["restart" if restart else "drain", reason] += 1
        log.info("replica_draining", replica=worker.name, reason=reason, restart=restart)
        deadline = time.monotonic() + self.drain_timeout_s
        while worker.executor.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        self.backends.pop(worker.name, None)
        await asyncio.to_thread(worker.stop)
        if restart:
            worker.draining = worker.executor.draining = worker.ready = False
            worker.spawn(self.stack_file)
            await self._bring_up(worker)
            return
        await worker.executor.stop()
        self.workers.remove(worker)
        self.on_change()
        log.info("replica_stopped", replica=worker.name, reason=reason)

    def _spawn_task(self, coroutine: Any) -> None:
        task = asyncio.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _watch_loop(self) -> None:
        while True:
            await asyncio.sleep(WATCH_S)
            self.check(time.monotonic())

    def check(self, now: float) -> None:
        """Notice exited workers and restart those whose back-off is over."""
        for worker in self.workers:
            process = worker.process
            if worker.draining:
                continue
            if worker.restart_at is None and process is not None and process.poll() is not None:
                ran = now - worker.started_at
                worker.crashes_in_a_row = 1 if ran >= STABLE_S else worker.crashes_in_a_row + 1
                backoff = min(MAX_BACKOFF_S, self.config.restart_backoff_s * 2 ** (worker.crashes_in_a_row - 1))
                worker.restart_at = now + backoff
                self.actions["restart", "crash"] += 1
                log.warning("replica_exited", replica=worker.name, returncode=process.returncode,
                            ran_s=round(ran, 1), restart_in_s=backoff)
            if worker.restart_at is not None and now >= worker.restart_at:
                worker.restart_at = None
                worker.restarts += 1
                worker.spawn(self.stack_file)
                log.info("replica_restarted", replica=worker.name, restarts=worker.restarts,
                         pid=worker.process.pid if worker.process else None)
