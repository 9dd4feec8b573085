"""Lamina's hook specifications.

Three kinds of hooks, in three sections:

**Registration** (``lamina_register_*``): each plugin adds named components to a layer.
Core calls each plugin's implementation once, at plugin-manager build time, with a
``register`` callback bound to that plugin, so every name is attributed to its plugin; a
name registered twice in one layer is an error naming both plugins.

**Stack lifecycle**: a built stack started or is stopping.

**Request lifecycle**: observers and wrappers around every request. For one request
they fire in this order::

    lamina_request_wrap        (async context managers entered around all below)
    lamina_request_received    body read, request id assigned
    lamina_admit               authenticate → validate → rate-limit (may reject)
    lamina_request_admitted
    lamina_route               choose a backend (firstresult)
    lamina_request_routed
    lamina_request_first_token
    lamina_request_finished    or, at any point after received, lamina_request_failed

Observers (``lamina_request_*``, ``lamina_stack_*``) are called by core one
implementation at a time: one that raises is logged with its plugin's name and neither
stops the others nor fails the request. An observer may be a plain function or return an
awaitable; core awaits it. ``lamina_admit`` and ``lamina_route`` are ordinary pluggy
calls on the event loop: implement them with ``wrapper=True`` to time or annotate those
phases, or as plain implementations to add a check or override the choice.

Hooks run on the server's asyncio event loop thread. None of them runs per token.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any

from lamina_hookspecs.markers import hookspec

if TYPE_CHECKING:
    from lamina_hookspecs.errors import LaminaError
    from lamina_hookspecs.registration import Register
    from lamina_hookspecs.types import (
        BackendState,
        FinishReason,
        Request,
        RequestContext,
        StackInfo,
    )

OBSERVER_HOOKS = ("lamina_stack_started", "lamina_stack_stopping", "lamina_request_received",
                  "lamina_request_admitted", "lamina_request_routed", "lamina_request_first_token",
                  "lamina_request_finished", "lamina_request_failed")
"""The observer hooks, which core calls one implementation at a time (see the module docstring)."""

# ---------------------------------------------------------------------------
# Registration
# ---------------------------------------------------------------------------


@hookspec
def lamina_register_routers(register: Register) -> None:
    """Register routers (layer 1): ``register(name, factory, options=Opts)``.

    Called once per plugin when the plugin manager is built. A factory returns a
    :class:`~lamina_hookspecs.protocols.Router`. Raising here marks the plugin as
    failed: a stack that uses one of its components will not start.

    :param register: the :class:`~lamina_hookspecs.registration.Register` callback.
    """


@hookspec
def lamina_register_codecs(register: Register) -> None:
    """Register stream codecs (layer 2); factories return a
    :class:`~lamina_hookspecs.protocols.Codec`. Called like ``lamina_register_routers``.

    :param register: the registration callback.
    """


@hookspec
def lamina_register_executors(register: Register) -> None:
    """Register executors (layer 3); factories return an
    :class:`~lamina_hookspecs.protocols.Executor` and receive the stack's prefix cache,
    batching and pre-warm policies in their ``BuildContext``. Called like ``lamina_register_routers``.

    :param register: the registration callback.
    """


@hookspec
def lamina_register_prefix_caches(register: Register) -> None:
    """Register prefix caches (layer 4); factories return a
    :class:`~lamina_hookspecs.protocols.PrefixCache`. Called like ``lamina_register_routers``.

    :param register: the registration callback.
    """


@hookspec
def lamina_register_autoscalers(register: Register) -> None:
    """Register autoscalers (layer 5); factories return an
    :class:`~lamina_hookspecs.protocols.Autoscaler`. Called like ``lamina_register_routers``.

    :param register: the registration callback.
    """


@hookspec
def lamina_register_rate_limiters(register: Register) -> None:
    """Register admission rate limiters; factories return a
    :class:`~lamina_hookspecs.protocols.RateLimiter`. Admission names (rate limiters,
    validators, breakers) share one namespace. Called like ``lamina_register_routers``.

    :param register: the registration callback.
    """


@hookspec
def lamina_register_authenticators(register: Register) -> None:
    """Register admission authenticators; factories return an
    :class:`~lamina_hookspecs.protocols.Authenticator`. Called like ``lamina_register_routers``.

    :param register: the registration callback.
    """


@hookspec
def lamina_register_validators(register: Register) -> None:
    """Register admission request validators; factories return a
    :class:`~lamina_hookspecs.protocols.Validator`. Called like ``lamina_register_routers``.

    :param register: the registration callback.
    """


@hookspec
def lamina_register_breakers(register: Register) -> None:
    """Register admission circuit breakers; factories return a
    :class:`~lamina_hookspecs.protocols.Breaker`. Called like ``lamina_register_routers``.

    :param register: the registration callback.
    """


@hookspec
def lamina_register_batching_policies(register: Register) -> None:
    """Register batching policies that executors' schedulers consult; factories return a
    :class:`~lamina_hookspecs.protocols.BatchingPolicy`. A stack's ``[batching]`` policy reaches
    its executor's factory as ``BuildContext.batching``; one instance serves one executor (its
    state is that scheduler's). Called like ``lamina_register_routers``.

    :param register: the registration callback.
    """


@hookspec
def lamina_register_prewarm_policies(register: Register) -> None:
    """Register pre-warm policies (layer 4) that executors with a prefix cache consult;
    factories return a :class:`~lamina_hookspecs.protocols.PrewarmPolicy`. A stack's
    ``[prewarm]`` policy reaches its executor's factory as ``BuildContext.prewarm``; one
    instance serves one executor. Called like ``lamina_register_routers``.

    :param register: the registration callback.
    """


@hookspec
def lamina_register_observers(register: Register) -> None:
    """Register request observers that a stack file switches on and configures with
    ``[[observers]]`` (tracing, audit logs); factories return an
    :class:`~lamina_hookspecs.protocols.Observer`: an object whose methods implement
    lifecycle hooks below (``@hookimpl``), registered on the stack's plugin manager while
    the stack runs. Called like ``lamina_register_routers``.

    :param register: the registration callback.
    """


@hookspec
def lamina_register_replica_providers(register: Register) -> None:
    """Register replica providers: where ``[replicas]`` workers run when the stack file says
    ``provider = "<name>"`` (local processes are core's default); factories return a
    :class:`~lamina_hookspecs.protocols.ReplicaProvider`. Called like ``lamina_register_routers``.

    :param register: the registration callback.
    """


@hookspec
def lamina_register_tool_parsers(register: Register) -> None:
    """Register tool parsers: a model family's tool-call format, chosen with ``[tool_parser]``;
    factories return a :class:`~lamina_hookspecs.protocols.ToolParser`. Called like
    ``lamina_register_routers``.

    :param register: the registration callback.
    """


# ---------------------------------------------------------------------------
# Stack lifecycle (observers)
# ---------------------------------------------------------------------------


@hookspec
def lamina_stack_started(stack: StackInfo) -> None:
    """A stack finished building and its executors are ready to serve.

    Called once per stack start, on the event loop. Return value ignored; may return
    an awaitable. Raising is logged and ignored.

    :param stack: the stack's name and the implementation chosen per layer.
    """


@hookspec
def lamina_stack_stopping(stack: StackInfo) -> None:
    """A stack is about to stop (shutdown signal or test teardown); in-flight requests
    are still being drained. Called once, on the event loop. Raising is logged and ignored.

    :param stack: the stack's name and the implementation chosen per layer.
    """


# ---------------------------------------------------------------------------
# Request lifecycle
# ---------------------------------------------------------------------------


@hookspec
def lamina_request_wrap(ctx: RequestContext) -> AbstractAsyncContextManager[Any] | None:
    """Wrap a whole request, streaming included (timing, tracing spans).

    Called once per request, on arrival, before ``lamina_request_received``. Return an
    async context manager (or ``None``): core enters every one returned and exits them,
    in reverse order, after the last byte is sent or the request failed; ``__aexit__``
    sees the exception, if any. A manager that raises on enter or exit is logged and
    skipped; the request goes on.

    :param ctx: the request's context (``request`` is not parsed yet).
    """


@hookspec
def lamina_request_received(ctx: RequestContext) -> None:
    """A request arrived and has a request id. Observer; called once per request.

    :param ctx: the request's context; ``request`` is not parsed yet.
    """


@hookspec
def lamina_admit(ctx: RequestContext, body: Mapping[str, Any]) -> None:
    """Decide whether a request enters: raise a ``LaminaError`` to reject it.

    Core's own implementation runs the stack's ``[[admission]]`` components: authenticators
    (which set ``ctx.tenant``), then validators, then rate limiters. Breakers act at routing. Add a plain implementation to add a check of your
    own, or a ``wrapper=True`` one to time or annotate admission. Called once per request
    on the event loop, before anything is started. Not an observer: an exception here
    rejects the request with that error's HTTP status.

    :param ctx: the request's context (``ctx.credential`` holds the bearer token, if any).
    :param body: the parsed JSON request body.
    """


@hookspec
def lamina_request_admitted(ctx: RequestContext) -> None:
    """Admission passed; ``ctx.request`` is set. Observer; called once per request.

    :param ctx: the request's context.
    """


@hookspec(firstresult=True)
def lamina_route(ctx: RequestContext, request: Request, backends: Sequence[BackendState]) -> BackendState | None:
    """Choose the backend for a request; the first non-``None`` result wins.

    Core's own implementation (``trylast``) asks the stack's router, or the request's
    A/B arm of it. Return a backend to override, ``None`` to defer, or use
    ``wrapper=True`` to time the decision. Called once per request on the event loop.
    Raising fails the request with that error.

    :param ctx: the request's context; ``ctx.arms`` holds its A/B assignments.
    :param request: the admitted request.
    :param backends: live state of every backend serving ``request.model``.
    :return: one of ``backends``.
    """


@hookspec
def lamina_request_routed(ctx: RequestContext) -> None:
    """A backend was chosen; ``ctx.backend`` names it. Observer; once per request, and again
    when the backend was lost before sending a token and the request is routed elsewhere.

    :param ctx: the request's context.
    """


@hookspec
def lamina_request_first_token(ctx: RequestContext) -> None:
    """The first output token is ready; ``ctx.first_token_at`` and ``ctx.ttft_s`` are set.
    Observer; once per request, before the token is sent.

    :param ctx: the request's context.
    """


@hookspec
def lamina_request_finished(ctx: RequestContext, finish_reason: FinishReason) -> None:
    """The request completed; ``ctx.usage`` and ``ctx.finished_at`` are set. Observer;
    once per request that did not fail. ``finish_reason == "abort"`` means the client
    went away and the request's resources were freed.

    :param ctx: the request's context.
    :param finish_reason: ``"stop"``, ``"length"`` or ``"abort"``.
    """


@hookspec
def lamina_request_failed(ctx: RequestContext, error: LaminaError) -> None:
    """The request failed at any phase after ``received`` (rejected by admission, no
    backend, executor error). Observer; at most once per request, instead of
    ``lamina_request_finished``.

    :param ctx: the request's context (``request`` may be ``None`` if parsing failed).
    :param error: what went wrong; unexpected exceptions arrive wrapped in ``InternalError``.
    """
