"""``until_idle``: the one bounded wait for in-flight work behind every drain."""

from __future__ import annotations

import asyncio
import time

from lamina.kernel.drain import until_idle


def test_returns_once_the_work_is_done_and_says_what_a_timeout_left() -> None:
    left = [3]

    def in_flight() -> int:
        left[0] = max(left[0] - 1, 0)
        return left[0]

    began = time.monotonic()
    assert asyncio.run(until_idle(in_flight, 5.0, poll_s=0.01)) == 0
    assert time.monotonic() - began < 1.0
    began = time.monotonic()
    assert asyncio.run(until_idle(lambda: 2, 0.1, poll_s=0.01)) == 2
    assert 0.1 <= time.monotonic() - began < 1.0
