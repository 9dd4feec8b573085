"""Lamina routers (layer 1). Registered through the ``lamina`` entry point ``routing``.

* ``round-robin``: each available backend in turn.
* ``least-outstanding-tokens``: the fewest tokens in flight.
* ``p2c``: the less loaded of two random backends.
* ``prefix-affinity``: consistent hashing with bounded loads on tenant + prompt prefix.
* ``scored``: filters, weighted scorers and a picker, composed from options.
"""

from __future__ import annotations

from lamina_hookspecs import hookimpl
from lamina_hookspecs.registration import Register
from lamina_routing.least_outstanding import build_least_outstanding_tokens
from lamina_routing.p2c import P2COptions, build_p2c
from lamina_routing.prefix_affinity import PrefixAffinityOptions, build_prefix_affinity
from lamina_routing.round_robin import build_round_robin
from lamina_routing.scored import ScoredOptions, build_scored


@hookimpl
def lamina_register_routers(register: Register) -> None:
    register("round-robin", build_round_robin)
    register("least-outstanding-tokens", build_least_outstanding_tokens)
    register("p2c", build_p2c, options=P2COptions)
    register("prefix-affinity", build_prefix_affinity, options=PrefixAffinityOptions)
    register("scored", build_scored, options=ScoredOptions)
