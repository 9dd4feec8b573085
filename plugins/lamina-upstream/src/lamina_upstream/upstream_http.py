"""The HTTP/1.1 client to one upstream server: asyncio's transports and httptools' response parser.

What ``openai-upstream`` needs of HTTP is narrow: one origin, GET and POST with a body in memory,
JSON and server-sent-event answers read as they arrive, timeouts to connect and between reads.
aiohttp does that too, but its per-request machinery (request, response and connection objects,
timers, a task of its own to write each request's body) takes more of a relayed request's time to
first token than everything else the front does to it (benchmarks/README.md, "the upstream hop on a
lean HTTP client"). httptools (llhttp, the C parser uvicorn serves Lamina's own HTTP with) parses the
responses, chunked bodies included.

Connections are kept alive and reused, each idle no longer than `KEEPALIVE_S`. An engine that closes
a connection once it has streamed a response over it, while still announcing keep-alive
(llama-server), gets ``fresh=True``: every request then has a connection of its own and asks for
``Connection: close``, and one is opened ahead for the next POST, since connecting would otherwise
lie on each request's way to its first token.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from urllib.parse import urlsplit

import httptools

KEEPALIVE_S = 4.0
"""How long an idle connection is kept for reuse: under the 5 s after which uvicorn (Lamina's and
vLLM's server) closes one, so that none is reused just as the upstream closes it."""
FRESH_S = 4.0
"""How long a connection opened ahead waits for a POST before it is closed unused: llama-server's
HTTP library closes idle ones after 5 s, and one it closed just as a request went out would fail that
request with nothing sent."""
AFTER_CLOSE_S = 0.005
"""How long after a POST's connection closes the next is opened ahead, when none is waiting then. A
stream's connection closes as its last event arrives, before that event has reached the client;
opened at once, the next connection would be opened on the way to the client's first token when the
stream is one token long."""
HIGH_WATER = 1 << 16
"""Bytes of a response held unread past which the connection stops reading until they are taken."""


class UpstreamLost(ConnectionError):
    """The connection failed, or closed or carried a malformed response before its response ended."""


class ReadTimeout(TimeoutError):
    """The upstream sent nothing for the client's ``read_timeout_s``."""


class _Connection(asyncio.Protocol):
    """One connection and the response to the request now on it."""

    def __init__(self, lost: Callable[[_Connection], None]) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reopen = False  # a POST's connection with fresh connections: its close opens the next ahead
        self._lost = lost
        self._parser = httptools.HttpResponseParser(self)
        self.reset()

    def reset(self) -> None:
        """Ready for the next request's response."""
        self.status, self.headers, self.head_done, self.complete = 0, {}, False, False
        self._until_close = self._keep_alive = False
        self._blocks: deque[bytes] = deque()
        self._held = 0
        self._error: Exception | None = None
        self._waiter: asyncio.Future[None] | None = None

    def send(self, data: bytes) -> None:
        assert self.transport is not None
        if self.closed:
            raise UpstreamLost("the upstream closed the connection before the request was sent")
        self.transport.write(data)

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.close()

    @property
    def keep_alive(self) -> bool:
        """Whether the response is read to its end and the connection may carry another request."""
        return self.complete and not self.closed and self._keep_alive

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a TCP transport (uvloop's is not a subclass)

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(UpstreamLost(f"the upstream sent a malformed response: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.head_done and self._until_close and self._error is None:
            self.complete = True  # a body without a length ends with its connection
        elif not self.complete:
            self._fail(UpstreamLost("the upstream closed the connection" + (f": {exc}" if exc else "")))
        self._wake()
        self._lost(self)

    # httptools' parser callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        self._until_close = "content-length" not in self.headers and \
            "chunked" not in self.headers.get("transfer-encoding", "")
        self._keep_alive = self._parser.should_keep_alive()  # read here: the parser resets once the message ends
        self.head_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self._blocks.append(body)
        self._held += len(body)
        if self._held > HIGH_WATER and self.transport is not None:
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        self._wake()

    # the reader's side
    async def head(self, timeout: float) -> None:
        """Wait for the response's status line and headers."""
        while not self.head_done:
            if self._error is not None:
                raise self._error
            await self._wait(timeout)

    async def blocks(self, timeout: float) -> AsyncIterator[bytes]:
        """The response's body as it arrives (what has arrived since the last, joined)."""
        while True:
            if self._blocks:
                block = self._blocks.popleft() if len(self._blocks) == 1 else b"".join(self._blocks)
                self._blocks.clear()
                if self._held > HIGH_WATER and self.transport is not None and not self.closed:
                    self.transport.resume_reading()
                self._held = 0
                yield block
            elif self.complete:
                return
            elif self._error is not None:
                raise self._error
            else:
                await self._wait(timeout)

    async def _wait(self, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        self._waiter = waiter = loop.create_future()
        timer = loop.call_later(timeout, _time_out, waiter, timeout)
        try:
            await waiter
        finally:
            self._waiter = None
            timer.cancel()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _fail(self, error: Exception) -> None:
        if self._error is None:
            self._error = error
        self._wake()


def _time_out(waiter: asyncio.Future[None], timeout: float) -> None:
    if not waiter.done():
        waiter.set_exception(ReadTimeout(f"the upstream sent nothing for {timeout:g} s"))


class Response:
    """An upstream's response: status and headers (names in lower case) now, the body as it arrives."""

    def __init__(self, connection: _Connection, read_timeout_s: float) -> None:
        self.status, self.headers = connection.status, connection.headers
        self._connection, self._timeout = connection, read_timeout_s

    def iter_blocks(self) -> AsyncIterator[bytes]:
        return self._connection.blocks(self._timeout)

    async def read(self) -> bytes:
        return b"".join([block async for block in self.iter_blocks()])


class UpstreamHttp:
    """Requests to the server at ``url`` (``http://`` or ``https://``, with any path prefix), at most
    ``limit`` at once; waiting for a place counts against ``connect_timeout_s``."""

    def __init__(self, url: str, *, headers: Mapping[str, str] | None = None, limit: int = 100,
                 connect_timeout_s: float = 5.0, read_timeout_s: float = 600.0, fresh: bool = False,
                 fresh_s: float = FRESH_S) -> None:
        parts = urlsplit(url)
        self._host = parts.hostname or ""
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._prefix = parts.path.rstrip("/").encode()
        self._ssl = ssl.create_default_context() if parts.scheme == "https" else None
        fixed = {"Host": parts.netloc.rpartition("@")[2], "User-Agent": "lamina-upstream", **(headers or {})}
        if fresh:
            fixed["Connection"] = "close"
        self._fixed = "".join(f"{name}: {value}\r\n" for name, value in fixed.items()).encode("latin-1")
        self.connect_timeout_s, self.read_timeout_s = connect_timeout_s, read_timeout_s
        self.fresh, self.fresh_s = fresh, fresh_s
        self.closed = False
        self.taken = 0  # POSTs that found a connection opened ahead
        self._idle: list[tuple[_Connection, float]] = []  # kept alive, with the time each fell idle
        self._open: set[_Connection] = set()
        self._ahead: asyncio.Task[_Connection] | None = None
        self._limit = limit
        self._places = asyncio.Semaphore(limit)  # requests at once; waiting for a place counts as connecting

    @contextlib.asynccontextmanager
    async def request(self, method: str, path: str, body: bytes | None = None,
                      content_type: str = "application/json") -> AsyncIterator[Response]:
        """Send a request and yield its response once its head has arrived. Leaving before the body
        is read to its end closes the connection (the upstream takes that as the client gone)."""
        await self._take_place()
        try:
            connection = await self._connection(method)
        except BaseException:
            self._places.release()
            raise
        head = b"%s %s%s HTTP/1.1\r\n%s" % (method.encode(), self._prefix, path.encode(), self._fixed)
        if body is not None:
            head += b"Content-Type: %s\r\nContent-Length: %d\r\n" % (content_type.encode(), len(body))
        reused = True
        try:
            connection.send(head + b"\r\n" + (body or b""))
            if self.fresh and method == "POST":
                connection.reopen = True
                # the next one is opened on the loop's next turn, once this request is on its way
                asyncio.get_running_loop().call_soon(self._open_ahead)
            await connection.head(self.read_timeout_s)
            yield Response(connection, self.read_timeout_s)
        except BaseException:
            reused = False
            raise
        finally:
            self._release(connection, reused)
            self._places.release()

    async def _take_place(self) -> None:
        """Wait for one of the ``limit`` places, no longer than ``connect_timeout_s``."""
        if not self._places.locked():
            await self._places.acquire()  # returns at once
            return
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                await self._places.acquire()
        except TimeoutError:
            raise UpstreamLost(f"no place among the {self._limit} connections within "
                               f"{self.connect_timeout_s:g} s") from None

    async def close(self) -> None:
        """Close every connection; streams still open end as lost."""
        self.closed = True
        if self._ahead is not None:
            _close(self._ahead)
            self._ahead = None
        self._idle.clear()
        for connection in list(self._open):
            connection.close()

    async def _connection(self, method: str) -> _Connection:
        if self.closed:
            raise UpstreamLost("the client is closed")
        if self.fresh:
            if method == "POST" and (ahead := self._take_ahead()) is not None:
                self.taken += 1
                return ahead
            return await self._connect()
        now = asyncio.get_running_loop().time()
        while self._idle:
            connection, since = self._idle.pop()
            if not connection.closed and now - since < KEEPALIVE_S:
                connection.reset()
                return connection
            connection.close()
        return await self._connect()

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, connection = await loop.create_connection(
                    lambda: _Connection(self._lost), self._host, self._port, ssl=self._ssl,
                    server_hostname=self._host if self._ssl else None)
        except TimeoutError:
            raise UpstreamLost(f"no connection within {self.connect_timeout_s:g} s") from None
        if self.closed:
            connection.close()
            raise UpstreamLost("the client is closed")
        self._open.add(connection)
        return connection

    def _release(self, connection: _Connection, reused: bool) -> None:
        if reused and not self.fresh and not self.closed and connection.keep_alive:
            self._idle.append((connection, asyncio.get_running_loop().time()))
        else:
            connection.close()

    def _lost(self, connection: _Connection) -> None:
        self._open.discard(connection)
        if connection.reopen and not self.closed:
            asyncio.get_running_loop().call_later(AFTER_CLOSE_S, self._open_ahead)

    def _take_ahead(self) -> _Connection | None:
        """The connection opened ahead if it is open (one still connecting stays for a later POST)."""
        ahead = self._ahead
        if ahead is None or not ahead.done():
            return None
        self._ahead = None
        if ahead.cancelled() or ahead.exception() is not None or ahead.result().closed:
            return None
        return ahead.result()

    def _open_ahead(self) -> None:
        if self._ahead is not None or self.closed:
            return
        ahead = self._ahead = asyncio.ensure_future(self._connect())
        ahead.add_done_callback(_failure_seen)
        asyncio.get_running_loop().call_later(self.fresh_s, self._expire, ahead)

    def _expire(self, ahead: asyncio.Task[_Connection]) -> None:
        """Close ``ahead`` if it is still waiting, unused."""
        if self._ahead is ahead:
            self._ahead = None
            _close(ahead)


def _failure_seen(ahead: asyncio.Task[_Connection]) -> None:
    """Mark a failed connect as seen: the POST that would have taken it connects again itself and
    meets the failure there, with its own error."""
    if not ahead.cancelled():
        ahead.exception()


def _close(ahead: asyncio.Task[_Connection]) -> None:
    if not ahead.done():
        ahead.cancel()
    elif not ahead.cancelled() and ahead.exception() is None:
        ahead.result().close()
