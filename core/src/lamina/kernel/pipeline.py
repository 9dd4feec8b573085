"""One request's way through a built stack: received → admitted → routed → tokens → finished.

Transports (HTTP, gRPC, in-process tests) call :func:`run_request` and encode what it
yields; a chat with tools goes through the stack's tool parser (:mod:`lamina.kernel.tool_calls`), a
request for ``n`` > 1 choices runs as ``n`` forks on one backend (:mod:`lamina.kernel.choices`).
Closing the returned iterator early (client gone) aborts the executor stream, which frees
the request's KV slots, and reports ``finish_reason="abort"``. A backend that fails a request
before sending anything, for a reason another backend may not share (`elsewhere`: lost, draining,
out of capacity), is left out and the request routed again, while other backends remain; the last
one's error is the answer.

Every log line emitted while a request runs carries its ``request_id``, ``tenant``, ``arm``
and ``backend``: they are bound as structlog context variables as they become known (the
transport runs each request in its own task, so bindings do not leak between requests).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import attrs
import structlog

from lamina_hookspecs.errors import (BackendLostError, InternalError, InvalidRequestError, LaminaError,
                                     ServiceUnavailableError, TokenizerNotAvailableError)
from lamina_hookspecs.protocols import Executor, Tokenizes
from lamina_hookspecs.types import FinishReason, Request, RequestContext, TokenChunk
from lamina.kernel import choices, tool_calls
from lamina.kernel.ab import arm_label
from lamina.kernel.lifecycle import notify, wrap_request
from lamina.kernel.stack import Stack

log = structlog.get_logger(__name__)


async def _prompt_text(executor: Executor, request: Request) -> str:
    """The text of a completion's prompt, for ``echo``: as given, or its ids decoded by the executor."""
    if request.prompt_token_ids is None:
        return request.prompt or ""
    try:
        if isinstance(executor, Tokenizes):
            return await executor.detokenize(request.prompt_token_ids)
    except TokenizerNotAvailableError:
        pass
    raise InvalidRequestError("echo: a prompt of token ids is echoed as their text, which this model's backend "
                              "cannot decode; send the prompt as text", param="echo")


async def _reply(stack: Stack, executor: Executor, request: Request) -> AsyncIterator[TokenChunk]:
    """One choice's chunks from ``executor``, its tool calls read; closing it closes the executor's stream."""
    stream = executor.generate(request)
    calls = tool_calls.reader(stack.tool_parser, request)
    chunks = stream if calls is None else tool_calls.read_calls(stream, calls)
    try:
        async for chunk in chunks:
            yield chunk
    finally:
        if chunks is not stream:
            await chunks.aclose()  # type: ignore[attr-defined]
        await stream.aclose()  # type: ignore[attr-defined]


REFUSED_ELSEWHERE = frozenset({"draining", "overloaded", "queue_full"})
"""Codes of a backend's refusal at arrival that another backend may not share: it is shutting down,
or it has no room now. (A ``queue_timeout`` is not among them: the request has waited its bound.)"""


def elsewhere(error: ServiceUnavailableError) -> bool:
    """Whether another backend may serve a request ``error`` ended before any token: the backend was
    lost, or refused it for a reason of its own (`REFUSED_ELSEWHERE`)."""
    return isinstance(error, BackendLostError) or error.code in REFUSED_ELSEWHERE


async def run_request(stack: Stack, ctx: RequestContext, body: Mapping[str, Any],
                      parse: Callable[[Mapping[str, Any]], Request]) -> AsyncIterator[TokenChunk]:
    """Admit, route and execute one request, yielding its chunks; the last is final.

    :param parse: turns the admitted body into a :class:`Request` (raises
        ``InvalidRequestError`` for what validation let through but cannot be served).
    :raises LaminaError: on rejection or failure, after ``lamina_request_failed`` fired.
    """
    pm = stack.pm
    structlog.contextvars.clear_contextvars()  # a request's log context starts fresh
    structlog.contextvars.bind_contextvars(request_id=ctx.request_id, tenant=ctx.tenant, arm="", backend=None)
    async with wrap_request(pm, ctx):
        await notify(pm, "lamina_request_received", ctx=ctx)
        finish: FinishReason = "abort"
        error: LaminaError | None = None
        try:
            pm.hook.lamina_admit(ctx=ctx, body=body)
            structlog.contextvars.bind_contextvars(tenant=ctx.tenant, arm=arm_label(ctx.arms))
            request = stack.apply_fallback(ctx, stack.apply_route_tree(ctx, parse(body)))
            ctx.request = request = tool_calls.prepare(stack.tool_parser, request)
            stack.serving(request.model)
            await notify(pm, "lamina_request_admitted", ctx=ctx)
            lost: set[str] = set()
            while True:
                states = [s for s in stack.backend_states(request, ctx) if s.name not in lost]
                backend = pm.hook.lamina_route(ctx=ctx, request=request, backends=states)
                ctx.backend = backend.name
                structlog.contextvars.bind_contextvars(backend=backend.name, arm=arm_label(ctx.arms))
                stack.admission.started(backend.name, time.monotonic())
                await notify(pm, "lamina_request_routed", ctx=ctx)
                executor = stack.backends[backend.name]
                echo = await _prompt_text(executor, request) if request.echo else ""
                replies = [_reply(stack, executor, one) for one in choices.fork(request)]
                chunks = replies[0] if len(replies) == 1 else choices.merge(replies)
                echoed: set[int] = set()
                sent = False
                try:
                    async for chunk in chunks:
                        if echo and chunk.choice not in echoed:
                            chunk = attrs.evolve(chunk, text=echo + chunk.text)
                            echoed.add(chunk.choice)
                        if ctx.first_token_at is None and chunk.has_output:
                            ctx.first_token_at = time.monotonic()
                            await notify(pm, "lamina_request_first_token", ctx=ctx)
                        if chunk.is_final:
                            finish, ctx.usage = chunk.finish_reason or finish, chunk.usage
                        sent = True
                        yield chunk
                    break
                except ServiceUnavailableError as exc:
                    if sent or not elsewhere(exc) or len(lost) + 1 >= len(states):
                        raise
                    log.warning("retrying_on_another_backend", lost=backend.name, error=exc.message)
                    stack.admission.record(backend.name, False, time.monotonic())
                    lost.add(backend.name)
                finally:
                    await chunks.aclose()  # type: ignore[attr-defined]
        except LaminaError as exc:
            error = exc
            raise
        except Exception as exc:
            log.exception("request_crashed", error_type=type(exc).__name__)
            error = InternalError(f"internal error: {type(exc).__name__}")
            raise error from exc
        finally:
            ctx.finished_at = time.monotonic()
            if ctx.backend is not None:
                stack.admission.record(ctx.backend, error is None or error.http_status < 500, ctx.finished_at)
            if error is None:
                await notify(pm, "lamina_request_finished", ctx=ctx, finish_reason=finish)
            else:
                await notify(pm, "lamina_request_failed", ctx=ctx, error=error)
            log.info("request_finished" if error is None else "request_failed",
                     endpoint=ctx.endpoint, finish_reason=finish if error is None else None,
                     error_type=type(error).__name__ if error else None, error=error.message if error else None,
                     status=error.http_status if error else 200,
                     ttft_s=ctx.ttft_s, duration_s=ctx.finished_at - ctx.received_at,
                     prompt_tokens=ctx.usage.prompt_tokens if ctx.usage else None,
                     completion_tokens=ctx.usage.completion_tokens if ctx.usage else None)
