"""Filters of the ``scored`` router: which backends it scores at all.

:func:`servable` always comes first: the available backends that serve the request's model.
The named filters follow, each with a limit, in the order the stack file lists them; one
that would leave no backend is skipped, since a router may not refuse a request while an
available backend exists.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar

from lamina_hookspecs.errors import NoBackendError
from lamina_hookspecs.types import BackendState, Request
from lamina_routing.candidates import available


def servable(request: Request, backends: Sequence[BackendState]) -> list[BackendState]:
    """The available backends serving ``request.model``; ``NoBackendError`` if there are none."""
    serving = [b for b in available(backends) if b.model == request.model]
    if not serving:
        raise NoBackendError(f"no available backend serves model {request.model!r}", code="no_backend")
    return serving


class Filter:
    """Keeps the backends within ``limit`` (between 0 and ``most``)."""

    name: ClassVar[str]
    most: ClassVar[float] = math.inf

    def __init__(self, limit: float) -> None:
        self.limit = limit

    def keep(self, backend: BackendState) -> bool:
        raise NotImplementedError


class MaxQueueDepth(Filter):
    """Drops backends with more than ``limit`` requests waiting."""

    name = "max_queue_depth"

    def keep(self, backend: BackendState) -> bool:
        return backend.queue_depth <= self.limit


class MaxKvUsage(Filter):
    """Drops backends whose KV cache is fuller than ``limit`` (a fraction)."""

    name = "max_kv_usage"
    most = 1.0

    def keep(self, backend: BackendState) -> bool:
        return backend.kv_usage <= self.limit


FILTERS: dict[str, type[Filter]] = {cls.name: cls for cls in (MaxQueueDepth, MaxKvUsage)}
