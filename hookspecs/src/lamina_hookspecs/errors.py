"""One error hierarchy for the whole stack.

Every error a request can meet is a :class:`LaminaError`. Each class carries the HTTP
status, the gRPC status code name and the OpenAI error ``type`` it maps to, so that the
transports render it the same way everywhere::

    {"error": {"message": "...", "type": "invalid_request_error", "param": "messages", "code": null}}

Configuration and plugin-loading problems are :class:`ConfigError` / :class:`PluginError`:
they stop a stack from starting and never reach a client.
"""

from __future__ import annotations

from typing import Any, ClassVar


class LaminaError(Exception):
    """Base of every error Lamina reports to a client.

    :param message: what went wrong, for a person.
    :param param: the request field at fault (dotted path), if any.
    :param code: a short machine-readable code (``"rate_limit_exceeded"``), if any.
    :param retry_after: seconds after which a retry may succeed (429/503), if known.
    """

    http_status: ClassVar[int] = 500
    grpc_code: ClassVar[str] = "INTERNAL"
    openai_type: ClassVar[str] = "server_error"

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.retry_after = retry_after

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI-shaped error body."""
        return {
            "error": {
                "message": self.message,
                "type": self.openai_type,
                "param": self.param,
                "code": self.code,
            }
        }


class InvalidRequestError(LaminaError):
    """The request is malformed or asks for something unsupported (HTTP 400)."""

    http_status = 400
    grpc_code = "INVALID_ARGUMENT"
    openai_type = "invalid_request_error"


class ContextLengthError(InvalidRequestError):
    """Prompt plus requested output do not fit the model's context (HTTP 400)."""

    def __init__(self, message: str, *, param: str | None = "messages") -> None:
        super().__init__(message, param=param, code="context_length_exceeded")


class NotAcceptableError(LaminaError):
    """No codec speaks any media type the client accepts (HTTP 406)."""

    http_status = 406
    grpc_code = "INVALID_ARGUMENT"
    openai_type = "invalid_request_error"


class PayloadTooLargeError(InvalidRequestError):
    """The request body is over the server's limit (HTTP 413)."""

    http_status = 413


class UnsupportedMediaTypeError(InvalidRequestError):
    """The request body is not JSON (HTTP 415)."""

    http_status = 415


class AuthenticationError(LaminaError):
    """Missing or unknown API key (HTTP 401)."""

    http_status = 401
    grpc_code = "UNAUTHENTICATED"
    openai_type = "authentication_error"


class PermissionDeniedError(LaminaError):
    """The key is valid but may not do this (HTTP 403)."""

    http_status = 403
    grpc_code = "PERMISSION_DENIED"
    openai_type = "permission_error"


class NotFoundError(LaminaError):
    """Unknown model or route (HTTP 404)."""

    http_status = 404
    grpc_code = "NOT_FOUND"
    openai_type = "not_found_error"


class TokenizerNotAvailableError(NotFoundError):
    """The backend serving a model cannot show its tokenization (HTTP 404): its executor does not
    implement `Tokenizes`, or what it fronts does not."""

    CODE: ClassVar[str] = "tokenizer_not_available"

    def __init__(self, message: str, *, param: str | None = "model") -> None:
        super().__init__(message, param=param, code=self.CODE)


class RateLimitError(LaminaError):
    """A rate limiter refused the request (HTTP 429); ``retry_after`` says when to retry."""

    http_status = 429
    grpc_code = "RESOURCE_EXHAUSTED"
    openai_type = "rate_limit_error"


class ServiceUnavailableError(LaminaError):
    """No capacity right now: breaker open, no healthy backend, shutting down (HTTP 503)."""

    http_status = 503
    grpc_code = "UNAVAILABLE"
    openai_type = "service_unavailable"


class NoBackendError(ServiceUnavailableError):
    """The router had no backend it could choose."""


class BackendLostError(ServiceUnavailableError):
    """A backend could not be reached or went away mid-request (a worker process died).
    Core retries the request on another backend when no token was sent yet."""


class RequestTimeoutError(LaminaError):
    """The request ran past its deadline (HTTP 504)."""

    http_status = 504
    grpc_code = "DEADLINE_EXCEEDED"
    openai_type = "timeout_error"


class CodecError(LaminaError):
    """A token stream could not be encoded or decoded: malformed, truncated or oversized."""

    http_status = 502
    grpc_code = "DATA_LOSS"
    openai_type = "codec_error"


class InternalError(LaminaError):
    """A bug or an unexpected failure inside the stack (HTTP 500)."""


class ConfigError(Exception):
    """A stack file or component option is invalid.

    The message always starts with the dotted path of the offending key
    (``router.use: no router named 'leastt'; installed: round-robin``).
    """

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}" if path else problem)
        self.path = path
        self.problem = problem


class PluginError(Exception):
    """A plugin could not be imported or registered something invalid."""
