"""Core's admission: order of the kinds, keys and costs given to limiters, A/B arms, breakers."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest
from lamina.kernel.admission import bearer_token, estimate_tokens
from lamina.kernel.pipeline import run_request
from lamina_hookspecs import hookimpl
from lamina_hookspecs.errors import AuthenticationError, ConfigError, NoBackendError, RateLimitError
from lamina_hookspecs.types import Principal, RateDecision, Request, RequestContext



class Recording:
    """An authenticator, a validator, a limiter and a breaker that log what core asks them."""

    def __init__(self) -> None:
        self.log: list[tuple[Any, ...]] = []
        self.open_backends: dict[str, float] = {}

    @hookimpl
    def lamina_register_authenticators(self, register: Any) -> None:
        log = self.log

        class Auth:
            def authenticate(self, credential: str | None) -> Principal:
                log.append(("authenticate", credential))
                if credential != "good":
                    raise AuthenticationError("invalid API key", code="invalid_api_key")
                return Principal(tenant="acme", key_id="k1")

        register("auth", lambda o, c: Auth())

    @hookimpl
    def lamina_register_validators(self, register: Any) -> None:
        log = self.log

        class Check:
            def validate(self, endpoint: str, body: Any) -> None:
                log.append(("validate", endpoint))

        register("check", lambda o, c: Check())

    @hookimpl
    def lamina_register_rate_limiters(self, register: Any) -> None:
        log = self.log

        def limiter(key_by: str, unit: str, allowed: bool = True) -> Any:
            class Limit:
                def acquire(self, key: str, now: float, cost: float = 1.0) -> RateDecision:
                    log.append(("acquire", key, cost))
                    return RateDecision(allowed=allowed, retry_after_s=0.0 if allowed else 1.5)

            Limit.key_by, Limit.unit = key_by, unit  # type: ignore[attr-defined]
            return Limit()

        register("per-tenant", lambda o, c: limiter("tenant", "requests"))
        register("per-key-tokens", lambda o, c: limiter("api_key", "tokens"))
        register("per-client", lambda o, c: limiter("client", "requests", allowed=False))

    @hookimpl
    def lamina_register_breakers(self, register: Any) -> None:
        recording = self

        class Watch:
            def retry_after(self, key: str, now: float) -> float | None:
                return recording.open_backends.get(key)

            def started(self, key: str, now: float) -> None:
                recording.log.append(("started", key))

            def record(self, key: str, ok: bool, now: float) -> None:
                recording.log.append(("record", key, ok))

        register("watch", lambda o, c: Watch())


def admit(stack: Any, body: dict[str, Any], credential: str | None = "good",
          client: str = "10.0.0.7") -> RequestContext:
    ctx = RequestContext(request_id="r", endpoint="completion", credential=credential, client=client)

    async def go() -> RequestContext:
        await stack.start()
        try:
            async for _ in run_request(stack, ctx, body, lambda b: Request(id="r", model="echo", prompt=b["prompt"])):
                pass
        finally:
            await stack.stop()
        return ctx

    return asyncio.run(go())


def test_authenticate_then_validate_then_limit_whatever_the_listed_order(build_stack: Any) -> None:
    rec = Recording()
    stack = build_stack(("rec", rec), overrides={"admission": [
        {"use": "per-key-tokens"}, {"use": "watch"}, {"use": "per-tenant"}, {"use": "check"}, {"use": "auth"}]})
    ctx = admit(stack, {"prompt": "x" * 40, "max_tokens": 5})
    assert rec.log == [("authenticate", "good"), ("validate", "completion"), ("acquire", "k1", 15.0),
                       ("acquire", "acme", 1.0), ("started", "local"), ("record", "local", True)]
    assert ctx.tenant == "acme" and ctx.api_key_id == "k1"
    assert ctx.credential is None, "core drops the credential once admission ran"


def test_a_rejected_key_stops_admission_and_is_dropped_too(build_stack: Any) -> None:
    rec = Recording()
    stack = build_stack(("rec", rec), overrides={"admission": [{"use": "per-tenant"}, {"use": "auth"}]})
    with pytest.raises(AuthenticationError):
        admit(stack, {"prompt": "x"}, credential="bad")
    assert rec.log == [("authenticate", "bad")]


def test_limit_by_client_refuses_with_retry_after(build_stack: Any) -> None:
    rec = Recording()
    stack = build_stack(("rec", rec), overrides={"admission": [{"use": "per-client"}]})
    with pytest.raises(RateLimitError) as info:
        admit(stack, {"prompt": "x"})
    assert rec.log == [("acquire", "10.0.0.7", 1.0)]
    assert info.value.retry_after == 1.5 and "per client" in info.value.message
    assert not any(entry[0] == "started" for entry in rec.log), "a refused request never reaches a backend"


def test_open_circuits_take_backends_out_and_give_503_with_retry_after(build_stack: Any) -> None:
    rec = Recording()
    rec.open_backends["local"] = 7.0
    stack = build_stack(("rec", rec), overrides={"admission": [{"use": "watch"}]})
    with pytest.raises(NoBackendError) as info:
        admit(stack, {"prompt": "x"})
    assert info.value.code == "circuit_open" and info.value.retry_after == 7.0 and info.value.http_status == 503
    assert rec.log == [], "no request started, so no outcome is recorded"


def test_an_admission_entry_splits_into_arms_by_tenant(build_stack: Any) -> None:
    rec = Recording()
    stack = build_stack(("rec", rec), overrides={"admission": [
        {"use": "auth"},
        {"sticky_by": "tenant", "arms": [{"name": "a", "use": "per-tenant"}, {"name": "b", "use": "per-key-tokens"}]},
    ]})
    ctx = admit(stack, {"prompt": "x"})
    assert ctx.arms["admission[1]"] in ("a", "b")
    assert ctx.arms == admit(stack, {"prompt": "y"}).arms, "sticky by tenant"


@pytest.mark.parametrize(("entry", "message"), [
    ({"arms": [{"name": "a", "use": "watch"}, {"name": "b", "use": "watch"}]},
     "admission[0].arms: a breaker watches backends, not requests"),
    ({"arms": [{"name": "a", "use": "per-tenant"}, {"name": "b", "use": "check"}]},
     "admission[0].arms: every arm must be the same kind of component; got rate limiter, validator"),
])
def test_splits_that_make_no_sense_are_config_errors(build_stack: Any, entry: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        build_stack(("rec", Recording()), overrides={"admission": [entry]})


def test_a_factory_config_error_is_reported_at_the_entry_path(build_stack: Any) -> None:
    class Picky:
        @hookimpl
        def lamina_register_validators(self, register: Any) -> None:
            def build(options: Any, context: Any) -> Any:
                raise ConfigError("schema_file", "not found")

            register("picky", build)

    with pytest.raises(ConfigError, match=r"^admission\[0\]\.schema_file: not found$"):
        build_stack(("picky", Picky()), overrides={"admission": [{"use": "picky"}]})


@pytest.mark.parametrize(("header", "token"), [
    ("Bearer sk-1", "sk-1"), ("bearer   sk-1 ", "sk-1"), ("Basic abc", None), ("Bearer ", None), (None, None)])
def test_bearer_token(header: str | None, token: str | None) -> None:
    assert bearer_token(header) == token


@pytest.mark.parametrize(("body", "tokens"), [
    ({"prompt": "abcdefgh", "max_tokens": 10}, 2 + 10),
    ({"prompt": [1, 2, 3], "max_tokens": 1}, 3 + 1),
    ({"prompt": ["abcde"], "max_tokens": 1}, 2 + 1),
    ({"messages": [{"role": "user", "content": "abcd"}], "max_completion_tokens": 7}, 4 + 1 + 7),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "abcd"}]}]}, 100),
    ({"prompt": "abcd"}, 100),
    ({"prompt": [1, 2, 3], "max_tokens": 5, "n": 3}, 3 + 3 * 5),
    ({"prompt": [1, 2, 3], "max_tokens": 5, "n": True}, 3 + 5),
])
def test_token_cost_is_prompt_estimate_plus_max_tokens(body: dict[str, Any], tokens: int) -> None:
    assert estimate_tokens(body, context_length=100) == tokens

