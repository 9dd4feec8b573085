"""The plugin's HTTP client against raw servers on loopback: what it sends, keep-alive, bodies of
every framing, flow control, and each way a response can fail."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from lamina_upstream.upstream_http import HIGH_WATER, ReadTimeout, UpstreamHttp, UpstreamLost

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class RawServer:
    """A loopback server answering each connection with ``handler``; it counts connections and keeps
    every request head it read (through `read_request`)."""

    def __init__(self, handler: Handler) -> None:
        self.handler, self.connections, self.heads = handler, 0, []
        self.closed = asyncio.Event()
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.handler(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass  # the client left, or the test ended while this waited for another request
        finally:
            writer.close()
            self.closed.set()

    async def read_request(self, reader: asyncio.StreamReader) -> bytes:
        head = await reader.readuntil(b"\r\n\r\n")
        self.heads.append(head)
        length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        return await reader.readexactly(length)


def _run(handler: Callable[[RawServer], Handler], test: Callable[[UpstreamHttp, RawServer], Awaitable[None]],
         path: str = "", **options: object) -> RawServer:
    async def run() -> RawServer:
        server = RawServer(lambda r, w: handler(server)(r, w))
        async with server as url:
            http = UpstreamHttp(url + path, **options)  # type: ignore[arg-type]
            try:
                await test(http, server)
            finally:
                await http.close()
        return server
    return asyncio.run(run())


def _echo(server: RawServer) -> Handler:
    """Answers every request on a connection with its body, Content-Length framed, keeping it alive."""
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            body = await server.read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nRetry-After: 3\r\n\r\n" % len(body) + body)
            await writer.drain()
    return handle


def test_requests_carry_the_path_prefix_host_and_headers_and_reuse_a_kept_alive_connection() -> None:
    async def test(http: UpstreamHttp, server: RawServer) -> None:
        for body in (b'{"a": 1}', b'{"b": 2}'):
            async with http.request("POST", "/v1/completions", body) as response:
                assert response.status == 200 and response.headers["retry-after"] == "3"
                assert await response.read() == body
        async with http.request("GET", "/health") as response:
            assert await response.read() == b""

    server = _run(_echo, test, path="/prefix", headers={"Authorization": "Bearer k"})
    assert server.connections == 1
    first, _, get = (head.decode() for head in server.heads)
    assert first.startswith("POST /prefix/v1/completions HTTP/1.1\r\n")
    assert "\r\nAuthorization: Bearer k\r\n" in first and "\r\nContent-Length: 8\r\n" in first
    assert "\r\nContent-Type: application/json\r\n" in first and "\r\nHost: 127.0.0.1:" in first
    assert get.startswith("GET /prefix/health HTTP/1.1\r\n") and "Content-Length" not in get


def test_with_fresh_connections_each_request_has_its_own_and_asks_for_close() -> None:
    async def test(http: UpstreamHttp, server: RawServer) -> None:
        for _ in range(3):
            async with http.request("GET", "/health") as response:
                await response.read()

    server = _run(_echo, test, fresh=True)
    assert server.connections == 3 and all(b"\r\nConnection: close\r\n" in head for head in server.heads)


def test_chunked_and_until_close_bodies_are_read_whole() -> None:
    def handler(server: RawServer) -> Handler:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await server.read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.write(b"6\r\n world\r\n0\r\n\r\n")
            await server.read_request(reader)  # on the same connection, kept alive
            writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nto the end")
        return handle

    async def test(http: UpstreamHttp, server: RawServer) -> None:
        async with http.request("GET", "/a") as response:
            blocks = [block async for block in response.iter_blocks()]
        assert blocks == [b"hello", b" world"]  # each as it arrived
        async with http.request("GET", "/b") as response:
            assert await response.read() == b"to the end"
        await asyncio.wait_for(server.closed.wait(), 5)
        assert not http._idle  # a connection the upstream closes is not kept

    assert _run(handler, test).connections == 1


def test_a_body_past_the_high_water_mark_pauses_reading_and_arrives_whole() -> None:
    size = 64 * HIGH_WATER
    payload = bytes(range(256)) * (size // 256)

    def handler(server: RawServer) -> Handler:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await server.read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size + payload)
            await writer.drain()
        return handle

    async def test(http: UpstreamHttp, server: RawServer) -> None:
        async with http.request("GET", "/big") as response:
            await asyncio.sleep(0.2)  # the server writes all it can before the first read
            held = response._connection._held
            assert HIGH_WATER < held < 8 * HIGH_WATER  # past the mark by one socket read at most, not all of it
            assert await response.read() == payload

    _run(handler, test)


def test_leaving_a_response_early_closes_its_connection() -> None:
    def handler(server: RawServer) -> Handler:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await server.read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\none\r\n")
            await writer.drain()
            await reader.read()  # until the client closes
        return handle

    async def test(http: UpstreamHttp, server: RawServer) -> None:
        async with http.request("POST", "/v1/completions", b"{}") as response:
            async for block in response.iter_blocks():
                assert block == b"one"
                break
        await asyncio.wait_for(server.closed.wait(), 5)

    _run(handler, test)


@pytest.mark.parametrize("answer, error, match", [
    (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf", UpstreamLost, "closed the connection"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", UpstreamLost, "malformed response"),
    (b"NOT HTTP\r\n\r\n", UpstreamLost, "malformed response"),
    (b"", UpstreamLost, "closed the connection"),
])
def test_a_response_cut_short_or_malformed_is_a_lost_upstream(answer: bytes, error: type[Exception],
                                                             match: str) -> None:
    def handler(server: RawServer) -> Handler:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await server.read_request(reader)
            writer.write(answer)
            await writer.drain()
        return handle

    async def test(http: UpstreamHttp, server: RawServer) -> None:
        with pytest.raises(error, match=match):
            async with http.request("GET", "/x") as response:
                await response.read()

    _run(handler, test)


def test_silence_past_the_read_timeout_is_a_read_timeout() -> None:
    def handler(server: RawServer) -> Handler:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await server.read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            await writer.drain()
            await asyncio.sleep(1)
        return handle

    async def test(http: UpstreamHttp, server: RawServer) -> None:
        async with http.request("GET", "/x") as response:  # the head arrives in time
            with pytest.raises(ReadTimeout, match="nothing for 0.1 s"):
                await response.read()

    _run(handler, test, read_timeout_s=0.1)


def test_requests_past_the_limit_wait_for_a_place_no_longer_than_the_connect_timeout() -> None:
    release = asyncio.Event()

    def handler(server: RawServer) -> Handler:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while True:
                await server.read_request(reader)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n")
                await writer.drain()
                await release.wait()
                writer.write(b"ok")
        return handle

    async def test(http: UpstreamHttp, server: RawServer) -> None:
        async with http.request("GET", "/a") as response:
            with pytest.raises(UpstreamLost, match="no place among the 1 connections within 0.2 s"):
                async with http.request("GET", "/b"):
                    pass
            later = http.request("GET", "/c")
            waiting = asyncio.ensure_future(later.__aenter__())
            await asyncio.sleep(0.05)
            assert not waiting.done()
            release.set()
            assert await response.read() == b"ok"
        assert (await waiting).status == 200  # the place freed, on the same connection
        await later.__aexit__(None, None, None)

    assert _run(handler, test, limit=1, connect_timeout_s=0.2).connections == 1


def test_a_refused_connection_is_an_os_error() -> None:
    async def run() -> None:
        http = UpstreamHttp("http://127.0.0.1:9")
        with pytest.raises(OSError):
            async with http.request("GET", "/health"):
                pass
        await http.close()
    asyncio.run(run())
