"""Local worker processes (``lamina worker``): started, watched, restarted, scaled and drained.

Each worker runs the stack's executor behind the gRPC API (in a child process, or wherever
the ``[replicas] provider`` places it) and is reached
through a :class:`~lamina.pool.remote.RemoteExecutor`, which joins the stack's backends once the
worker is ready (the time from spawn to ready is kept as a measured cold start). A watch task
checks the processes twice a second: a worker that exited is logged with its exit status,
counted, and started again on the same port after a back-off (``restart_backoff_s``, doubled
for each crash in a row, at most 30 s; a worker that ran a minute resets it). Requests it was
serving fail fast — their gRPC streams break — or, when no token was sent yet, are retried on
another backend by the pipeline.

:meth:`ReplicaSet.scale_to` grows the pool by spawning workers and shrinks it by draining:
a draining replica takes no new requests (routers see ``draining``), finishes those it has
(for up to ``drain_timeout_s``), then stops. :meth:`ReplicaSet.restart` drains one replica and
starts it again (self-healing). A process that exits before it is ready is noticed within
``WATCH_S`` (not after ``start_timeout_s``); a restart that fails that way is tried again after
the crash back-off. Workers get the executor's part of the stack (``WORKER_SECTIONS``) as a
JSON file.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter, deque
from collections.abc import Mapping, MutableMapping
from typing import Any, Literal

import structlog

from lamina_hookspecs.protocols import Executor, ReplicaHandle, ReplicaProvider
from lamina_hookspecs.types import WorkerLaunch
from lamina.pool.remote import RemoteExecutor
from lamina.kernel.drain import until_idle
from lamina.kernel.pool_tables import WORKER_SECTIONS, ReplicasConfig

log = structlog.get_logger(__name__)

WATCH_S = 0.5
MAX_BACKOFF_S = 30.0
STABLE_S = 60.0
"""A worker that ran this long before exiting restarts after the base back-off again."""
COLD_STARTS_KEPT = 20


def free_port() -> int:
    """A TCP port free on loopback right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def worker_launch(name: str, worker_stack: Mapping[str, Any]) -> WorkerLaunch:
    """``lamina worker`` serving ``worker_stack`` (the stack file's executor tables, as JSON)."""
    return WorkerLaunch(name=name, files={f"{name}.json": json.dumps(worker_stack).encode()},
                        args=("-m", "lamina.cli", "worker", f"{{files}}/{name}.json", "--host", "{host}",
                              "--port", "{port}"))


class LocalHandle:
    """A ``lamina worker`` child process of this gateway."""

    def __init__(self, process: subprocess.Popen[bytes], address: str) -> None:
        self.process, self.address = process, address

    def exited(self) -> int | None:
        return self.process.poll()

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class LocalProcesses:
    """The default replica provider: workers as child processes on this machine, each on its own
    port (``base_port`` + n, or a free one)."""

    def __init__(self, host: str, base_port: int) -> None:
        self.host, self.base_port, self._launched = host, base_port, 0
        self._dir = tempfile.TemporaryDirectory(prefix="lamina-workers-")

    def launch(self, worker: WorkerLaunch) -> LocalHandle:
        worker.write_files(self._dir.name)
        port = self.base_port + self._launched if self.base_port else free_port()
        self._launched += 1
        process = subprocess.Popen(worker.argv(python=sys.executable, files_dir=self._dir.name, host=self.host,
                                               port=port))
        return LocalHandle(process, f"{self.host}:{port}")

    def close(self) -> None:
        self._dir.cleanup()


class Worker:
    """One replica: the handle of its current process (a new one after each restart), the
    backend that reaches it, and its state in the pool."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.handle: ReplicaHandle | None = None
        self.executor: RemoteExecutor | None = None
        self.started_at = 0.0
        self.restarts = 0
        self.crashes_in_a_row = 0
        self.restart_at: float | None = None
        self.relaunching = False
        """After a crash, until the new process is up: the old handle is not watched meanwhile."""
        self.ready = False
        self.draining = False
        self.restarting = False
        """Draining for a self-healing restart: it keeps its slot, so the autoscaler adds none."""
        self.stack: Mapping[str, Any] | None = None  # a canary's own worker stack; None: the pool's

    @property
    def canary(self) -> bool:
        return self.stack is not None

    @property
    def address(self) -> str:
        return self.handle.address if self.handle else ""

    @property
    def in_flight(self) -> int:
        return self.executor.in_flight if self.executor else 0

    @property
    def load(self) -> int:
        return self.executor.state().outstanding_requests if self.executor else 0


class ReplicaSet:
    """The stack's worker pool; ready workers are entries of ``backends`` (the stack's own dict)."""

    def __init__(self, config: ReplicasConfig, raw_stack: Mapping[str, Any],
                 backends: MutableMapping[str, Executor], *, provider: ReplicaProvider | None = None,
                 drain_timeout_s: float = 30.0) -> None:
        self.config, self.backends, self.drain_timeout_s = config, backends, drain_timeout_s
        self.provider = provider or LocalProcesses(config.host, config.base_port)
        self.stack = {key: value for key, value in raw_stack.items() if key in WORKER_SECTIONS}
        self.workers: list[Worker] = []
        self.cold_starts_s: deque[float] = deque(maxlen=COLD_STARTS_KEPT)
        self.actions: Counter[tuple[str, str]] = Counter()
        """(action, reason) → times taken: spawn, drain, restart, degrade, restore; for metrics."""
        self.model: str | None = None
        """The model the stable replicas serve, once one was ready (kept while all restart)."""
        self._next = 0
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def serving(self) -> list[Worker]:
        """Stable replicas taking requests (the canary is not counted: the autoscaler sizes the pool)."""
        return [w for w in self.workers if w.ready and not w.draining and not w.canary]

    @property
    def starting(self) -> list[Worker]:
        """Stable replicas on their way to serving, a restarting one's drain included."""
        return [w for w in self.workers if not w.canary and (w.restarting or not (w.ready or w.draining))]

    @property
    def canary(self) -> Worker | None:
        """The canary replica, while one exists."""
        return next((w for w in self.workers if w.canary), None)

    def launch_canary(self, tables: Mapping[str, Any]) -> None:
        """Start ``canary-0``: the pool's worker stack with ``tables`` in place of its own."""
        worker = Worker("canary-0")
        worker.stack = {**self.stack, **tables}
        self.workers.append(worker)
        self.actions["spawn", "canary"] += 1
        log.info("canary_starting", tables=sorted(tables))
        self._spawn_task(self._bring_up(worker, on_failure="drop"))

    def end_canary(self, promote: bool) -> None:
        """Promote the canary (its stack becomes the pool's; stable replicas restart one at a
        time with it, then the canary retires) or roll it back (it retires)."""
        canary = self.canary
        if canary is None:
            return
        self.actions["canary_promote" if promote else "canary_rollback", "canary"] += 1
        self._spawn_task(self._conclude(canary, promote))

    async def _conclude(self, canary: Worker, promote: bool) -> None:
        if promote:
            assert canary.stack is not None
            self.stack = dict(canary.stack)
            for worker in list(self.serving):
                await self._retire(worker, "canary_promote", restart=True)
        await self._retire(canary, "canary_promote" if promote else "canary_rollback")

    async def start(self) -> None:
        """Start ``count`` workers, return once all are ready, then watch them."""
        await asyncio.gather(*(self._bring_up(self._new("start")) for _ in range(self.config.count)))
        self._spawn_task(self._watch_loop())

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for worker in self.workers:
            if worker.executor is not None:
                await worker.executor.stop()
        await asyncio.gather(*(asyncio.to_thread(w.handle.stop) for w in self.workers if w.handle))
        self.provider.close()

    def scale_to(self, target: int, drain: tuple[str, ...] = (), reason: str = "") -> None:
        """Start workers or drain some until ``target`` are serving or starting."""
        active = self.serving + self.starting
        for _ in range(target - len(active)):
            self._spawn_task(self._bring_up(self._new(reason or "scale_up"), on_failure="drop"))
        surplus = len(active) - target
        if surplus > 0:
            named = [w for w in self.serving if w.name in drain]
            rest = sorted((w for w in self.serving if w not in named), key=lambda w: w.load)
            for worker in (named + rest)[:surplus]:
                self._spawn_task(self._retire(worker, reason or "scale_down"))

    def restart(self, worker: Worker, reason: str) -> None:
        """Drain ``worker``, then start it again (self-healing)."""
        self._spawn_task(self._retire(worker, reason, restart=True))

    def _new(self, reason: str) -> Worker:
        worker = Worker(f"replica-{self._next}")
        self._next += 1
        self.workers.append(worker)
        self.actions["spawn", reason] += 1
        log.info("replica_starting", replica=worker.name, reason=reason)
        return worker

    async def _bring_up(self, worker: Worker, *, on_failure: Literal["raise", "drop", "retry"] = "raise"
                        ) -> None:
        """Launch the worker's process, wait until it serves, put it in the backends. A worker
        that fails to start raises (``on_failure="raise"``), or is logged and then dropped
        (``"drop"``: the autoscaler asks again at its next interval) or restarted after the
        crash back-off (``"retry"``: a replica being restarted keeps its slot)."""
        try:
            await self._launch(worker)
        except Exception as exc:
            if on_failure == "raise":
                raise
            log.error("replica_start_failed", replica=worker.name, error=str(exc), retry=on_failure == "retry")
            if worker.handle is not None:
                await asyncio.to_thread(worker.handle.stop)
            if on_failure == "drop":
                self.workers.remove(worker)
            else:
                self._schedule_restart(worker, time.monotonic())

    async def _launch(self, worker: Worker) -> None:
        worker.started_at = time.monotonic()
        worker.handle = await asyncio.to_thread(self.provider.launch, worker_launch(worker.name, worker.stack or self.stack))
        previous, worker.executor = worker.executor, RemoteExecutor(
            worker.name, worker.handle.address, connect_timeout_s=self.config.start_timeout_s)
        await self._until_ready(worker)
        if previous is not None:
            await previous.stop()
        self.cold_starts_s.append(time.monotonic() - worker.started_at)
        worker.ready = True
        if not worker.canary:
            self.model = worker.executor.model.id
        self.backends[worker.name] = worker.executor
        log.info("replica_ready", replica=worker.name, address=worker.address,
                 cold_start_s=round(self.cold_starts_s[-1], 2))

    async def _until_ready(self, worker: Worker) -> None:
        """Start the worker's backend, watching its process meanwhile: one that exits fails the
        start at once instead of after ``start_timeout_s``."""
        assert worker.handle is not None and worker.executor is not None
        starting = asyncio.ensure_future(worker.executor.start())
        while not (await asyncio.wait({starting}, timeout=WATCH_S))[0]:
            status = worker.handle.exited()
            if status is not None:
                starting.cancel()
                await asyncio.wait({starting})  # let it unwind; our own cancellation still propagates
                await worker.executor.stop()
                raise RuntimeError(f"worker process exited with status {status} before it was ready")
        starting.result()

    async def _retire(self, worker: Worker, reason: str, *, restart: bool = False) -> None:
        worker.draining, worker.restarting = True, restart
        if worker.executor is not None:
            worker.executor.draining = True
        self.actions["restart" if restart else "drain", reason] += 1
        log.info("replica_draining", replica=worker.name, reason=reason, restart=restart)
        await until_idle(lambda: worker.in_flight, self.drain_timeout_s)
        self.backends.pop(worker.name, None)
        if worker.handle is not None:
            await asyncio.to_thread(worker.handle.stop)
        if restart:
            worker.draining = worker.ready = worker.restarting = False
            await self._bring_up(worker, on_failure="retry")
            return
        if worker.executor is not None:
            await worker.executor.stop()
        self.workers.remove(worker)
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
            if worker.draining or worker.handle is None or worker.relaunching:
                continue
            if worker.ready and worker.restart_at is None:
                status = worker.handle.exited()
                if status is not None:
                    self.actions["restart", "crash"] += 1
                    log.warning("replica_exited", replica=worker.name, returncode=status,
                                ran_s=round(now - worker.started_at, 1))
                    self._schedule_restart(worker, now)
            if worker.restart_at is not None and now >= worker.restart_at:
                worker.restart_at = None
                worker.restarts += 1
                log.info("replica_restarting", replica=worker.name, restarts=worker.restarts)
                worker.relaunching = True
                self._spawn_task(self._relaunch(worker))

    def _schedule_restart(self, worker: Worker, now: float) -> None:
        """Start the worker again after the back-off: doubled per failure in a row, reset by a
        process that ran ``STABLE_S``."""
        ran = now - worker.started_at
        worker.crashes_in_a_row = 1 if ran >= STABLE_S else worker.crashes_in_a_row + 1
        backoff = min(MAX_BACKOFF_S, self.config.restart_backoff_s * 2 ** (worker.crashes_in_a_row - 1))
        worker.restart_at = now + backoff
        log.info("replica_restart_scheduled", replica=worker.name, restart_in_s=backoff)

    async def _relaunch(self, worker: Worker) -> None:
        try:
            await self._bring_up(worker, on_failure="retry")
        finally:
            worker.relaunching = False
