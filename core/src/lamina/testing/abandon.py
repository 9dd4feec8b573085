"""Helpers for tests of abandoned work: clients that leave, and an executor that must let go of them."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
from lamina_hookspecs.protocols import Executor


def leave_mid_answer(url: str, executor: Executor, body: dict[str, Any], clients: int) -> int:
    """Post ``body`` (non-streamed) ``clients`` times to ``url``'s ``/v1/completions``, wait until the
    executor holds all of them, then have every client hang up; returns the KV blocks held then."""

    async def go() -> int:
        async with httpx.AsyncClient(timeout=120) as client:
            posts = [asyncio.create_task(client.post(f"{url}/v1/completions", json=body)) for _ in range(clients)]
            deadline = time.monotonic() + 60
            while executor.state().outstanding_requests < clients:
                assert time.monotonic() < deadline, executor.state()
                await asyncio.sleep(0.01)
            busy = executor.state().kv_blocks_used
            for post in posts:
                post.cancel()  # the client gives up: httpx closes the connection
            await asyncio.gather(*posts, return_exceptions=True)
            return busy

    return asyncio.run(go())


def wait_until_idle(executor: Executor, within_s: float) -> None:
    """Return once ``executor`` holds no KV block and no running or queued request; fail after ``within_s``."""
    since = time.monotonic()
    while (state := executor.state()).kv_blocks_used or state.outstanding_requests or state.queue_depth:
        assert time.monotonic() - since < within_s, state
        time.sleep(0.02)
