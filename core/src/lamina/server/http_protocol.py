"""uvicorn's HTTP/1.1 protocol on httptools, writing each response's head in one send with its first body chunk.

The parser is httptools (llhttp, Node's C parser) rather than h11, which parses requests and writes
responses in Python. And uvicorn writes a response's head the moment the app sends
``http.response.start``: alone on the wire, the head wakes the client, which then takes a core while the
server is still writing the first chunk (for a stream, the first token). Here the head waits for the
first ``http.response.body`` message and both go out in one write (benchmarks/README.md, "the upstream hop,
shortened"). Each request's scope also carries the ASGI extension :data:`WRITABLE`.
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.types import ASGIApp, Message
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle


WRITABLE = "lamina.writable"
"""ASGI extension: a callable telling whether the connection takes a write now, so that a ``send`` of
a body would return without waiting for the client to read (uvicorn's flow control is not paused)."""


class HeadWithFirstChunk(HttpToolsProtocol):
    """uvicorn's httptools protocol; every response's head goes out with its first body chunk."""

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: ASGIApp) -> None:
        # uvicorn (0.45 on) starts every request's ASGI task here; the app is given the cycle's send
        cycle.send = _HeldHead(cycle)  # type: ignore[method-assign]
        flow = cycle.flow
        cycle.scope.setdefault("extensions", {})[WRITABLE] = lambda: not flow.write_paused
        super()._start_asgi_task(cycle, app)


class _HeldHead:
    """A request cycle's ``send`` that holds ``http.response.start`` until the first body message."""

    def __init__(self, cycle: RequestResponseCycle) -> None:
        self.cycle, self.send = cycle, cycle.send
        self.start: Message | None = None

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.start = message
            return
        start, self.start = self.start, None
        if start is None:
            await self.send(message)
            return
        transport = self.cycle.transport
        self.cycle.transport = gathered = _Gathered(transport)  # type: ignore[assignment]
        try:
            await self.send(start)
            await self.send(message)
        finally:
            self.cycle.transport = transport
            gathered.flush()


class _Gathered:
    """Stands in for a transport while a head and a first chunk are written: they go out as one write."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.parts: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.parts.append(data)

    def flush(self) -> None:
        if self.parts:
            self.transport.write(b"".join(self.parts))
            self.parts = []

    def close(self) -> None:
        self.flush()
        self.transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)
