"""The ggml matmul kernel (`lamina_jax.model.ggml`) and the ``q4_1`` weight format built on it.

The kernel is native code built per machine by ``scripts/kernels/build_ggml_matmul.sh``; these
tests skip where it is not built, except where ``LAMINA_REQUIRE_GGML_MATMUL=1`` says it must be
(the tox ``ggml`` env builds it first and sets that).
"""

from __future__ import annotations

import gguf
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lamina_jax.model import ggml
from lamina_jax.testing import ggml_matmul_absent

built = pytest.mark.skipif(ggml_matmul_absent(), reason="the ggml matmul kernel is not built here")


@built
def test_the_kernel_is_built_where_it_is_required() -> None:
    assert ggml.available(), "LAMINA_REQUIRE_GGML_MATMUL=1 but the kernel is not built for this machine"


def _dequantized(w: ggml.GgmlWeight) -> np.ndarray:
    """The float32 matrix of ``w``'s blocks, decoded by gguf-py (an implementation independent of ggml's)."""
    return gguf.quants.dequantize(np.asarray(w.blocks), gguf.GGMLQuantizationType(ggml.TYPES[w.kind]))


@built
@pytest.mark.parametrize("kind", ["q4_1", "q8_0"])
def test_products_match_the_dequantized_matrix(kind: str) -> None:
    """``x @ w.T`` over blocks equals the product with the decoded matrix, up to the 8-bit rounding of
    ``x`` (the kernel's dot format); rows that do not fill a slice of work and a 3-D ``x`` included."""
    rng = np.random.default_rng(0)
    w = ggml.quantize(rng.standard_normal((100, 96)).astype(np.float32), kind)
    assert w.shape == (100, 96) and w.blocks.dtype == jnp.uint8
    x = rng.standard_normal((2, 3, 96)).astype(np.float32)
    got = np.asarray(jax.jit(ggml.matmul)(jnp.asarray(x), w))
    want = x @ _dequantized(w).T
    assert got.shape == (2, 3, 100)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 0.01
    # the quantizer is ggml's: decoding and re-quantizing returns the same blocks, so a GGUF's own
    # Q4_1 or Q8_0 matrices are served unchanged
    assert np.array_equal(np.asarray(ggml.quantize(_dequantized(w), kind).blocks), np.asarray(w.blocks))


@built
def test_rows_that_do_not_split_into_blocks_are_refused() -> None:
    with pytest.raises(ValueError, match="multiple of 32"):
        ggml.quantize(np.ones((4, 48), np.float32), "q4_1")
