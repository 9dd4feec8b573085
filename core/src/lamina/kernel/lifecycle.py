"""Calling lifecycle hooks so that one failing plugin cannot hurt a request.

pluggy stops at the first implementation that raises, so observers are called here one
implementation at a time, each with its own try/log; awaitables they return are awaited
(datasette's ``await_me_maybe``). Request wrappers are async context managers returned by
``lamina_request_wrap`` and entered in an ``AsyncExitStack``.
"""

from __future__ import annotations

import inspect
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from types import TracebackType
from collections.abc import Mapping
from typing import Any, AsyncIterator

import pluggy
import structlog

from lamina_hookspecs.types import RequestContext

log = structlog.get_logger(__name__)

TRACE_HEADERS = ("traceparent", "tracestate")
"""The W3C Trace Context headers (gRPC metadata keys) a request's trace continues from."""


def trace_context(headers: Mapping[str, str]) -> dict[str, str]:
    """The W3C trace headers among a request's headers or metadata, and nothing else
    (tracing plugins must never see credentials)."""
    return {name: value for name in TRACE_HEADERS if (value := headers.get(name))}


async def notify(pm: pluggy.PluginManager, hook_name: str, **kwargs: Any) -> None:
    """Call every implementation of an observer hook; log and swallow what they raise."""
    for impl in reversed(getattr(pm.hook, hook_name).get_hookimpls()):
        try:
            result = impl.function(**{arg: kwargs[arg] for arg in impl.argnames})
            if inspect.isawaitable(result):
                await result
        except Exception:
            log.exception("observer_failed", hook=hook_name, plugin=impl.plugin_name,
                          request_id=getattr(kwargs.get("ctx"), "request_id", None))


class _Guarded(AbstractAsyncContextManager[None]):
    """A plugin's request wrapper whose failures are logged instead of raised."""

    def __init__(self, cm: AbstractAsyncContextManager[Any], plugin: str) -> None:
        self.cm, self.plugin, self.entered = cm, plugin, False

    async def __aenter__(self) -> None:
        try:
            await self.cm.__aenter__()
            self.entered = True
        except Exception:
            log.exception("request_wrapper_failed", plugin=self.plugin, phase="enter")

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> bool:
        if self.entered:
            try:
                await self.cm.__aexit__(exc_type, exc, tb)
            except Exception:
                log.exception("request_wrapper_failed", plugin=self.plugin, phase="exit")
        return False  # never swallow the request's own exception


@asynccontextmanager
async def wrap_request(pm: pluggy.PluginManager, ctx: RequestContext) -> AsyncIterator[None]:
    """Enter every ``lamina_request_wrap`` context manager around the request."""
    async with AsyncExitStack() as stack:
        for impl in reversed(pm.hook.lamina_request_wrap.get_hookimpls()):
            try:
                cm = impl.function(ctx=ctx)
            except Exception:
                log.exception("request_wrapper_failed", plugin=impl.plugin_name, phase="create")
                continue
            if cm is not None:
                await stack.enter_async_context(_Guarded(cm, impl.plugin_name))
        yield
