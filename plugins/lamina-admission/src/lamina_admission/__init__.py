"""Lamina admission components: who a request is (API keys → tenants), whether its body is
well-formed (a compiled JSON-Schema validator), whether it is within its rate (token bucket,
sliding window, or a limit shared between gateway replicas through the ``limits``
library) and which backends may take it (an error-rate circuit breaker per backend).

A stack selects them in ``[[admission]]`` tables; core runs authenticators, then validators,
then rate limiters, and consults breakers when routing. Registered through the ``lamina``
entry point ``admission``.
"""

from __future__ import annotations

from lamina_hookspecs import hookimpl
from lamina_hookspecs.registration import Register
from lamina_admission.api_keys import ApiKeys, ApiKeysOptions, build_api_keys
from lamina_admission.error_rate_breaker import ErrorRateBreaker, ErrorRateBreakerOptions, build_error_rate_breaker
from lamina_admission.schema_validator import SchemaValidator, SchemaValidatorOptions, build_schema_validator
from lamina_admission.shared_limit import SharedLimit, SharedLimitOptions, build_shared_limit
from lamina_admission.sliding_window import SlidingWindow, SlidingWindowOptions, build_sliding_window
from lamina_admission.token_bucket import TokenBucket, TokenBucketOptions, build_token_bucket

__all__ = [
    "ApiKeys", "ApiKeysOptions", "ErrorRateBreaker", "ErrorRateBreakerOptions", "SchemaValidator",
    "SchemaValidatorOptions", "SharedLimit", "SharedLimitOptions", "SlidingWindow", "SlidingWindowOptions",
    "TokenBucket", "TokenBucketOptions",
]


@hookimpl
def lamina_register_authenticators(register: Register) -> None:
    register("api-keys", build_api_keys, options=ApiKeysOptions)


@hookimpl
def lamina_register_validators(register: Register) -> None:
    register("openai-schema", build_schema_validator, options=SchemaValidatorOptions)


@hookimpl
def lamina_register_rate_limiters(register: Register) -> None:
    register("token-bucket", build_token_bucket, options=TokenBucketOptions)
    register("sliding-window", build_sliding_window, options=SlidingWindowOptions)
    register("shared-limit", build_shared_limit, options=SharedLimitOptions)


@hookimpl
def lamina_register_breakers(register: Register) -> None:
    register("error-rate", build_error_rate_breaker, options=ErrorRateBreakerOptions)
