"""The round-robin router: each available backend in turn."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from lamina_hookspecs.registration import BuildContext
from lamina_hookspecs.types import BackendState, Request
from lamina_routing.candidates import available


class RoundRobin:
    """Sends each request to the next available backend, skipping unhealthy and draining ones."""

    def __init__(self) -> None:
        self._counter = itertools.count()

    def choose(self, request: Request, backends: Sequence[BackendState]) -> BackendState:
        candidates = available(backends)
        return candidates[next(self._counter) % len(candidates)]


def build_round_robin(options: None, context: BuildContext) -> RoundRobin:
    """Each available backend in turn."""
    return RoundRobin()
