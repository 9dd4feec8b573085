"""``lamina serve``: build a stack, load its model in the background, serve HTTP and gRPC;
``lamina worker``: one executor behind the gRPC API, for a gateway's ``[replicas]``.

One asyncio loop (uvloop) runs uvicorn (HTTP) and ``grpc.aio`` (gRPC). The listeners start at once
so that ``/health`` answers while the model loads; ``/ready`` (and the gRPC health service)
turn ready when every executor has started, and then the process's other threads drop to a
lower CPU priority (``server.compute_nice``, :mod:`lamina.server.priority`). SIGTERM (or Ctrl-C) drains: new requests get
503 / UNAVAILABLE, in-flight streams run to completion for up to
``server.drain_timeout_s``; requests still running then are aborted (HTTP: 503 ``shutdown``;
gRPC: a ``finish_reason="abort"`` chunk), one log line counts them, and the process stops the
stack and exits 0 (a worker too). A second
signal exits at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from types import FrameType

import structlog
import uvicorn
from starlette.applications import Starlette

from lamina.server.grpc_service import InferenceService, start_grpc
from lamina.server.http_protocol import HeadWithFirstChunk
from lamina.server.http import Server
from lamina.server.priority import lower_other_threads
from lamina.kernel.drain import until_idle
from lamina.kernel.stack import Stack

log = structlog.get_logger(__name__)

ABORT_GRACE_S = 2.0
"""How long requests aborted at the end of a drain get to send their answers before the server closes."""


class _DrainingServer(uvicorn.Server):
    """uvicorn, with a first SIGTERM that drains instead of closing connections."""

    def __init__(self, config: uvicorn.Config, http: Server, grpc: InferenceService | None,
                 drain_timeout_s: float) -> None:
        super().__init__(config)
        self.http, self.grpc, self.drain_timeout_s = http, grpc, drain_timeout_s
        self._loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets: list | None = None) -> None:  # type: ignore[type-arg]
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.http.draining or self._loop is None:
            super().handle_exit(sig, frame)
            return
        self.http.draining = True
        self._loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self._drain()))

    def _in_flight(self) -> int:
        return self.http.in_flight + (self.grpc.in_flight if self.grpc else 0)

    async def _drain(self) -> None:
        began = time.monotonic()
        log.info("draining", in_flight=self._in_flight(), timeout_s=self.drain_timeout_s)
        if self.grpc is not None:
            await self.grpc.drain()
        await until_idle(self._in_flight, self.drain_timeout_s - (time.monotonic() - began))
        aborted = self.http.abort_in_flight() + (self.grpc.abort_in_flight() if self.grpc else [])
        await _answered(self._in_flight, aborted)
        self.should_exit = True


async def _answered(in_flight: Callable[[], int], aborted: list[str]) -> None:
    """Give the requests aborted at the end of a drain ``ABORT_GRACE_S`` to send their answers, then
    say in one line how the drain ended (a warning when it cut work short)."""
    left = await until_idle(in_flight, ABORT_GRACE_S, poll_s=0.01)
    (log.warning if aborted else log.info)("drained", aborted=len(aborted), left=left)
    if aborted:
        log.debug("drain_aborted", request_ids=aborted)


def _say(message: str) -> None:
    print(f"lamina: {message}", file=sys.stderr, flush=True)


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def warn_if_open(stack: Stack, host: str) -> bool:
    """Warn when the stack serves a non-loopback address with no authenticator; returns whether it warned."""
    if stack.admission.authenticates or is_loopback(host):
        return False
    log.warning("serving_without_authentication", host=host)
    _say(f"WARNING: serving on {host} without authentication: anyone who can reach it can use it. "
         "Add an [[admission]] entry with use = \"api-keys\" (keys_env or keys_file).")
    return True


def build_app(stack: Stack, http: Server, grpc: InferenceService | None = None,
              on_start_failed: Callable[[Exception], None] | None = None,
              on_started: Callable[[], None] | None = None) -> Starlette:
    """The ASGI app, whose lifespan starts the stack in the background (and the gRPC server,
    when given) and stops them at exit. If the stack fails to start, ``on_start_failed`` is
    called with the error (`serve` exits with it); without one, /ready stays 503. Once it has
    started, ``on_started`` is called on the event loop."""
    app = http.app()
    settings = stack.config.server

    async def start() -> None:
        began = time.monotonic()
        try:
            await stack.start()
        except Exception as error:
            log.exception("stack_start_failed")
            _say(f"the stack failed to start: {error}")
            if on_start_failed is not None:
                on_start_failed(error)
            return
        models = ", ".join(sorted({e.model.id for e in stack.backends.values()}))
        _say(f"ready in {time.monotonic() - began:.1f}s: serving {models}")
        if on_started is not None:
            on_started()

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        grpc_server = None
        if grpc is not None:
            grpc_server, port = await start_grpc(grpc, settings.host, settings.grpc_port)
            _say(f"gRPC lamina.v1.Inference on {settings.host}:{port}")
        task = asyncio.create_task(start())
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if grpc_server is not None:
            await grpc_server.stop(grace=1.0)
        await stack.stop()

    app.router.lifespan_context = lifespan
    return app


def serve(stack: Stack) -> int:
    """Serve ``stack`` as its ``[server]`` settings say until SIGTERM/SIGINT; returns the exit status."""
    settings = stack.config.server
    host, port = settings.host, settings.port
    http = Server(stack)
    grpc = InferenceService(stack) if settings.grpc else None
    failures: list[Exception] = []

    def start_failed(error: Exception) -> None:
        failures.append(error)
        server.should_exit = True

    app = build_app(stack, http, grpc, start_failed,
                    lambda: log.info("threads_lowered", count=lower_other_threads(settings.compute_nice),
                                     nice=settings.compute_nice))
    # uvloop (libuv's loop, as vLLM's server runs on): its selector, callbacks and transports are C, which
    # takes a tenth off the front's CPU per streamed token (benchmarks/README.md, "the relay's CPU per token")
    config = uvicorn.Config(app, loop="uvloop", host=host, port=port, log_config=None, access_log=False,
                            http=HeadWithFirstChunk,
                            timeout_graceful_shutdown=max(1, int(settings.drain_timeout_s)))
    server = _DrainingServer(config, http, grpc, settings.drain_timeout_s)
    _say(f"stack '{stack.config.meta.name}': {stack.info.components}")
    warn_if_open(stack, host)
    _say(f"listening on http://{host}:{port} (loading the model; /ready turns 200 when it is loaded)")
    server.run()
    return 1 if failures else 0


def serve_worker(stack: Stack, host: str, port: int) -> int:
    """Load the stack's executor, then serve it over gRPC on ``host:port`` (trusting the gateway's
    tenant metadata) until SIGTERM/SIGINT; running requests then get ``drain_timeout_s`` to finish."""

    async def main() -> None:
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stopping.set)
        began = time.monotonic()
        await stack.start()
        lower_other_threads(stack.config.server.compute_nice)
        service = InferenceService(stack, trust_tenant=True)
        server, bound = await start_grpc(service, host, port)
        _say(f"worker ready in {time.monotonic() - began:.1f}s on {host}:{bound}")
        await stopping.wait()
        await service.drain()
        await until_idle(lambda: service.in_flight, stack.config.server.drain_timeout_s)
        await _answered(lambda: service.in_flight, service.abort_in_flight())
        await server.stop(grace=1.0)
        await stack.stop()

    asyncio.run(main())
    return 0
