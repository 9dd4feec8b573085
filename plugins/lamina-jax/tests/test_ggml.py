"""The ggml matmul kernel (`lamina_jax.model.ggml`) and the ``q4_1`` weight formats built on it.

The kernel is native code built per machine by ``scripts/kernels/build_cpu_kernels.sh``; these
tests skip where it is not built, except where ``LAMINA_REQUIRE_CPU_KERNELS=1`` says it must be
(the tox ``ggml`` env builds it first and sets that).
"""

from __future__ import annotations

import attrs
import gguf
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lamina_jax.model import cpu_kernels, ggml
from lamina_jax.testing import cpu_kernels_absent

built = pytest.mark.skipif(cpu_kernels_absent(), reason="the ggml matmul kernel is not built here")


@built
def test_the_kernel_is_built_where_it_is_required() -> None:
    assert cpu_kernels.available(), "LAMINA_REQUIRE_CPU_KERNELS=1 but the kernels are not built for this machine"


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


@built
@pytest.mark.parametrize("kind", ["q4_1", "q8_0"])
def test_float32_activations_give_the_products_of_the_matrix_the_blocks_hold(kind: str) -> None:
    """Unrounded activations: the products equal float64 ones with the decoded matrix to float32
    rounding, for every size of row tile, more than one tile of rows, weight rows that leave a
    partial tile of them (70) and an odd number of blocks per row (96 weights)."""
    rng = np.random.default_rng(1)
    w = ggml.quantize(rng.standard_normal((70, 96)).astype(np.float32), kind)
    decoded = _dequantized(w).astype(np.float64)
    product = jax.jit(lambda a: ggml.matmul(a, w, float32_activations=True))
    for rows in (1, 2, 3, 4, 5, 6, 7, 8, 9, 17):
        x = rng.standard_normal((rows, 96)).astype(np.float32)
        want = x @ decoded.T
        error = np.abs(np.asarray(product(jnp.asarray(x))) - want).max() / np.abs(want).max()
        rounded = np.abs(np.asarray(ggml.matmul(jnp.asarray(x), w)) - want).max() / np.abs(want).max()
        assert error < 1e-6 < rounded, (rows, error, rounded)


@built
def test_only_matrices_of_block_values_are_lossless() -> None:
    rng = np.random.default_rng(2)
    w = ggml.quantize(rng.standard_normal((8, 64)).astype(np.float32), "q4_1")
    np.testing.assert_array_equal(ggml.dequantize(w), _dequantized(w))
    assert ggml.lossless(_dequantized(w), "q4_1")
    assert not ggml.lossless(rng.standard_normal((8, 64)).astype(np.float32), "q4_1")
    assert not ggml.lossless(np.ones((8, 48), np.float32), "q4_1"), "rows that do not split into blocks"


@built
def test_auto_times_q4_1_f32_only_for_weights_held_exactly_in_blocks() -> None:
    """A GGUF's Q4_1 matrices and Q8_0 head are served exactly by ``q4_1-f32``, so ``auto`` may pick
    it; random float32 weights are not, so it is left out."""
    from lamina_jax import weight_formats
    from lamina_jax.testing import random_weights, tiny_config, to_params

    params = to_params(random_weights(tiny_config(), seed=0))
    assert "q4_1-f32" not in weight_formats.auto(params) and "q4_1-f32" in weight_formats.usable(params)
    in_blocks = weight_formats.cast(params, "q4_1")
    exact = jax.tree.map(lambda w: jnp.asarray(ggml.dequantize(w)) if isinstance(w, ggml.GgmlWeight) else w,
                         in_blocks, is_leaf=lambda w: isinstance(w, ggml.GgmlWeight))
    exact = attrs.evolve(exact, embed=exact.lm_head, lm_head=None)  # tied, as in the SmolLM2 GGUF
    assert weight_formats.exact_in_blocks(exact) and "q4_1-f32" in weight_formats.auto(exact)
