"""Waiting for in-flight work to finish, bounded: a server's drain, a worker's, a replica's retirement."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


async def until_idle(in_flight: Callable[[], int], timeout_s: float, *, poll_s: float = 0.05) -> int:
    """Wait until ``in_flight()`` is 0 or ``timeout_s`` has passed, checking every ``poll_s``; what is left."""
    deadline = time.monotonic() + timeout_s
    while (left := in_flight()) and time.monotonic() < deadline:
        await asyncio.sleep(poll_s)
    return left
