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
    """Every observer hook call (``OBSERVER_HOOKS``) a stack made, as ``(hook_name, kwargs)``."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]


def _recording_plugin(recorder: HookRecorder) -> object:
    """One implementation per observer hook of the specification, each appending its call to
    ``recorder``. (Core calls observers one implementation at a time, not through pluggy's hook
    caller, so pluggy's hook-call monitoring does not see them: the recorder is an observer.)"""
    import functools
    import inspect

    from lamina_hookspecs import hookimpl, hookspecs

    class Recording:
        pass

    plugin = Recording()
    for name in hookspecs.OBSERVER_HOOKS:
        spec = getattr(hookspecs, name)

        @functools.wraps(spec)  # pluggy reads the arguments to pass from the spec's signature
        def record(*args: Any, _name: str = name, _params: tuple[str, ...] = tuple(inspect.signature(spec).parameters),
                   **kwargs: Any) -> None:
            recorder.calls.append((_name, {**dict(zip(_params, args)), **kwargs}))

        setattr(plugin, name, hookimpl(record))
    return plugin


@pytest.fixture
def hook_recorder() -> tuple[HookRecorder, object]:
    """``(recorder, plugin)``: register ``plugin`` (e.g. via ``make_plugins``) and read ``recorder.calls``."""
    recorder = HookRecorder()
    return recorder, _recording_plugin(recorder)


@pytest.fixture
def live() -> Iterator[Callable[..., Any]]:
    """``live(stack_dict, *extra_plugins)`` serves a stack over HTTP on a free loopback port and returns
    its :class:`~lamina.testing.live.LiveServer` (``.url``, ``.stack``); every one is stopped at teardown."""
    from lamina.testing.live import LiveServer

    started: list[LiveServer] = []

    def start(config: dict[str, Any], *extra: tuple[str, object]) -> LiveServer:
        server = LiveServer(config, extra).__enter__()
        started.append(server)
        return server

    yield start
    for server in started:
        server.__exit__()


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
