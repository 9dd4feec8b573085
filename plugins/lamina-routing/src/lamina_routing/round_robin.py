"""The round-robin router: each available backend in turn."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from lamina_hookspecs.errors import NoBackendError
from lamina_hookspecs.registration import BuildContext
from lamina_hookspecs.types import BackendState, Request


class RoundRobin:
    """Sends each request to the next available backend, skipping unhealthy and draining ones."""

    def __init__(self) -> None:
        self._counter = itertools.count()

    def choose(self, request: Request, backends: Sequence[BackendState]) -> BackendState:
        available = [b for b in backends if b.available]
        if not available:
            raise NoBackendError("no healthy backend", code="no_backend")
        return available[next(self._counter) % len(available)]


def build_round_robin(options: None, context: BuildContext) -> RoundRobin:
    """Each available backend in turn."""
    return RoundRobin()
