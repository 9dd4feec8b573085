"""The ``prefix-affinity`` router: consistent hashing with bounded loads (CHWBL).

Requests whose prompts start alike (same tenant, same system prompt and early turns: see
:mod:`lamina_routing.prefix_key`) hash to the same point of a consistent-hash ring
(:mod:`lamina_routing.hash_ring`), so they meet the backend whose prefix cache already holds
their KV. A plain ring would let one hot prefix overload its backend; bounded loads
(Mirrokni, Thorup and Zadimoghaddam, "Consistent Hashing with Bounded Loads", SODA 2018, as
in HAProxy's ``hash-balance-factor`` contributed by Vimeo) walk on clockwise instead, to the
first available backend whose load is at most ``ceil(load_factor * (total + 1) / n)``,
``total`` being the load of the ``n`` available backends. llm-d's prefix-aware scorer
likewise keys requests by hashes of their leading prompt blocks, but looks them up in an
index of which replica holds which block; a ring needs no index, only stable placement.

Load is ``outstanding_requests`` (the paper's and HAProxy's unit: the ``+ 1`` is the
request being placed), not outstanding tokens, whose sizes vary too much for one request to
be one unit. A backend at the bound still takes the request, so after it a backend holds at
most the bound plus one; the least loaded always qualifies, so the walk always ends.

The ring holds every offered backend, available or not: skipping an unavailable one while
walking sends its keys where they would go were it removed, so a backend that fails and
recovers does not rebuild the ring. It is rebuilt only when the offered names change.
Each request costs O(backends) plus O(log(backends * virtual_nodes)) to find its point.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import attrs

from lamina_hookspecs.registration import BuildContext
from lamina_hookspecs.types import BackendState, Request
from lamina_routing.candidates import available
from lamina_routing.hash_ring import HashRing
from lamina_routing.prefix_key import prefix_key


@attrs.frozen(kw_only=True)
class PrefixAffinityOptions:
    """Stack-file options of ``prefix-affinity``."""

    virtual_nodes: int = attrs.field(default=100, validator=[attrs.validators.ge(1), attrs.validators.le(10_000)],
                                     metadata={"help": "points per backend on the hash ring (more: evener shares)"})
    prefix_blocks: int = attrs.field(default=4, validator=attrs.validators.ge(1), metadata={
        "help": "how many leading blocks of the prompt form the key"})
    block_tokens: int = attrs.field(default=16, validator=attrs.validators.ge(1), metadata={
        "help": "tokens per block (the prefix cache's block size); text counts 4 bytes a token"})
    load_factor: float = attrs.field(default=1.25, validator=[attrs.validators.ge(1.0), attrs.validators.le(100.0)],
                                     metadata={"help": "a backend takes the request while its outstanding requests "
                                                       "are at most this times the average (rounded up)"})


class PrefixAffinity:
    """Routes requests sharing a tenant and prompt prefix to the same backend, within a load bound."""

    def __init__(self, options: PrefixAffinityOptions) -> None:
        self.options = options
        self._ring: HashRing | None = None

    def choose(self, request: Request, backends: Sequence[BackendState]) -> BackendState:
        return self.pick(request, backends, available(backends))

    def pick(self, request: Request, backends: Sequence[BackendState],
             candidates: Sequence[BackendState]) -> BackendState:
        """The bounded-load choice among ``candidates`` (non-empty, some of the ``backends``
        objects), on the ring of all ``backends``."""
        ring = self._ring_of(backends)
        allowed = {id(b) for b in candidates}
        bound = math.ceil(self.options.load_factor * (sum(b.outstanding_requests for b in candidates) + 1)
                          / len(candidates))
        key = prefix_key(request, prefix_blocks=self.options.prefix_blocks, block_tokens=self.options.block_tokens)
        for owner in ring.walk(key):
            backend = backends[owner]
            if id(backend) in allowed and backend.outstanding_requests <= bound:
                return backend
        raise ValueError("candidates must be among the backends")

    def _ring_of(self, backends: Sequence[BackendState]) -> HashRing:
        names = tuple(b.name for b in backends)
        if self._ring is None or self._ring.names != names:
            self._ring = HashRing(names, self.options.virtual_nodes)
        return self._ring


def build_prefix_affinity(options: PrefixAffinityOptions, context: BuildContext) -> PrefixAffinity:
    """Consistent hashing with bounded loads on tenant + prompt prefix (prefix-cache affinity)."""
    return PrefixAffinity(options)
