from __future__ import annotations

from typing import Any

import pytest
from lamina.kernel.plugins import PluginSet
from lamina.kernel.stack import Stack
from lamina import pool
from lamina.kernel.stack_config import StackConfig

ECHO_STACK: dict[str, Any] = {
    "stack": {"name": "test"},
    "router": {"use": "round-robin"},
    "executor": {"use": "echo"},
}


@pytest.fixture
def build_stack(make_plugins: Any) -> Any:
    """``build_stack(*extra_plugins, overrides={...})`` → a built (not started) echo stack;
    an override of ``None`` removes that section."""

    def build(*extra: tuple[str, object], overrides: dict[str, Any] | None = None) -> Stack:
        plugins: PluginSet = make_plugins(*extra, entry_points=True)
        merged = {**ECHO_STACK, **(overrides or {})}
        config = StackConfig.from_dict({k: v for k, v in merged.items() if v is not None}, plugins.registry)
        return pool.build_stack(config, plugins)

    return build
