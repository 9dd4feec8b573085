"""The client's bound on how long its request may wait to start, on both transports.

An HTTP client sends it in the ``X-Lamina-Max-Queue-Wait`` header, a gRPC client (and a gateway
forwarding to its workers) in metadata of the same name, in seconds. It only tightens the
executor's own ``max_queue_wait_s``: a request still waiting past it fails with 503
``queue_timeout``, and one the queue ahead would already keep waiting longer is refused at once
(503 ``overloaded``), both with ``Retry-After``.
"""

from __future__ import annotations

import math

import attrs
from lamina_hookspecs.errors import InvalidRequestError
from lamina_hookspecs.types import Request

MAX_QUEUE_WAIT_HEADER = "x-lamina-max-queue-wait"


def max_queue_wait(value: str | None) -> float | None:
    """The header's seconds (``None`` when it is absent); 400 naming it unless a positive number."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise InvalidRequestError(f"{MAX_QUEUE_WAIT_HEADER} must be a positive number of seconds, not {value!r}",
                                  param=MAX_QUEUE_WAIT_HEADER)
    return seconds


def bounded(request: Request, seconds: float | None) -> Request:
    """``request`` carrying the client's bound ``seconds`` (unchanged when there is none)."""
    return request if seconds is None else attrs.evolve(request, max_queue_wait_s=seconds)
