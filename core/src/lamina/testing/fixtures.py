"""pytest fixtures for testing Lamina plugins (loaded via the ``pytest11`` entry point).

Kept light: pytest imports this module in every run where lamina-core is installed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest


@pytest.fixture
def make_plugins() -> Callable[..., Any]:
    """Build a fresh plugin set: ``make_plugins(("name", module_or_obj), ..., entry_points=False)``."""
    from lamina.kernel.plugins import load_plugins

    def make(*extra: tuple[str, object], entry_points: bool = False) -> Any:
        return load_plugins(entry_points=entry_points, extra=extra)

    return make


class HookRecorder:
    """A plugin that records every lifecycle hook call as ``(hook_name, kwargs)``."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]


def _recording_plugin(recorder: HookRecorder) -> object:
    from lamina_hookspecs import hookimpl

    class Recording:
        @hookimpl
        def lamina_stack_started(self, stack: Any) -> None:
            recorder.calls.append(("lamina_stack_started", {"stack": stack}))

        @hookimpl
        def lamina_stack_stopping(self, stack: Any) -> None:
            recorder.calls.append(("lamina_stack_stopping", {"stack": stack}))

        @hookimpl
        def lamina_request_received(self, ctx: Any) -> None:
            recorder.calls.append(("lamina_request_received", {"ctx": ctx}))

        @hookimpl
        def lamina_request_admitted(self, ctx: Any) -> None:
            recorder.calls.append(("lamina_request_admitted", {"ctx": ctx}))

        @hookimpl
        def lamina_request_routed(self, ctx: Any) -> None:
            recorder.calls.append(("lamina_request_routed", {"ctx": ctx}))

        @hookimpl
        def lamina_request_first_token(self, ctx: Any) -> None:
            recorder.calls.append(("lamina_request_first_token", {"ctx": ctx}))

        @hookimpl
        def lamina_request_finished(self, ctx: Any, finish_reason: str) -> None:
            recorder.calls.append(("lamina_request_finished", {"ctx": ctx, "finish_reason": finish_reason}))

        @hookimpl
        def lamina_request_failed(self, ctx: Any, error: Exception) -> None:
            recorder.calls.append(("lamina_request_failed", {"ctx": ctx, "error": error}))

    return Recording()


@pytest.fixture
def hook_recorder() -> tuple[HookRecorder, object]:
    """``(recorder, plugin)``: register ``plugin`` (e.g. via ``make_plugins``) and read ``recorder.calls``."""
    recorder = HookRecorder()
    return recorder, _recording_plugin(recorder)


@pytest.fixture
def lamina_logs() -> Iterator[list[dict[str, Any]]]:
    """Every structlog event logged during the test, as dicts (``event``, level, fields),
    with the request fields core binds as context variables (``request_id``, ``tenant``, ...)."""
    import structlog

    with structlog.testing.capture_logs(processors=[structlog.contextvars.merge_contextvars]) as logs:
        yield logs


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """Undo :func:`lamina.kernel.logging.configure_logging` (which ``lamina.cli.main`` calls) after the test:
    the root logger's handlers and level, and structlog's defaults."""
    import logging

    import structlog

    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    structlog.reset_defaults()
