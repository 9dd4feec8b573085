"""An example Lamina plugin: the ``shortest-queue`` router.

Depends on ``lamina-hookspecs`` only. The entry point in ``pyproject.toml``
(``[project.entry-points.lamina] hello = "lamina_hello"``) is how Lamina finds it.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from lamina_hookspecs import hookimpl
from lamina_hookspecs.errors import NoBackendError
from lamina_hookspecs.registration import BuildContext, Register
from lamina_hookspecs.types import BackendState, Request


@attrs.frozen(kw_only=True)
class ShortestQueueOptions:
    """Stack-file options of ``shortest-queue``."""

    count_running: bool = attrs.field(
        default=True, metadata={"help": "count running requests too, not only waiting ones"}
    )


@attrs.frozen
class ShortestQueue:
    """Routes to the available backend with the fewest queued (and running) requests."""

    options: ShortestQueueOptions

    def choose(self, request: Request, backends: Sequence[BackendState]) -> BackendState:
        available = [b for b in backends if b.available]
        if not available:
            raise NoBackendError("no healthy backend", code="no_backend")
        running = 1 if self.options.count_running else 0
        return min(available, key=lambda b: b.queue_depth + running * b.outstanding_requests)


def build(options: ShortestQueueOptions, context: BuildContext) -> ShortestQueue:
    """Routes to the available backend with the fewest queued (and running) requests."""
    return ShortestQueue(options)


@hookimpl
def lamina_register_routers(register: Register) -> None:
    register("shortest-queue", build, options=ShortestQueueOptions)
