"""The ``p2c`` router: the power of two choices.

Samples two distinct available backends at random and takes the less loaded by outstanding
tokens, then queue depth (on a full tie, the first drawn). Mitzenmacher ("The Power of Two
Choices in Randomized Load Balancing", 2001) showed that two random choices instead of one
cut the maximum load exponentially; unlike always picking the least loaded, it does not send
a whole burst to the one backend whose stale snapshot looks emptiest. Envoy's
``LEAST_REQUEST`` and Finagle's default balancer work the same way. O(backends), for the
list of available ones; ``seed`` makes the draws reproducible.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import attrs

from lamina_hookspecs.registration import BuildContext
from lamina_hookspecs.types import BackendState, Request
from lamina_routing.candidates import available


@attrs.frozen(kw_only=True)
class P2COptions:
    """Stack-file options of ``p2c``."""

    seed: int | None = attrs.field(default=None, metadata={
        "help": "seed of the random draws (reproducible routing); unset: seeded from the OS"})


class PowerOfTwoChoices:
    """Two random available backends; the one with fewer outstanding tokens (then queue) wins."""

    def __init__(self, seed: int | None = None) -> None:
        self._rng = random.Random(seed)

    def choose(self, request: Request, backends: Sequence[BackendState]) -> BackendState:
        candidates = available(backends)
        if len(candidates) == 1:
            return candidates[0]
        first, second = self._rng.sample(candidates, 2)
        if (second.outstanding_tokens, second.queue_depth) < (first.outstanding_tokens, first.queue_depth):
            return second
        return first


def build_p2c(options: P2COptions, context: BuildContext) -> PowerOfTwoChoices:
    """Power of two choices: the less loaded (outstanding tokens) of two random backends."""
    return PowerOfTwoChoices(options.seed)
