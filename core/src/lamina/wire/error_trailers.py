"""A :class:`~lamina_hookspecs.errors.LaminaError` across gRPC, in the call's trailing metadata.

A gRPC status carries only a code and a message, and several Lamina errors share a code: a worker
that refuses a request (503 ``overloaded``, ``queue_full``, ``queue_timeout``, ``draining``) ends
the call UNAVAILABLE, as a worker that died does. So the worker also sends the error's class, code,
param and Retry-After as trailers, and the gateway rebuilds the same error from them: its client
gets what a single server would have sent, and only a worker that is really lost (no trailers)
counts as a lost backend, retried elsewhere.
"""

from __future__ import annotations

from collections.abc import Iterable

from lamina_hookspecs import errors
from lamina_hookspecs.errors import LaminaError

ERROR_CLASS = "x-lamina-error"
ERROR_CODE = "x-lamina-error-code"
ERROR_PARAM = "x-lamina-error-param"
RETRY_AFTER = "retry-after"

_CLASSES: dict[str, type[LaminaError]] = {
    name: cls for name, cls in vars(errors).items() if isinstance(cls, type) and issubclass(cls, LaminaError)}


def _fits(value: str) -> bool:
    """Whether ``value`` may be a gRPC metadata value (printable ASCII)."""
    return value.isascii() and value.isprintable()


def error_trailers(error: LaminaError) -> tuple[tuple[str, str], ...]:
    """The trailers that describe ``error`` (those of its fields a metadata value can hold)."""
    fields = [(ERROR_CLASS, type(error).__name__), (ERROR_CODE, error.code), (ERROR_PARAM, error.param),
              (RETRY_AFTER, None if error.retry_after is None else str(max(1, round(error.retry_after))))]
    return tuple((key, value) for key, value in fields if value is not None and _fits(value))


def error_from_trailers(message: str, trailers: Iterable[tuple[str, str | bytes]] | None) -> LaminaError | None:
    """The error :func:`error_trailers` described, with ``message``; None when the trailers name none
    (a peer that is not a Lamina worker, or a call that failed before the worker answered)."""
    fields = {key: value for key, value in trailers or () if isinstance(value, str)}
    cls = _CLASSES.get(fields.get(ERROR_CLASS, ""))
    if cls is None:
        return None
    try:
        retry_after = float(fields[RETRY_AFTER]) if RETRY_AFTER in fields else None
    except ValueError:
        retry_after = None
    error = cls.__new__(cls)  # every field as sent, past a subclass's own defaults (ContextLengthError's code)
    LaminaError.__init__(error, message, param=fields.get(ERROR_PARAM), code=fields.get(ERROR_CODE),
                         retry_after=retry_after)
    return error
