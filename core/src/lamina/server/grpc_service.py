"""The gRPC API (``lamina.v1.Inference``, see ``core/proto/``) on ``grpc.aio``, beside the HTTP API.

Each ``Generate`` runs through :func:`lamina.kernel.pipeline.run_request` as an HTTP request does.
The proto request is first written as the OpenAI body it stands for (``/v1/completions``
for a text or token-id prompt, ``/v1/chat/completions`` for a chat), so admission plugins
see the same body and :mod:`lamina.server.openai_api` validates it with the same rules and
messages. A :class:`LaminaError` ends the call with the status its ``grpc_code`` names, and
with trailers naming the error, its code and its Retry-After (:mod:`lamina.wire.error_trailers`);
after tokens were sent, the stream simply ends with that status. The request id goes out in the
initial metadata (``x-request-id``) and in every chunk. A request that names a codec by media type
(``codec: "application/x-lamina-stc"``) gets its stream as that codec's bytes in each
chunk's ``frames`` — the same bytes the HTTP API sends — instead of typed fields.

Stopping a request early: a client that cancels (or whose deadline passes) gets its handler
cancelled by grpc, which closes the pipeline and so frees the request's KV cache.
``Abort(request_id)`` cancels the handler too, but only while it waits for the pipeline's
next chunk, never half-way through a write; the stream then ends normally with a final
chunk whose ``finish_reason`` is ``"abort"`` (no usage), so the caller keeps what it got and
can tell an abort from a broken connection.

A worker (``lamina worker``) serves the same API to its gateway, which polls ``GetState`` for
routing and passes the tenant admission decided in the ``x-lamina-tenant`` metadata; only a
service built with ``trust_tenant=True`` (a worker, listening on loopback or a private network)
reads it — a public server never lets a client choose its tenant.

The standard health service answers SERVING while every executor is healthy (checked every
second) and NOT_SERVING for good once :meth:`InferenceService.drain` is called; new
``Generate`` calls then get UNAVAILABLE while running ones finish. Server reflection lists
the three services.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any, NoReturn

import attrs
import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from lamina_hookspecs.errors import (
    InvalidRequestError, LaminaError, NotAcceptableError, NotFoundError, ServiceUnavailableError,
)
from lamina_hookspecs.types import RequestContext, StreamMeta, TokenChunk
from lamina.kernel.admission import bearer_token
from lamina.kernel.lifecycle import trace_context
from lamina.kernel.pipeline import run_request
from lamina.wire.convert import TENANT_METADATA, to_proto
from lamina.wire.error_trailers import error_trailers
from lamina.server.openai_api import parse_chat, parse_completion
from lamina.wire.proto.lamina.v1 import inference_pb2 as pb
from lamina.wire.proto.lamina.v1 import inference_pb2_grpc as pb_grpc
from lamina.wire.queue_wait import MAX_QUEUE_WAIT_HEADER, bounded, max_queue_wait
from lamina.kernel.stack import Stack

SERVICE_NAME: str = pb.DESCRIPTOR.services_by_name["Inference"].full_name
HEALTH_POLL_S = 1.0
MAX_REQUEST_ID_CHARS = 128

Context = grpc.aio.ServicerContext[Any, Any]


class RequestIdInUseError(InvalidRequestError):
    """A ``Generate`` names the id of a request still running (gRPC ALREADY_EXISTS)."""

    http_status = 409
    grpc_code = "ALREADY_EXISTS"


def openai_body(request: pb.GenerateRequest) -> tuple[str, dict[str, Any]]:
    """The endpoint (``completion`` or ``chat``) and the OpenAI request body ``request`` stands for.

    Optional fields left unset are left out, so the OpenAI parsers apply their defaults.
    """
    sampling = request.sampling
    body: dict[str, Any] = {"model": request.model, "stream": True, "top_k": sampling.top_k,
                            "stop_token_ids": list(sampling.stop_token_ids), "ignore_eos": sampling.ignore_eos,
                            "presence_penalty": sampling.presence_penalty,
                            "frequency_penalty": sampling.frequency_penalty, "min_p": sampling.min_p,
                            "min_tokens": sampling.min_tokens,
                            "logit_bias": {str(t): b for t, b in sampling.logit_bias.items()}}
    body.update({key: getattr(sampling, key) for key in ("max_tokens", "temperature", "top_p", "seed",
                                                         "repetition_penalty") if sampling.HasField(key)})
    if sampling.stop:
        body["stop"] = list(sampling.stop)
    kind = sampling.structured_outputs.WhichOneof("constraint")
    if kind is not None:
        value = getattr(sampling.structured_outputs, kind)
        body["structured_outputs"] = {kind: list(value.choices) if kind == "choice" else value}
    if request.user:
        body["user"] = request.user
    prompt = request.WhichOneof("prompt")
    if prompt == "chat":
        body.update(_chat(request.chat), logprobs=sampling.logprobs, top_logprobs=sampling.top_logprobs)
        return "chat", body
    if prompt is not None:
        body["prompt"] = request.text if prompt == "text" else list(request.token_ids.ids)
    if sampling.logprobs:
        body["logprobs"] = sampling.top_logprobs
    elif sampling.top_logprobs:
        raise InvalidRequestError("top_logprobs: needs logprobs = true", param="top_logprobs")
    return "completion", body


def _chat(chat: pb.Chat) -> dict[str, Any]:
    """The OpenAI fields of a ``Chat``: its messages and tools."""
    messages = []
    for m in chat.messages:
        message: dict[str, Any] = {"role": m.role, "content": m.content}
        if m.role == "tool":
            message["tool_call_id"] = m.tool_call_id
        if m.tool_calls:
            message["content"] = m.content or None
            message["tool_calls"] = [{"id": c.id, "type": "function",
                                      "function": {"name": c.name, "arguments": c.arguments}} for c in m.tool_calls]
        messages.append(message)
    fields: dict[str, Any] = {"messages": messages}
    if chat.tools:
        fields["tools"] = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                             "parameters": _parameters(t, i)}}
                           for i, t in enumerate(chat.tools)]
    choice = chat.WhichOneof("tool_choice")
    if choice == "tool_mode":
        fields["tool_choice"] = chat.tool_mode
    elif choice == "tool_function":
        fields["tool_choice"] = {"type": "function", "function": {"name": chat.tool_function}}
    if chat.HasField("parallel_tool_calls"):
        fields["parallel_tool_calls"] = chat.parallel_tool_calls
    return fields


def _parameters(tool: pb.Tool, i: int) -> Any:
    if not tool.parameters:
        return None
    try:
        return json.loads(tool.parameters)
    except ValueError:
        raise InvalidRequestError(f"tools[{i}].parameters: must be a JSON Schema as JSON text",
                                  param=f"tools[{i}].parameters") from None


async def _fail(context: Context, error: LaminaError) -> NoReturn:
    await context.abort(grpc.StatusCode[error.grpc_code], error.message, trailing_metadata=error_trailers(error))


class _Flight:
    """A running ``Generate``: what ``Abort`` needs to stop it between two writes."""

    def __init__(self) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.task = task
        self.aborted = False
        self._waiting = False  # on the pipeline: the one place a cancel may land
        self._cancelled = False

    def abort(self) -> None:
        if self._waiting and not self._cancelled:
            self._cancelled = True
            self.task.cancel()
        self.aborted = True

    async def next(self, chunks: AsyncIterator[TokenChunk]) -> TokenChunk | None:
        """The pipeline's next chunk; ``None`` at its end or once aborted."""
        if self.aborted:
            return None
        self._waiting = True
        try:
            return await anext(chunks)
        except StopAsyncIteration:
            return None
        except asyncio.CancelledError:
            if not self._cancelled or self.task.uncancel():
                raise  # the client cancelled (too)
            return None
        finally:
            self._waiting = False


class InferenceService(pb_grpc.InferenceServicer):
    """The ``lamina.v1.Inference`` servicer over one stack, with its health service."""

    def __init__(self, stack: Stack, *, trust_tenant: bool = False) -> None:
        self.stack, self.trust_tenant = stack, trust_tenant
        self.health = health.aio.HealthServicer()
        self.draining = False
        self._flights: dict[str, _Flight] = {}
        self._health_status: int | None = None
        self._health_task: asyncio.Task[None] | None = None

    @property
    def in_flight(self) -> int:
        """Generate calls now running."""
        return len(self._flights)

    async def watch_health(self) -> None:
        """Report the executors' health now, then keep it in step (every second) until :meth:`drain`;
        one poller however often it is called."""
        await self._report_health()
        if self._health_task is None or self._health_task.done():
            self._health_task = asyncio.create_task(self._poll_health())

    async def _report_health(self) -> None:
        healthy = all(executor.state().healthy for executor in self.stack.backends.values())
        status = health_pb2.HealthCheckResponse.SERVING if healthy else health_pb2.HealthCheckResponse.NOT_SERVING
        if status != self._health_status:
            self._health_status = status
            for service in (health.OVERALL_HEALTH, SERVICE_NAME):
                await self.health.set(service, status)

    async def _poll_health(self) -> None:
        while True:
            await asyncio.sleep(HEALTH_POLL_S)
            await self._report_health()

    def abort_in_flight(self) -> list[str]:
        """Abort every running ``Generate`` (as ``Abort`` does: each stream ends with a
        ``finish_reason="abort"`` chunk and its work is freed), once draining has run out of time.
        Returns their request ids."""
        for flight in self._flights.values():
            flight.abort()
        return list(self._flights)

    async def drain(self) -> None:
        """Report NOT_SERVING from now on and refuse new requests; running ones continue."""
        self.draining = True
        if self._health_task is not None:
            self._health_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health_task
        await self.health.enter_graceful_shutdown()

    def _check_new(self, request_id: str) -> None:
        if not (len(request_id) <= MAX_REQUEST_ID_CHARS and request_id.isascii() and request_id.isprintable()):
            raise InvalidRequestError(f"request_id: must be at most {MAX_REQUEST_ID_CHARS} printable ASCII "
                                      "characters", param="request_id")
        if request_id in self._flights:
            raise RequestIdInUseError(f"request_id: {request_id!r} is already running", param="request_id")
        if self.draining:
            raise ServiceUnavailableError("the server is shutting down", code="draining", retry_after=5)

    async def Generate(self, request: pb.GenerateRequest, context: Context) -> None:  # noqa: N802
        request_id = request.request_id or f"gen-{uuid.uuid4().hex}"
        try:
            self._check_new(request_id)
        except LaminaError as error:
            await _fail(context, error)
        flight = self._flights[request_id] = _Flight()
        index, final = 0, False
        try:
            await context.send_initial_metadata((("x-request-id", request_id),))
            kind, body = openai_body(request)
            write = self._writer(request, request_id, kind)
            metadata = dict(context.invocation_metadata() or ())
            ctx = RequestContext(request_id=request_id, endpoint=kind, client=context.peer(),
                                 credential=bearer_token(metadata.get("authorization")),
                                 trace_context=trace_context(metadata))
            if self.trust_tenant and metadata.get(TENANT_METADATA):
                ctx.tenant = metadata[TENANT_METADATA]
            parse = parse_chat if kind == "chat" else parse_completion
            wait = max_queue_wait(metadata.get(MAX_QUEUE_WAIT_HEADER))
            fork_of = request.fork_of or None
            chunks = run_request(self.stack, ctx, body, lambda b: attrs.evolve(
                bounded(parse(b, request_id, ctx.tenant), wait), fork_of=fork_of))
            async with contextlib.aclosing(chunks):  # type: ignore[type-var]
                while (chunk := await flight.next(chunks)) is not None:
                    await context.write(write(chunk))
                    index, final = chunk.index + len(chunk.token_ids), chunk.is_final
        except LaminaError as error:
            await _fail(context, error)
        finally:
            del self._flights[request_id]
        if flight.aborted and not final:
            await context.write(write(TokenChunk(request_id=request_id, index=index, finish_reason="abort")))

    def _writer(self, request: pb.GenerateRequest, request_id: str, kind: str
                ) -> Callable[[TokenChunk], pb.GenerateChunk]:
        """Chunk → message: typed fields, or the frames of the codec the request named."""
        if not request.codec:
            return lambda chunk: to_proto(request_id, chunk)
        codec = self.stack.codec_for(request.codec)
        if codec is None:
            raise NotAcceptableError(f"codec: no installed codec speaks {request.codec!r}", param="codec")
        encoder = codec.encoder()
        meta = StreamMeta(request_id=request_id, model=request.model, created=int(time.time()),
                          kind="chat" if kind == "chat" else "completion", include_usage=True)
        header = [encoder.header(meta)]

        def write(chunk: TokenChunk) -> pb.GenerateChunk:
            frames = encoder.chunk(chunk)
            if header:
                frames = header.pop() + frames
            return pb.GenerateChunk(request_id=request_id, frames=frames)

        return write

    async def Abort(self, request: pb.AbortRequest, context: Context) -> pb.AbortReply:  # noqa: N802
        flight = self._flights.get(request.request_id)
        if flight is None:
            await _fail(context, NotFoundError(f"no running request {request.request_id!r}", param="request_id"))
        flight.abort()
        return pb.AbortReply()

    async def GetState(self, request: pb.GetStateRequest, context: Context) -> pb.BackendStateReply:  # noqa: N802
        states = [executor.state() for executor in self.stack.backends.values()]
        return pb.BackendStateReply(
            healthy=all(s.healthy for s in states), draining=self.draining or any(s.draining for s in states),
            outstanding_requests=sum(s.outstanding_requests for s in states),
            outstanding_tokens=sum(s.outstanding_tokens for s in states),
            queue_depth=sum(s.queue_depth for s in states), kv_blocks_used=sum(s.kv_blocks_used for s in states),
            kv_blocks_total=sum(s.kv_blocks_total for s in states),
            tokens_per_s=sum(s.tokens_per_s for s in states),
            preemptions=sum(s.preemptions for s in states), draft_tokens=sum(s.draft_tokens for s in states),
            accepted_draft_tokens=sum(s.accepted_draft_tokens for s in states))

    async def ListModels(self, request: pb.ListModelsRequest, context: Context) -> pb.ListModelsReply:  # noqa: N802
        models = {executor.model.id: executor.model for executor in self.stack.backends.values()}
        return pb.ListModelsReply(models=[pb.ModelInfo(id=m.id, context_length=m.context_length, owned_by=m.owned_by)
                                          for m in models.values()])


async def start_grpc(service: InferenceService, host: str, port: int) -> tuple[grpc.aio.Server, int]:
    """Serve ``service``, health and reflection on ``host:port`` (0: any free port); returns the
    started server and the port it bound. To shut down: ``await service.drain()``, wait for
    ``service.in_flight`` to reach 0, then ``await server.stop(grace)``.
    """
    server = grpc.aio.server()
    pb_grpc.add_InferenceServicer_to_server(service, server)
    health_pb2_grpc.add_HealthServicer_to_server(service.health, server)
    reflection.enable_server_reflection((SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    bound = server.add_insecure_port(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    await server.start()
    await service.watch_health()
    return server, bound
