"""A connection to the upstream opened before the request that will use it, for engines that close
each connection once they have streamed a response over it (llama-server).

Against such an engine every request needs a new connection, and opening one (the TCP connect and
aiohttp's set-up of it) lies on the request's way to its first token. `ConnectAhead` opens the next
connection `AFTER_CLOSE_S` after a POST's connection closes, so that the next POST finds one waiting.
GETs (the health and load polls) connect for themselves and leave it be. A connection nobody took
within ``fresh_s`` is closed unused: llama-server's HTTP library closes idle ones after 5 s, and one
it closed just as a request went out would fail that request with nothing sent.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import aiohttp
from aiohttp.client_proto import ResponseHandler
from aiohttp.client_reqrep import ClientRequest, ConnectionKey

FRESH_S = 4.0
"""How long a connection opened ahead waits for a request before it is closed unused."""
AFTER_CLOSE_S = 0.005
"""How long after a POST's connection closes the next is opened. A stream's connection closes as its
last event arrives, before that event has reached the client; opened at once, the next connection
would be opened on the way to the client's first token when the stream is one token long."""


class ConnectAhead(aiohttp.TCPConnector):
    """A ``force_close`` connector that holds one connection opened ahead for the next POST."""

    def __init__(self, *, fresh_s: float = FRESH_S, **kwargs: Any) -> None:
        super().__init__(force_close=True, **kwargs)
        self.fresh_s = fresh_s
        self.taken = 0  # requests that found a connection waiting
        self._ahead: asyncio.Task[ResponseHandler] | None = None
        self._ahead_key: ConnectionKey | None = None

    async def _create_connection(self, req: ClientRequest, traces: list[Any],
                                 timeout: aiohttp.ClientTimeout) -> ResponseHandler:
        # aiohttp's hook for opening a connection (private, with this signature since aiohttp 3.0);
        # what it returns the connector registers and closes like any other of its connections.
        if req.method != "POST":
            return await super()._create_connection(req, traces, timeout)
        proto = self._take(req.connection_key)
        if proto is None:
            proto = await super()._create_connection(req, traces, timeout)
        else:
            self.taken += 1
        closed = proto.closed
        if closed is not None:
            loop = asyncio.get_running_loop()
            closed.add_done_callback(
                lambda _: loop.call_later(AFTER_CLOSE_S, self._open_ahead, req, traces, timeout))
        return proto

    def _take(self, key: ConnectionKey) -> ResponseHandler | None:
        """The connection opened ahead, if it is open and to ``key`` (`_expire` closes a stale one);
        else None (one still connecting stays for a later request)."""
        ahead = self._ahead
        if ahead is None or not ahead.done():
            return None
        self._ahead = None
        if ahead.cancelled() or ahead.exception() is not None:
            return None
        proto = ahead.result()
        if key == self._ahead_key and proto.is_connected():
            return proto
        proto.close()
        return None

    def _open_ahead(self, req: ClientRequest, traces: list[Any], timeout: aiohttp.ClientTimeout) -> None:
        if self._ahead is not None or self.closed:
            return
        self._ahead_key = req.connection_key
        ahead = self._ahead = asyncio.ensure_future(super()._create_connection(req, traces, timeout))
        ahead.add_done_callback(_failure_seen)
        asyncio.get_running_loop().call_later(self.fresh_s, self._expire, ahead)

    def _expire(self, ahead: asyncio.Task[ResponseHandler]) -> None:
        """Close ``ahead`` if it is still waiting, unused."""
        if self._ahead is ahead:
            self._ahead = None
            _close(ahead)

    async def close(self, **kwargs: Any) -> None:
        if self._ahead is not None:
            _close(self._ahead)
            self._ahead = None
        await super().close(**kwargs)


def _failure_seen(ahead: asyncio.Task[ResponseHandler]) -> None:
    """Mark a failed connect as seen: the request that would have taken it connects again itself
    and meets the failure there, with its own error."""
    if not ahead.cancelled():
        ahead.exception()


def _close(ahead: asyncio.Task[ResponseHandler]) -> None:
    if not ahead.done():
        ahead.cancel()
    elif not ahead.cancelled() and ahead.exception() is None:
        with contextlib.suppress(Exception):
            ahead.result().close()
