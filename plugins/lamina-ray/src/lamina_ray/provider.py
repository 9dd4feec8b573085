"""The ``ray`` replica provider: each replica a :class:`WorkerActor`, placed by Ray."""

from __future__ import annotations

import concurrent.futures
import contextlib
import sys
import threading
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError

from lamina_hookspecs.types import WorkerLaunch
from lamina_ray.actor import STOP_TIMEOUT_S, WorkerActor
from lamina_ray.options import RayOptions


class RayHandle:
    """One replica's actor. ``exited`` never blocks (core calls it on the event loop): it asks
    the actor and reads the answer at a later call."""

    def __init__(self, actor: Any, address: str) -> None:
        self.address, self._actor = address, actor
        self._poll: ray.ObjectRef | None = None
        self._status: int | None = None

    def exited(self) -> int | None:
        if self._status is not None:
            return self._status
        if self._poll is None:
            self._poll = self._actor.poll.remote()
        ready, _ = ray.wait([self._poll], timeout=0)
        if not ready:
            return None
        self._poll = None
        try:
            status = ray.get(ready[0])
        except RayActorError:  # killed, crashed, or its node is gone
            status = -1
        if status is not None:
            self._status = status
            ray.kill(self._actor)  # a worker that exited leaves its actor holding resources
        return status

    def stop(self) -> None:
        with contextlib.suppress(RayActorError, GetTimeoutError):
            ray.get(self._actor.stop.remote(), timeout=STOP_TIMEOUT_S + 5.0)
        ray.kill(self._actor)


class RayProvider:
    """Joins (or starts) Ray at the first launch; ``close`` shuts down only a Ray it started."""

    def __init__(self, options: RayOptions, stack_name: str) -> None:
        self.options, self.stack_name = options, stack_name
        self._lock = threading.Lock()
        self._session: _Session | None = None
        self._launched = 0
        local = {"py_executable": sys.executable} if options.address is None else {}
        self._runtime_env = {**local, **options.runtime_env}

    def launch(self, worker: WorkerLaunch) -> RayHandle:
        with self._lock:
            if not ray.is_initialized():
                self._session = _Session(self.options.address)
            self._launched += 1
            launched = self._launched
        actor = WorkerActor.options(
            name=f"lamina:{self.stack_name}:{worker.name}:{launched}", max_restarts=0,  # the pool decides restarts
            num_cpus=self.options.num_cpus, num_gpus=self.options.num_gpus, resources=self.options.resources,
            runtime_env=self._runtime_env,
        ).remote(worker)
        try:
            address = ray.get(actor.address.remote(), timeout=self.options.start_timeout_s)
        except BaseException:
            ray.kill(actor)
            raise
        return RayHandle(actor, address)

    def close(self) -> None:
        if self._session is not None:
            self._session.close()


class _Session:
    """Ray initialised by the provider, from a thread that lives until :meth:`close`: a local
    cluster's processes die with the thread that started them (``PR_SET_PDEATHSIG``)."""

    def __init__(self, address: str | None) -> None:
        self._closing = threading.Event()
        started: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._hold, args=(address, started), name="lamina-ray", daemon=True)
        self._thread.start()
        started.result()

    def _hold(self, address: str | None, started: concurrent.futures.Future[None]) -> None:
        try:
            if address is None:
                ray.init(address="local", include_dashboard=False)
            else:
                ray.init(address=address)
        except BaseException as error:
            started.set_exception(error)
            return
        started.set_result(None)
        self._closing.wait()
        ray.shutdown()

    def close(self) -> None:
        self._closing.set()
        self._thread.join()

