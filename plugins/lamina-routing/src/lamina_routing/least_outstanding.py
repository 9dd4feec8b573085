"""The ``least-outstanding-tokens`` router: the available backend with the fewest tokens in flight.

A backend's outstanding tokens are the prompt plus ``max_tokens`` of every request it holds,
so this weighs a long request more than a short one, where "least connections" (HAProxy's
``leastconn``, NGINX's ``least_conn``) counts them alike. Ties go to the fewest outstanding requests, then by turns,
so that equal backends share a burst that arrives before their counts move. O(backends).
"""

from __future__ import annotations

from collections.abc import Sequence

from lamina_hookspecs.registration import BuildContext
from lamina_hookspecs.types import BackendState, Request
from lamina_routing.candidates import Rotation, available


class LeastOutstandingTokens:
    """Routes to the available backend with the fewest outstanding tokens, then requests."""

    def __init__(self) -> None:
        self._rotation = Rotation()

    def choose(self, request: Request, backends: Sequence[BackendState]) -> BackendState:
        candidates = available(backends)
        best = min((b.outstanding_tokens, b.outstanding_requests) for b in candidates)
        tied = [b for b in candidates if (b.outstanding_tokens, b.outstanding_requests) == best]
        return self._rotation.pick(tied)


def build_least_outstanding_tokens(options: None, context: BuildContext) -> LeastOutstandingTokens:
    """The available backend with the fewest outstanding tokens (ties: requests, then by turns)."""
    return LeastOutstandingTokens()
