from pathlib import Path

import pytest

from lamina_jax.testing import write_tiny_gguf


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama with a byte-level BPE tokenizer and a ChatML template, as a GGUF file."""
    return write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "tiny-llama.gguf")
