"""Every hookspec is documented for plugin authors and exercised by a test (datasette's rule)."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
from lamina_hookspecs import hookspecs
from lamina_hookspecs.layers import LAYERS

HOOKS = sorted(name for name in dir(hookspecs) if name.startswith("lamina_"))
TEST_SOURCES = "\n".join(
    p.read_text() for root in ("core/tests", "plugins", "examples") for p in
    (Path(__file__).resolve().parents[2] / root).rglob("test_*.py")
) + (Path(__file__).resolve().parents[1] / "src/lamina/testing/fixtures.py").read_text()


@pytest.mark.parametrize("name", HOOKS)
def test_hookspec_has_a_docstring_naming_every_parameter(name: str) -> None:
    function = getattr(hookspecs, name)
    doc = inspect.getdoc(function) or ""
    assert len(doc.splitlines()) >= 2, f"{name} needs a docstring saying when it is called and what to return"
    for param in inspect.signature(function).parameters:
        assert f":param {param}:" in doc, f"{name}: document parameter {param!r}"


@pytest.mark.parametrize("name", HOOKS)
def test_hookspec_is_used_by_a_test(name: str) -> None:
    assert name in TEST_SOURCES, f"no test implements or records {name}"


def test_every_layer_has_a_registration_hookspec() -> None:
    assert {layer.hook for layer in LAYERS} <= set(HOOKS)


def test_observer_hooks_are_every_stack_and_request_observer() -> None:
    """``OBSERVER_HOOKS`` (what the hook recorder and the observer contract call) names every observer spec."""
    observers = {name for name in HOOKS if name.startswith(("lamina_stack_", "lamina_request_"))}
    assert set(hookspecs.OBSERVER_HOOKS) == observers - {"lamina_request_wrap"}
