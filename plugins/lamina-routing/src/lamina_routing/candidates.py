"""What the routers here share: the available backends, and a rotating tie-break."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import TypeVar

from lamina_hookspecs.errors import NoBackendError
from lamina_hookspecs.types import BackendState

T = TypeVar("T")


def available(backends: Sequence[BackendState]) -> list[BackendState]:
    """The backends that may take new work; ``NoBackendError`` (code ``no_backend``) if none may."""
    found = [b for b in backends if b.available]
    if not found:
        why = f"all {len(backends)} are unhealthy, draining or have their circuit open" if backends else "none offered"
        raise NoBackendError(f"no backend is available: {why}", code="no_backend")
    return found


class Rotation:
    """Breaks ties by turns, so that equally good backends share the load."""

    def __init__(self) -> None:
        self._counter = itertools.count()

    def pick(self, tied: Sequence[T]) -> T:
        """One of ``tied`` (non-empty): the only one, or the next in turn."""
        if len(tied) == 1:
            return tied[0]
        return tied[next(self._counter) % len(tied)]
