"""The cross-package tests' shared fixtures (a live server is lamina.testing's ``live`` fixture)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from lamina_jax.testing import release_compiled_code


@pytest.fixture(autouse=True)
def _compiled_code_within_the_map_limit() -> Iterator[None]:
    """This process compiles dozens of models: `release_compiled_code` after each test that nears the limit."""
    yield
    release_compiled_code()
