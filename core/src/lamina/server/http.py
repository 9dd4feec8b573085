"""The OpenAI-compatible HTTP API, on Starlette (served by uvicorn).

Starlette and uvicorn are the well-kept ASGI pair that vLLM's and SGLang's OpenAI servers
also build on; writing HTTP parsing, keep-alive and chunked streaming by hand would buy
nothing. Each completion request becomes a :class:`~lamina_hookspecs.types.RequestContext`
and runs through :func:`lamina.kernel.pipeline.run_request`; its chunks are encoded by the codec
the client negotiated with ``Accept`` (``text/event-stream`` — OpenAI SSE — by default).

A streamed response starts only once the first chunk exists, so every rejection (admission,
validation, context length, queue full) still gets its own HTTP status and an OpenAI error
body. A client that disconnects aborts its request and frees its KV blocks, whether it waits
for a stream, for its first chunk, or for a whole non-streamed answer (the handler watches the
ASGI receive channel for the disconnect while it waits); aborts are counted by reason in
``/metrics``. A stream is read ahead of its client; one that falls ``server.stream_buffer_bytes``
behind is aborted (``slow_client``). While the server drains (SIGTERM) new requests get 503; those
still in flight when the drain runs out of time are aborted and answered 503 ``shutdown``
(`Server.abort_in_flight`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, TypeVar

import orjson
import structlog
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from lamina_hookspecs.errors import (
    InvalidRequestError,
    LaminaError,
    NotAcceptableError,
    NotFoundError,
    PayloadTooLargeError,
    ServiceUnavailableError,
    TokenizerNotAvailableError,
    UnsupportedMediaTypeError,
)
from lamina_hookspecs.protocols import Codec, StreamEncoder, Tokenizes
from lamina_hookspecs.types import Request, RequestContext, StreamError, StreamMeta, TokenChunk
from lamina.kernel.admission import bearer_token
from lamina.kernel.lifecycle import trace_context
from lamina.kernel.pipeline import run_request
from lamina.server.http_protocol import WRITABLE
from lamina.server.metrics import Metrics
from lamina import __version__
from lamina.server.openai_api import (completion_body, parse_chat, parse_completion, parse_detokenize,
                                      parse_tokenize, unknown_fields)
from lamina.wire.queue_wait import MAX_QUEUE_WAIT_HEADER, bounded, max_queue_wait
from lamina.kernel.stack import Stack

log = structlog.get_logger(__name__)

DEFAULT_ACCEPT = {"*/*", "application/*", "text/*", "application/json", "text/event-stream", ""}
CLIENT_CLOSED = 499
"""nginx's status for a request whose client closed the connection first (nobody receives it)."""
IGNORED_FIELDS_HEADER = "x-lamina-ignored-fields"
"""Names the request's top-level fields the server ignored (comma-separated), when it ignored some."""

_T = TypeVar("_T")
SHUT_DOWN = ServiceUnavailableError("the server shut down before the request finished", code="shutdown",
                                    retry_after=5)
"""The answer to a request still in flight when draining ran out of time."""
SLOW_CLIENT = ServiceUnavailableError(
    "the stream was aborted: the client read it too slowly (server.stream_buffer_bytes)", code="slow_client",
    retry_after=1)
"""The end of a stream whose client fell too far behind."""


class _StreamBuffer:
    """A stream's encoded output held for its client: ``(bytes, has output)`` items, then ``None``.
    Past ``limit`` bytes held it is ``overflowed`` and takes no more. ``writing`` is set while the
    writer sends an item it took."""

    def __init__(self, limit: int) -> None:
        self.limit, self.held, self.overflowed, self.writing = limit, 0, False, False
        self._items: asyncio.Queue[tuple[bytes, bool] | None] = asyncio.Queue()

    @property
    def empty(self) -> bool:
        """Nothing held and nothing being written."""
        return not self.writing and self._items.empty()

    def put(self, data: bytes, has_output: bool = False) -> None:
        self.held += len(data)
        self.overflowed = self.held > self.limit
        self._items.put_nowait((data, has_output))

    def end(self) -> None:
        self._items.put_nowait(None)

    async def get(self) -> tuple[bytes, bool] | None:
        item = await self._items.get()
        if item is not None:
            self.held -= len(item[0])
        return item


class ClientGone(Exception):
    """The client disconnected while its request was being answered."""


async def _disconnected(receive: Receive) -> None:
    """Return once the client has disconnected (its body is read, so nothing else arrives)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def while_connected(receive: Receive, work: Awaitable[_T]) -> _T:
    """Await ``work``; if the client disconnects first, it is cancelled and `ClientGone` raised.

    ``work`` runs in this task, not a new one, so what it binds in contextvars (the request's log
    fields) stays bound for the rest of the request; a watcher task cancels this one on a disconnect.
    """
    handler = asyncio.current_task()
    assert handler is not None
    gone = False

    async def watch() -> None:
        nonlocal gone
        await _disconnected(receive)
        gone = True
        handler.cancel()

    watcher = asyncio.ensure_future(watch())
    try:
        return await work
    except asyncio.CancelledError:
        if not gone:
            raise  # this handler itself was cancelled
        handler.uncancel()
        raise ClientGone from None
    finally:
        watcher.cancel()


def error_response(error: LaminaError, request_id: str | None = None) -> JSONResponse:
    headers = {"x-request-id": request_id} if request_id else {}
    if error.retry_after is not None:
        headers["retry-after"] = str(max(1, round(error.retry_after)))
    return JSONResponse(error.to_openai(), status_code=error.http_status, headers=headers)


def _error_event(encoder: StreamEncoder, error: LaminaError) -> bytes:
    return encoder.error(StreamError(message=error.message, type=error.openai_type, code=error.code))


async def _rest(chunks: AsyncIterator[TokenChunk]) -> list[TokenChunk]:
    return [chunk async for chunk in chunks]


class Server:
    """Routes and per-server state (draining flag, in-flight count) for one stack."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.max_body_bytes = stack.config.server.max_body_bytes
        self.stream_buffer_bytes = stack.config.server.stream_buffer_bytes
        self.strict_fields = stack.config.server.strict_fields
        self.metrics = Metrics(stack)
        stack.pm.register(self.metrics, name="lamina.metrics")
        self.draining = False
        self.stopping = False
        self.in_flight = 0
        self._waiting: dict[asyncio.Task[Any], str] = {}  # tasks awaiting a request's output → its id
        default = next(iter(stack.codecs.instances.values()))
        self._default_codec: Codec = default

    def abort_in_flight(self) -> list[str]:
        """End every request still in flight once draining has run out of time: each is aborted (its
        engine work freed) and answered 503 ``shutdown`` (a stream: an error event, then its end).
        Returns their ids."""
        self.stopping = True
        for task in self._waiting:
            task.cancel()
        return list(self._waiting.values())

    async def _output(self, ctx: RequestContext, work: Awaitable[_T]) -> _T:
        """Await ``work`` (a request's next output), in reach of `abort_in_flight`."""
        task = asyncio.current_task()
        assert task is not None
        self._waiting[task] = ctx.request_id
        try:
            return await work
        finally:
            del self._waiting[task]

    def _stopped(self) -> bool:
        """After a cancellation: whether `abort_in_flight` sent it (then the task goes on to answer)."""
        task = asyncio.current_task()
        if not self.stopping or task is None:
            return False
        task.uncancel()
        self.metrics.aborted("shutdown")
        return True

    def app(self) -> Starlette:
        routes = [
            Route("/health", self.health),
            Route("/ready", self.ready),
            Route("/metrics", self.metrics_endpoint),
            Route("/version", self.version),
            Route("/v1/models", self.models),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/chat/completions", self.chat, methods=["POST"]),
            Route("/tokenize", self.tokenize, methods=["POST"]),
            Route("/detokenize", self.detokenize, methods=["POST"]),
        ]
        return Starlette(routes=routes, exception_handlers={HTTPException: self._http_error})

    async def _http_error(self, request: HttpRequest, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        error = NotFoundError(f"no route {request.method} {request.url.path}") if exc.status_code == 404 else \
            InvalidRequestError(f"{request.method} is not allowed on {request.url.path}")
        error.http_status = exc.status_code  # type: ignore[misc]
        return error_response(error)

    async def health(self, request: HttpRequest) -> Response:
        return JSONResponse({"status": "ok"})

    async def ready(self, request: HttpRequest) -> Response:
        states = {name: executor.state() for name, executor in self.stack.backends.items()}
        ready = self.stack.started and not self.draining and all(state.healthy for state in states.values())
        return JSONResponse({"ready": ready, "draining": self.draining,
                             "backends": {name: state.healthy for name, state in states.items()}},
                            status_code=200 if ready else 503)

    async def metrics_endpoint(self, request: HttpRequest) -> Response:
        return Response(self.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def version(self, request: HttpRequest) -> Response:
        return JSONResponse({"version": __version__})

    async def models(self, request: HttpRequest) -> Response:
        ctx = self._context(request, "models", "models")
        try:
            self.stack.admission.authenticate(ctx)
        except LaminaError as error:
            return error_response(error, ctx.request_id)
        created = int(time.time())
        models = {executor.model.id: executor.model for executor in self.stack.backends.values()}
        return JSONResponse({"object": "list", "data": [
            {"id": m.id, "object": "model", "created": created, "owned_by": m.owned_by, "max_model_len": m.context_length}
            for m in models.values()]})

    async def completions(self, request: HttpRequest) -> Response:
        return await self._generate(request, "completion", "cmpl", parse_completion)

    async def chat(self, request: HttpRequest) -> Response:
        return await self._generate(request, "chat", "chatcmpl", parse_chat)

    @staticmethod
    def _context(http: HttpRequest, endpoint: str, prefix: str) -> RequestContext:
        return RequestContext(request_id=f"{prefix}-{uuid.uuid4().hex}", endpoint=endpoint,
                              credential=bearer_token(http.headers.get("authorization")),
                              client=http.client.host if http.client else None,
                              trace_context=trace_context(http.headers))

    def _negotiate(self, accept: str) -> Codec:
        wanted = [part.split(";")[0].strip().lower() for part in accept.split(",")]
        for media_type in wanted:
            codec = self.stack.codec_for(media_type)
            if codec is not None:
                return codec
        if any(media_type in DEFAULT_ACCEPT for media_type in wanted):
            return self._default_codec
        raise NotAcceptableError(f"no codec produces any of: {accept}; available: "
                                 + ", ".join(sorted(c.media_type for c in self.stack.codecs.instances.values())))

    async def tokenize(self, request: HttpRequest) -> Response:
        """vLLM's ``POST /tokenize``: the prompt ids a completion or chat body would be served with."""
        ctx = self._context(request, "tokenize", "tok")
        try:
            self.stack.admission.authenticate(ctx)
            body, ignored = await self._body(request, "tokenize")
            parsed, special, generation = parse_tokenize(body, ctx.request_id, ctx.tenant)
            executor = self._tokenizer(parsed.model)
            ids = await executor.tokenize(parsed, add_special_tokens=special, add_generation_prompt=generation)
        except LaminaError as error:
            return error_response(error, ctx.request_id)
        return JSONResponse({"count": len(ids), "max_model_len": executor.model.context_length, "tokens": ids,
                             "token_strs": None}, headers=self._headers(ctx, ignored))

    async def detokenize(self, request: HttpRequest) -> Response:
        """vLLM's ``POST /detokenize``: the text of token ids."""
        ctx = self._context(request, "detokenize", "detok")
        try:
            self.stack.admission.authenticate(ctx)
            body, ignored = await self._body(request, "detokenize")
            ids = parse_detokenize(body)
            text = await self._tokenizer(body["model"]).detokenize(ids)
        except LaminaError as error:
            return error_response(error, ctx.request_id)
        return JSONResponse({"prompt": text}, headers=self._headers(ctx, ignored))

    def _tokenizer(self, model: str) -> Any:
        """A backend serving ``model`` that shows its tokenization (`Tokenizes`)."""
        for executor in self.stack.serving(model):
            if isinstance(executor, Tokenizes):
                return executor
        raise TokenizerNotAvailableError(f"no backend serving {model!r} here can tokenize (its executor does "
                                         "not implement Tokenizes)")

    @staticmethod
    def _headers(ctx: RequestContext, ignored: list[str]) -> dict[str, str]:
        headers = {"x-request-id": ctx.request_id}
        if ignored:
            headers[IGNORED_FIELDS_HEADER] = ",".join(ignored)
        return headers

    async def _body(self, http: HttpRequest, endpoint: str) -> tuple[dict[str, Any], list[str]]:
        """The JSON body, less the fields ``endpoint`` does not know unless the stack is strict; and those."""
        body = await self._read_json(http)
        ignored = [] if self.strict_fields else unknown_fields(endpoint, body)
        if ignored:
            log.warning("request_fields_ignored", fields=ignored)
            body = {key: value for key, value in body.items() if key not in ignored}
        return body, ignored

    async def _read_json(self, request: HttpRequest) -> dict[str, Any]:
        content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if content_type and content_type != "application/json":
            raise UnsupportedMediaTypeError(f"the body must be application/json, not {content_type}")
        body = bytearray()
        async for part in request.stream():
            body += part
            if len(body) > self.max_body_bytes:
                raise PayloadTooLargeError(f"the body is over the limit of {self.max_body_bytes} bytes")
        try:
            parsed = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise InvalidRequestError(f"the body is not valid JSON: {exc}") from None
        if not isinstance(parsed, dict):
            raise InvalidRequestError("the body must be a JSON object")
        return parsed

    async def _generate(self, http: HttpRequest, kind: str, prefix: str,
                        parse: Callable[[Mapping[str, Any], str, str], Request]) -> Response:
        ctx = self._context(http, kind, prefix)
        structlog.contextvars.clear_contextvars()
        structlog.contextvars.bind_contextvars(request_id=ctx.request_id)
        try:
            if self.draining:
                raise ServiceUnavailableError("the server is shutting down", code="draining", retry_after=5)
            body, ignored = await self._body(http, kind)
            codec = self._negotiate(http.headers.get("accept", ""))
            wait = max_queue_wait(http.headers.get(MAX_QUEUE_WAIT_HEADER))
        except LaminaError as error:
            self.metrics.rejected(kind, error.http_status, ctx.tenant)
            return error_response(error, ctx.request_id)
        def parsed(admitted: Mapping[str, Any]) -> Request:
            request = bounded(parse(admitted, ctx.request_id, ctx.tenant), wait)
            if request.stream and request.n > 1:  # a codec that writes one choice refuses before any work starts
                codec.encoder().header(StreamMeta(request_id=ctx.request_id, model=request.model, created=0,
                                                  choices=request.n))
            return request

        chunks = run_request(self.stack, ctx, body, parsed)
        self.in_flight += 1
        try:
            first = await while_connected(http.receive, self._output(ctx, anext(chunks)))
        except LaminaError as error:
            self.in_flight -= 1
            return error_response(error, ctx.request_id)
        except ClientGone:
            self.in_flight -= 1
            return await self._gone(chunks)
        except asyncio.CancelledError:
            self.in_flight -= 1
            if not self._stopped():
                raise
            return await self._shut(chunks, ctx)
        except BaseException:
            self.in_flight -= 1
            raise
        request = ctx.request
        assert request is not None
        headers = self._headers(ctx, ignored)
        if not request.stream:
            try:
                collected = [first] + await while_connected(http.receive, self._output(ctx, _rest(chunks)))
            except LaminaError as error:
                return error_response(error, ctx.request_id)
            except ClientGone:
                return await self._gone(chunks)
            except asyncio.CancelledError:
                if not self._stopped():
                    raise
                return await self._shut(chunks, ctx)
            finally:
                self.in_flight -= 1
            return Response(orjson.dumps(completion_body(kind, request, collected)), media_type="application/json",
                            headers=headers)
        options = body.get("stream_options") or {}
        meta = StreamMeta(request_id=ctx.request_id, model=request.model, created=int(time.time()),
                          kind="chat" if kind == "chat" else "completion", include_usage=options.get("include_usage"),
                          choices=request.n)
        return _TokenStream(self, codec.encoder(), meta, ctx, first, chunks, codec.media_type, headers)

    async def _shut(self, chunks: AsyncIterator[TokenChunk], ctx: RequestContext) -> Response:
        """Abort a request the server stopped before it finished: 503 ``shutdown``."""
        await chunks.aclose()  # type: ignore[attr-defined]
        return error_response(SHUT_DOWN, ctx.request_id)

    async def _gone(self, chunks: AsyncIterator[TokenChunk]) -> Response:
        """Abort a request whose client left; the response goes nowhere."""
        await chunks.aclose()  # type: ignore[attr-defined]
        self.metrics.aborted("client_gone")
        return Response(status_code=CLIENT_CLOSED)


class _TokenStream(Response):
    """A streamed answer. Its head and first chunk (which exists already) are written at once; a
    reader task then pulls the rest and writes each chunk itself while nothing is held and the
    transport takes writes without waiting (:data:`~lamina.server.http_protocol.WRITABLE`); otherwise
    it holds them for the handler's task, which writes as the client reads. So the request's executor
    never waits on a socket. A client that falls ``stream_buffer_bytes`` behind is aborted
    (``slow_client``): its engine work is freed and what it holds is bounded; one that leaves aborts it
    (``client_gone``)."""

    def __init__(self, server: Server, encoder: StreamEncoder, meta: StreamMeta, ctx: RequestContext,
                 first: TokenChunk, chunks: AsyncIterator[TokenChunk], media_type: str,
                 headers: Mapping[str, str]) -> None:
        self.server, self.encoder, self.ctx, self.chunks = server, encoder, ctx, chunks
        self.ended_at_first = first.is_final
        self.status_code, self.media_type, self.background = 200, media_type, None
        self.init_headers(headers)
        self.opening = encoder.header(meta) + encoder.chunk(first)
        self.buffer = _StreamBuffer(server.stream_buffer_bytes)
        self.last_sent = time.monotonic()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        ended = False
        reader = None
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            await send({"type": "http.response.body", "body": self.opening, "more_body": True})
            self.last_sent = time.monotonic()
            writable = scope.get("extensions", {}).get(WRITABLE)
            reader = asyncio.ensure_future(self._read(send, writable))
            await while_connected(receive, self._write(send))
            ended = True  # the reader may still be closing the request's stream: let it finish
        except ClientGone:
            pass
        finally:
            if reader is None:
                self.server.in_flight -= 1
                await self.chunks.aclose()  # type: ignore[attr-defined]
            else:
                if not ended and not reader.done():
                    reader.cancel()
                    self.server.metrics.aborted("client_gone")
                # shielded: a second cancellation of this task cannot cut the executor's own clean-up
                # (closing an upstream connection, say) short
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.shield(asyncio.gather(reader, return_exceptions=True))

    async def _read(self, send: Send, writable: Callable[[], bool] | None) -> None:
        """Pull the chunks after the first, writing or holding each, then end the buffer; on
        overflow, abort them. The task waits in `abort_in_flight`'s reach all along."""
        server, buffer, encoder = self.server, self.buffer, self.encoder
        try:
            await server._output(self.ctx, self._pull(send, writable))
        except LaminaError as error:
            buffer.put(_error_event(encoder, error))
        except asyncio.CancelledError:
            if not server._stopped():
                raise
            buffer.put(_error_event(encoder, SHUT_DOWN))
        except Exception:  # a write that failed: nobody awaits this task's result, so it is logged here
            log.exception("stream_write_failed")
        finally:
            server.in_flight -= 1
            buffer.end()
            await self.chunks.aclose()  # type: ignore[attr-defined]

    async def _pull(self, send: Send, writable: Callable[[], bool] | None) -> None:
        buffer, encoder, ended = self.buffer, self.encoder, self.ended_at_first
        while not ended and not buffer.overflowed:
            try:
                chunk = await anext(self.chunks)
            except StopAsyncIteration:
                break
            ended = chunk.is_final
            data = encoder.chunk(chunk)
            if writable is not None and buffer.empty and writable():
                await send({"type": "http.response.body", "body": data, "more_body": True})  # returns at once
                self._sent(chunk.has_output)
            else:
                buffer.put(data, chunk.has_output)
        if buffer.overflowed and not ended:
            log.warning("stream_aborted_slow_client", held_bytes=buffer.held, limit_bytes=buffer.limit)
            self.server.metrics.aborted("slow_client")
            buffer.put(_error_event(encoder, SLOW_CLIENT))

    def _sent(self, has_output: bool) -> None:
        now = time.monotonic()
        if has_output:
            self.server.metrics.inter_token(self.ctx, now - self.last_sent)
        self.last_sent = now

    async def _write(self, send: Send) -> None:
        """Write what the reader holds, in order, until it ends the buffer."""
        buffer = self.buffer
        while (item := await buffer.get()) is not None:
            buffer.writing = True
            try:
                await send({"type": "http.response.body", "body": item[0], "more_body": True})
            finally:
                buffer.writing = False
            self._sent(item[1])
        await send({"type": "http.response.body", "body": b"", "more_body": False})
