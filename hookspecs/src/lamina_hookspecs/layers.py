"""The layers (and admission/batching components) that plugins can fill, in one table."""

from __future__ import annotations

import attrs

from lamina_hookspecs import protocols


@attrs.frozen(kw_only=True)
class Layer:
    """One kind of component.

    :param key: the stack-file section (``router``, ``prefix_cache``, ...).
    :param noun: how errors and listings name one component (``"router"``).
    :param hook: the registration hookspec that plugins implement.
    :param protocol: what an instance must provide.
    """

    key: str
    noun: str
    hook: str
    protocol: type


ROUTER = Layer(key="router", noun="router", hook="lamina_register_routers", protocol=protocols.Router)
CODEC = Layer(key="codec", noun="codec", hook="lamina_register_codecs", protocol=protocols.Codec)
EXECUTOR = Layer(key="executor", noun="executor", hook="lamina_register_executors", protocol=protocols.Executor)
PREFIX_CACHE = Layer(
    key="prefix_cache", noun="prefix cache", hook="lamina_register_prefix_caches", protocol=protocols.PrefixCache
)
AUTOSCALER = Layer(
    key="autoscaler", noun="autoscaler", hook="lamina_register_autoscalers", protocol=protocols.Autoscaler
)
RATE_LIMITER = Layer(
    key="rate_limiter", noun="rate limiter", hook="lamina_register_rate_limiters", protocol=protocols.RateLimiter
)
AUTHENTICATOR = Layer(
    key="authenticator", noun="authenticator", hook="lamina_register_authenticators",
    protocol=protocols.Authenticator,
)
VALIDATOR = Layer(key="validator", noun="validator", hook="lamina_register_validators", protocol=protocols.Validator)
BREAKER = Layer(key="breaker", noun="breaker", hook="lamina_register_breakers", protocol=protocols.Breaker)
BATCHING = Layer(
    key="batching", noun="batching policy", hook="lamina_register_batching_policies", protocol=protocols.BatchingPolicy
)
PREWARM = Layer(
    key="prewarm", noun="pre-warm policy", hook="lamina_register_prewarm_policies", protocol=protocols.PrewarmPolicy
)
OBSERVER = Layer(key="observer", noun="observer", hook="lamina_register_observers", protocol=protocols.Observer)
REPLICA_PROVIDER = Layer(key="replica_provider", noun="replica provider", hook="lamina_register_replica_providers",
                         protocol=protocols.ReplicaProvider)
TOOL_PARSER = Layer(key="tool_parser", noun="tool parser", hook="lamina_register_tool_parsers",
                    protocol=protocols.ToolParser)

LAYERS: tuple[Layer, ...] = (
    ROUTER, CODEC, EXECUTOR, PREFIX_CACHE, AUTOSCALER, AUTHENTICATOR, VALIDATOR, RATE_LIMITER, BREAKER, BATCHING,
    PREWARM, OBSERVER, REPLICA_PROVIDER, TOOL_PARSER,
)
"""Every registrable kind, in the order ``lamina plugins`` lists them."""

ADMISSION: tuple[Layer, ...] = (AUTHENTICATOR, VALIDATOR, RATE_LIMITER, BREAKER)
"""The kinds a stack's ``[[admission]]`` list may use, in the order core runs them (whatever
the order of the list); their names share one namespace."""
