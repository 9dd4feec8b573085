"""Lamina's uvicorn protocol writes a response's head in one send with its first body chunk."""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn
from starlette.types import Receive, Scope, Send
from uvicorn.server import ServerState

from lamina.server.http_protocol import HeadWithFirstChunk


class _Transport(asyncio.Transport):
    """Keeps what is written to it."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.writes.append(bytes(data))

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 50000), "sockname": ("127.0.0.1", 8000)}.get(name, default)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def _stream(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
    await send({"type": "http.response.body", "body": b"data: one\n\n", "more_body": True})
    await asyncio.sleep(0)
    await send({"type": "http.response.body", "body": b"data: two\n\n", "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _whole(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 400, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"{}"})


async def _served(app: Any, request: bytes) -> _Transport:
    config = uvicorn.Config(app, http=HeadWithFirstChunk, log_config=None, access_log=False)
    config.load()
    protocol = HeadWithFirstChunk(config=config, server_state=ServerState(), app_state={})
    transport = _Transport()
    protocol.connection_made(transport)
    protocol.data_received(request)
    await asyncio.gather(*protocol.tasks)
    return transport


def test_a_streams_head_goes_out_with_its_first_chunk_and_later_chunks_alone() -> None:
    request = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"
    transport = asyncio.run(_served(_stream, request))
    head, *rest = transport.writes
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and head.endswith(b"\r\n\r\nb\r\ndata: one\n\n\r\n")
    assert rest == [b"b\r\ndata: two\n\n\r\n", b"0\r\n\r\n"] and not transport.closed


def test_a_whole_response_is_one_write_and_a_closing_connection_closes_after_it() -> None:
    transport = asyncio.run(_served(_whole, b"GET /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"))
    [response] = transport.writes
    assert response.startswith(b"HTTP/1.1 400 Bad Request\r\n") and response.endswith(b"\r\n\r\n{}")
    assert transport.closed
