"""The Ray actor that holds one ``lamina worker`` process on the node Ray placed it on."""

from __future__ import annotations

import ctypes
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable

import ray
from lamina_hookspecs.types import WorkerLaunch

PR_SET_PDEATHSIG = 1
STOP_TIMEOUT_S = 10.0


def _die_with_actor() -> Callable[[], None] | None:
    """A ``preexec_fn`` by which Linux SIGKILLs the worker when the actor's process dies
    (``ray.kill``, a crash), so no worker outlives its actor; ``None`` elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)  # loaded before the fork: the child only calls prctl
    return lambda: libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _free_port(host: str) -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


@ray.remote
class WorkerActor:
    """Runs core's ``lamina worker`` command line on its node's IP and a free port; its resources
    (CPUs, GPUs) are the actor's, so Ray's placement is the worker's."""

    def __init__(self, worker: WorkerLaunch) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="lamina-worker-")
        worker.write_files(self._dir.name)
        host = ray.util.get_node_ip_address()
        port = _free_port(host)
        self._address = f"{host}:{port}"
        self._process = subprocess.Popen(
            worker.argv(python=sys.executable, files_dir=self._dir.name, host=host, port=port),
            preexec_fn=_die_with_actor())

    def address(self) -> str:
        return self._address

    def poll(self) -> int | None:
        return self._process.poll()

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM (the worker drains), then SIGKILL after ``timeout_s``."""
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._dir.cleanup()
