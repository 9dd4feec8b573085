"""A backend in another process: a ``lamina worker`` (or any Lamina gRPC server) as an executor.

The gateway's pipeline drives it like a local executor: ``generate`` streams
``lamina.v1.Inference/Generate`` (the request id, prompt and sampling as the worker's own
parser expects them; the tenant admission chose in ``x-lamina-tenant`` metadata, for the
worker's prefix-cache isolation), and closing the stream cancels the call, which frees the
request's KV slots in the worker. ``state`` is cheap: a background task polls ``GetState``
every 100 ms, and the gateway's own account of what it has in flight there (requests, and
tokens: estimated prompt plus the output still to come) overrides it when larger, so a burst
of arrivals is routed on current numbers, not on the last poll (which would send the whole
burst to the one backend that looked idle). A backend that does not
answer the poll is reported unhealthy (routers then skip it) until it answers again.

gRPC statuses come back as the error classes they stand for; a lost connection or an
UNAVAILABLE worker is :class:`~lamina_hookspecs.errors.BackendLostError`, which core
retries on another backend when no token was sent yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import attrs
import grpc
import structlog

from lamina_hookspecs.errors import (
    BackendLostError, InternalError, InvalidRequestError, LaminaError, NotFoundError, RateLimitError,
    RequestTimeoutError,
)
from lamina_hookspecs.types import BackendState, ModelInfo, Request, TokenChunk
from lamina.wire.convert import TENANT_METADATA, from_proto, to_proto_request
from lamina.wire.error_trailers import error_from_trailers
from lamina.wire.proto.lamina.v1 import inference_pb2 as pb
from lamina.wire.proto.lamina.v1 import inference_pb2_grpc as pb_grpc
from lamina.wire.queue_wait import MAX_QUEUE_WAIT_HEADER

log = structlog.get_logger(__name__)

POLL_S = 0.1
"""How often each backend's state is polled."""
STATE_TIMEOUT_S = 1.0
"""A poll not answered within this marks the backend unhealthy."""

_ERRORS: dict[grpc.StatusCode, type[LaminaError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidRequestError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: RateLimitError,
    grpc.StatusCode.DEADLINE_EXCEEDED: RequestTimeoutError,
}


class RemoteExecutor:
    """One remote backend, reached at ``address`` (``host:port``)."""

    def __init__(self, name: str, address: str, *, connect_timeout_s: float = 600.0) -> None:
        self.name, self.address, self.connect_timeout_s = name, address, connect_timeout_s
        self.model = ModelInfo(id="", context_length=1)  # what the backend serves: known once started
        self._state = BackendState(name=name, model="", healthy=False)
        self._in_flight = 0
        self.draining = False  # set by the gateway: take no new requests (routers skip a draining backend)
        self._tokens: dict[object, int] = {}  # per stream in flight: estimated tokens still to process
        self._channel: grpc.aio.Channel | None = None
        self._stub: pb_grpc.InferenceStub | None = None
        self._poller: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Connect, wait (up to ``connect_timeout_s``) until the backend lists its model, start polling."""
        self._channel = grpc.aio.insecure_channel(self.address)
        self._stub = pb_grpc.InferenceStub(self._channel)
        deadline = time.monotonic() + self.connect_timeout_s
        while True:
            try:
                reply = await self._stub.ListModels(pb.ListModelsRequest(), timeout=STATE_TIMEOUT_S)
                if reply.models:
                    break
            except grpc.aio.AioRpcError:
                pass
            if time.monotonic() > deadline:
                raise BackendLostError(f"backend {self.name} at {self.address} did not answer within "
                                       f"{self.connect_timeout_s:g} s")
            await asyncio.sleep(0.2)
        if len(reply.models) > 1:
            log.warning("remote_backend_serves_several_models", backend=self.name, using=reply.models[0].id)
        model = reply.models[0]
        self.model = ModelInfo(id=model.id, context_length=model.context_length, owned_by=model.owned_by)
        await self._poll_once()
        self._poller = asyncio.create_task(self._poll())

    async def stop(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
        if self._channel is not None:
            await self._channel.close()

    def state(self) -> BackendState:
        remote = self._state
        tokens = sum(self._tokens.values())
        if self._in_flight > remote.outstanding_requests or tokens > remote.outstanding_tokens or self.draining:
            return attrs.evolve(remote, outstanding_requests=max(self._in_flight, remote.outstanding_requests),
                                outstanding_tokens=max(tokens, remote.outstanding_tokens),
                                draining=remote.draining or self.draining)
        return remote

    @property
    def in_flight(self) -> int:
        """Requests this gateway has running on the backend now."""
        return self._in_flight

    async def generate(self, request: Request) -> AsyncIterator[TokenChunk]:
        if self._stub is None:
            raise BackendLostError(f"backend {self.name} is not started")
        metadata = [(TENANT_METADATA, request.tenant)]
        if request.max_queue_wait_s is not None:
            metadata.append((MAX_QUEUE_WAIT_HEADER, repr(request.max_queue_wait_s)))
        call = self._stub.Generate(to_proto_request(request), metadata=metadata)
        stream = object()
        self._in_flight += 1
        self._tokens[stream] = request.estimated_tokens(self.model.context_length)
        try:
            async for chunk in call:
                self._tokens[stream] = max(self._tokens[stream] - len(chunk.token_ids), 0)
                yield from_proto(chunk)
        except grpc.aio.AioRpcError as exc:
            raise self._error(exc) from None
        finally:
            self._in_flight -= 1
            del self._tokens[stream]
            call.cancel()  # no-op once the call ended; otherwise the worker aborts the request

    def _error(self, exc: grpc.aio.AioRpcError) -> LaminaError:
        details = exc.details() or exc.code().name
        error = error_from_trailers(details, exc.trailing_metadata())
        if error is not None:
            return error
        cls = _ERRORS.get(exc.code())
        if cls is not None:
            return cls(details)
        if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN):
            return BackendLostError(f"backend {self.name} ({self.address}) was lost: {details}",
                                    code="backend_lost")
        return InternalError(f"backend {self.name}: {exc.code().name}: {details}")

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(POLL_S)
            await self._poll_once()

    async def _poll_once(self) -> None:
        assert self._stub is not None
        try:
            r = await self._stub.GetState(pb.GetStateRequest(), timeout=STATE_TIMEOUT_S)
        except grpc.aio.AioRpcError:
            if self._state.healthy:
                log.warning("backend_unreachable", backend=self.name, address=self.address)
            last = self._state  # its counters are kept while unreachable
            self._state = BackendState(name=self.name, model=self.model.id, healthy=False,
                                       preemptions=last.preemptions, draft_tokens=last.draft_tokens,
                                       accepted_draft_tokens=last.accepted_draft_tokens)
            return
        self._state = BackendState(
            name=self.name, model=self.model.id, healthy=r.healthy, draining=r.draining,
            outstanding_requests=r.outstanding_requests, outstanding_tokens=r.outstanding_tokens,
            queue_depth=r.queue_depth, kv_blocks_used=r.kv_blocks_used, kv_blocks_total=r.kv_blocks_total,
            tokens_per_s=r.tokens_per_s, preemptions=r.preemptions, draft_tokens=r.draft_tokens,
            accepted_draft_tokens=r.accepted_draft_tokens)
