from pathlib import Path

import gguf
import pytest

from lamina_jax.testing import random_weights, tiny_config, tokenizer_metadata, write_gguf


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama with a byte-level BPE tokenizer and a ChatML template, as a GGUF file."""
    metadata = tokenizer_metadata()
    config = tiny_config(vocab_size=len(metadata["tokenizer.ggml.tokens"]))
    path = tmp_path_factory.mktemp("tiny") / "tiny-llama.gguf"
    write_gguf(path, config, random_weights(config, seed=7), gguf.GGMLQuantizationType.F32, metadata)
    return path
