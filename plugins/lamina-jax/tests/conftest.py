from collections.abc import Iterator
from pathlib import Path

import pytest

from lamina_jax.testing import release_compiled_code, write_tiny_gguf


@pytest.fixture(autouse=True)
def _compiled_code_within_the_map_limit() -> Iterator[None]:
    """This process compiles dozens of models: `release_compiled_code` after each test that nears the limit."""
    yield
    release_compiled_code()


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama with a byte-level BPE tokenizer and a ChatML template, as a GGUF file."""
    return write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "tiny-llama.gguf")
