"""The GGUF loader on tiny llama files written with ``gguf.GGUFWriter`` in llama.cpp's layout."""

from pathlib import Path

import gguf
import jax.numpy as jnp
import numpy as np
import pytest

from lamina_jax.model.llama import forward
from lamina_jax.testing import (
    GGUF_NAMES,
    random_weights,
    reference_logits,
    stored_weights,
    tiny_config,
    tokenizer_metadata,
    write_gguf,
)
from lamina_jax.tokenizer import Tokenizer
from lamina_jax.weights.gguf import load_gguf, read_config

Q = gguf.GGMLQuantizationType
TOKENIZER = tokenizer_metadata()
CONFIG = tiny_config(vocab_size=len(TOKENIZER["tokenizer.ggml.tokens"]))


@pytest.mark.parametrize(
    ("qtype", "tied", "tolerance"), [(Q.F32, False, 0.0), (Q.Q8_0, True, 0.01), (Q.Q4_1, True, 0.1)]
)
def test_loader_reproduces_config_weights_and_llama_cpp_rope(
    tmp_path: Path, qtype: gguf.GGMLQuantizationType, tied: bool, tolerance: float
) -> None:
    weights = random_weights(CONFIG, seed=7, tied=tied)
    stored = write_gguf(tmp_path / "tiny.gguf", CONFIG, weights, qtype, TOKENIZER)
    calls: list[tuple[int, int]] = []
    model = load_gguf(tmp_path / "tiny.gguf", progress=lambda done, total: calls.append((done, total)))

    assert model.config == CONFIG
    assert calls == [(i + 1, len(stored)) for i in range(len(stored))]
    assert (model.params.lm_head is None) == tied
    pairs = [(model.params.embed, weights["embed"]), (model.params.norm, weights["norm"])]
    for layer, expected in zip(model.params.layers, weights["layers"], strict=True):
        pairs += [(getattr(layer, key), expected[key]) for key in GGUF_NAMES]
    if not tied:
        pairs.append((model.params.lm_head, weights["lm_head"]))
    for loaded, expected in pairs:
        assert np.abs(np.asarray(loaded) - expected).max() <= tolerance * np.abs(expected).max()

    # Un-permuted Q/K with NeoX RoPE must equal llama.cpp's permuted Q/K with interleaved RoPE.
    tokens = np.random.default_rng(8).integers(0, CONFIG.vocab_size, 48).tolist()
    file_order = stored_weights(stored, CONFIG)
    expected_logits = reference_logits(file_order, CONFIG, tokens, interleaved_rope=True)
    logits = forward(model.params, jnp.asarray(tokens), config=CONFIG)
    np.testing.assert_allclose(logits, expected_logits, atol=1e-4, rtol=0)
    assert not np.allclose(reference_logits(file_order, CONFIG, tokens), expected_logits, atol=1e-2)


def test_tokenizer_from_gguf_metadata(tmp_path: Path) -> None:
    write_gguf(tmp_path / "tiny.gguf", CONFIG, random_weights(CONFIG, tied=True), Q.F32, TOKENIZER)
    tokenizer = Tokenizer.from_gguf(load_gguf(tmp_path / "tiny.gguf").metadata)
    assert tokenizer.encode("<|im_start|>user") == [1, *tokenizer.encode("user")]
    assert tokenizer.decode(tokenizer.encode(" the tin café")) == " the tin café"


def test_read_config_rejects_other_architectures() -> None:
    with pytest.raises(ValueError, match="architecture 'gemma'"):
        read_config({"general.architecture": "gemma"})
