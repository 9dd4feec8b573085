"""Admission: the stack's ``[[admission]]`` components, run for every request.

Whatever order the stack file lists them in, core runs authenticators first (they set the
request's tenant), then validators, then rate limiters — so a malformed or unauthenticated
request never spends anyone's rate. Breakers do not judge requests: they judge backends,
and core consults them when routing (an open circuit takes a backend out of the router's
candidates; when every candidate's circuit is open the request gets 503 with
``Retry-After``). Any entry but a breaker may be split between A/B arms like a layer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs

from lamina_hookspecs import estimate, layers
from lamina_hookspecs.errors import RateLimitError
from lamina_hookspecs.layers import Layer
from lamina_hookspecs.protocols import Breaker
from lamina_hookspecs.types import RequestContext

def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header or gRPC metadata value
    (``None`` when absent or another scheme)."""
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    return (token.strip() or None) if scheme.lower() == "bearer" else None


def estimate_tokens(body: Mapping[str, Any], context_length: int) -> int:
    """What a token rate limit charges a request body not parsed yet: its prompt's estimated tokens
    plus the most tokens it may generate, as :mod:`lamina_hookspecs.estimate` counts them."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    messages = []
    for message in body.get("messages") or ():
        content = message.get("content") if isinstance(message, Mapping) else None
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, Mapping))
        messages.append(content if isinstance(content, str) else "")
    tokens = estimate.prompt_tokens(text=prompt if isinstance(prompt, str) else None,
                                    token_ids=prompt if isinstance(prompt, list) else None, messages=messages)
    limit = body.get("max_completion_tokens") or body.get("max_tokens")
    n = body.get("n")
    return estimate.request_tokens(tokens, limit if _positive_int(limit) else None, context_length,
                                   n if _positive_int(n) else 1)


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


@attrs.define
class Entry:
    """One ``[[admission]]`` entry: its kind, the config path and a picker over its arms."""

    layer: Layer
    name: str
    pick: Callable[[RequestContext], Any]


class Admission:
    """Runs a stack's admission entries for each request and holds its breakers."""

    def __init__(self, entries: Iterable[Entry], breakers: Iterable[Breaker],
                 context_length: Callable[[], int]) -> None:
        order = {layer.key: i for i, layer in enumerate(layers.ADMISSION)}
        self.entries = sorted(entries, key=lambda e: order[e.layer.key])
        self.breakers = list(breakers)
        self.context_length = context_length

    def authenticate(self, ctx: RequestContext) -> None:
        """Run the authenticators alone (a route that reads but computes nothing: ``/v1/models``);
        raise the ``LaminaError`` that rejects the credential."""
        try:
            for entry in self.entries:
                if entry.layer is layers.AUTHENTICATOR:
                    self._authenticate(entry.pick(ctx), ctx)
        finally:
            ctx.credential = None

    @staticmethod
    def _authenticate(authenticator: Any, ctx: RequestContext) -> None:
        principal = authenticator.authenticate(ctx.credential)
        ctx.tenant, ctx.api_key_id = principal.tenant, principal.key_id

    def admit(self, ctx: RequestContext, body: Mapping[str, Any]) -> None:
        """Authenticate, validate and rate-limit one request; raise the ``LaminaError`` that rejects it."""
        try:
            for entry in self.entries:
                component = entry.pick(ctx)
                kind = entry.layer
                if kind is layers.AUTHENTICATOR:
                    self._authenticate(component, ctx)
                elif kind is layers.VALIDATOR:
                    component.validate(ctx.endpoint, body)
                elif kind is layers.RATE_LIMITER:
                    self._limit(entry.name, component, ctx, body)
        finally:
            ctx.credential = None

    def _limit(self, name: str, limiter: Any, ctx: RequestContext, body: Mapping[str, Any]) -> None:
        key_by = limiter.key_by
        key = ctx.tenant if key_by == "tenant" else (ctx.api_key_id if key_by == "api_key" else ctx.client)
        cost = 1.0 if limiter.unit == "requests" else float(estimate_tokens(body, self.context_length()))
        decision = limiter.acquire(key or "anonymous", ctx.received_at, cost)
        if not decision.allowed:
            raise RateLimitError(f"rate limit '{name}' exceeded ({limiter.unit} per {key_by}); retry in "
                                 f"{decision.retry_after_s:.2f}s", code="rate_limit_exceeded",
                                 retry_after=decision.retry_after_s)

    def retry_after(self, backend: str, now: float) -> float | None:
        """``None`` when ``backend``'s circuits are all closed (or probing), else seconds to wait."""
        waits = [wait for breaker in self.breakers if (wait := breaker.retry_after(backend, now)) is not None]
        return max(waits) if waits else None

    def started(self, backend: str, now: float) -> None:
        for breaker in self.breakers:
            breaker.started(backend, now)

    def record(self, backend: str, ok: bool, now: float) -> None:
        for breaker in self.breakers:
            breaker.record(backend, ok, now)

    @property
    def authenticates(self) -> bool:
        return any(entry.layer is layers.AUTHENTICATOR for entry in self.entries)
