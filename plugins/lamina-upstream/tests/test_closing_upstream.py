"""``openai-upstream`` against an upstream that closes a connection once it has streamed a response
over it, as llama-server does while announcing keep-alive: back-to-back requests and the load
poller must not reuse such a connection, and a POST finds its connection opened ahead."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable

from lamina_hookspecs.types import ChatMessage, Request, SamplingParams, TokenChunk
from lamina_upstream.executor import UpstreamExecutor
from lamina_upstream.options import UpstreamOptions
from lamina_upstream.upstream_http import UpstreamHttp

LINGER_S = 0.2
"""How long the fake keeps a streamed-over connection open before it closes it, unanswered."""

_JSON: dict[str, object] = {
    "/v1/models": {"object": "list", "data": [{"id": "fake", "object": "model", "owned_by": "llamacpp"}]},
    "/props": {"default_generation_settings": {"n_ctx": 2048}},
    "/health": {"status": "ok"},
    "/slots": [{"id": 0, "is_processing": False}],
}


def _event(payload: object) -> bytes:
    data = f"data: {json.dumps(payload) if not isinstance(payload, str) else payload}\n\n".encode()
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _stream_body() -> bytes:
    entry = {"id": 9906, "token": "Hi", "prob": 1.0, "bytes": [72, 105], "top_probs": []}
    events = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": None}}]},
              {"choices": [{"index": 0, "delta": {"content": "Hi"}, "logprobs": {"content": [entry]}}]},
              {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]},
              {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}, "[DONE]"]
    return b"".join(_event(e) for e in events) + b"0\r\n\r\n"


class ClosingUpstream:
    """llama-server's manners on loopback: JSON answers keep the connection alive; after a streamed
    chat completion the connection stays open for ``LINGER_S``, then closes without answering
    whatever was sent on it meanwhile. It notes when each request's connection was accepted."""

    def __init__(self) -> None:
        self.streams = 0
        self.unanswered = 0
        self.accepted: dict[str, list[float]] = {"GET": [], "POST": []}  # per request, by method
        self.closed_unused = 0  # connections closed by the client before any request
        self.open = 0  # connections not yet closed
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        self._server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted, served = time.perf_counter(), False
        self.open += 1
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                method, path, _ = head.split(b"\r\n", 1)[0].decode().split(" ", 2)
                self.accepted[method].append(accepted)
                served = True
                length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                await reader.readexactly(length)
                if method == "POST":
                    self.streams += 1
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
                                 b"Keep-Alive: timeout=5, max=100\r\n\r\n" + _stream_body())
                    await writer.drain()
                    if await _arrives(reader, LINGER_S):
                        self.unanswered += 1
                    return
                status = b"200 OK" if path in _JSON else b"404 Not Found"  # /metrics: llama-server without --metrics
                body = json.dumps(_JSON.get(path, {"error": "not found"})).encode()
                writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Type: application/json\r\nContent-Length: "
                             + str(len(body)).encode() + b"\r\n\r\n" + body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            self.closed_unused += not served
        finally:
            self.open -= 1
            writer.close()


async def _arrives(reader: asyncio.StreamReader, within_s: float) -> bool:
    """Whether anything is sent on ``reader`` within ``within_s`` seconds."""
    try:
        return bool(await asyncio.wait_for(reader.read(1), within_s))
    except TimeoutError:
        return False


async def _until(condition: Callable[[], bool], within_s: float = 5.0) -> bool:
    """Whether ``condition`` holds within ``within_s`` seconds."""
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


async def _text(stream: AsyncIterator[TokenChunk]) -> str:
    return "".join([chunk.text async for chunk in stream])


def test_requests_and_polls_after_a_stream_never_reuse_the_connection_llama_server_closes() -> None:
    async def run() -> None:
        fake = ClosingUpstream()
        async with fake as url:
            executor = UpstreamExecutor(UpstreamOptions(url=url, poll_interval_s=0.05, start_timeout_s=10))
            await executor.start()
            try:
                assert executor.engine == "llama-server"
                sent = []
                for i in range(6):
                    request = Request(id=f"r{i}", model="fake", sampling=SamplingParams(max_tokens=1),
                                      messages=(ChatMessage(role="user", content="hello"),))
                    sent.append(time.perf_counter())
                    assert await _text(executor.generate(request)) == "Hi"
                    await asyncio.sleep(0.06)  # a poll between requests
                    assert executor.state().healthy
            finally:
                await executor.stop()
            assert await _until(lambda: fake.open == 0)  # stop() closed the one opened ahead too
        assert fake.streams == 6 and fake.unanswered == 0
        opened = fake.accepted["POST"]
        assert opened[0] > sent[0]  # the first connects when it is sent
        assert all(at < when for at, when in zip(opened[1:], sent[1:]))  # the rest find one opened ahead

    asyncio.run(run())


def test_a_connection_opened_ahead_is_for_posts_and_closed_unused_once_stale() -> None:
    async def run() -> None:
        fake = ClosingUpstream()
        async with fake as url:
            http = UpstreamHttp(url, fresh=True, fresh_s=0.2)

            async def post() -> float:
                sent = time.perf_counter()
                async with http.request("POST", "/v1/chat/completions", b"{}") as response:
                    await response.read()
                return sent
            try:
                await post()
                await asyncio.sleep(0.05)
                got = time.perf_counter()
                async with http.request("GET", "/health") as response:
                    assert response.status == 200 and await response.read() == b'{"status": "ok"}'
                assert fake.accepted["GET"][-1] > got  # a GET connects for itself
                sent = await post()
                assert fake.accepted["POST"][-1] < sent and http.taken == 1  # it took the one opened ahead
                assert await _until(lambda: fake.closed_unused == 1)  # the one opened after it goes stale
                sent = await post()
                assert fake.accepted["POST"][-1] > sent and http.taken == 1
            finally:
                await http.close()
            assert await _until(lambda: fake.open == 0)

    asyncio.run(run())
