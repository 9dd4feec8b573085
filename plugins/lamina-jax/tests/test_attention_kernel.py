"""Paged decode attention by the native CPU kernel (`lamina_jax.model.attention_kernel`) against the
JAX form it replaces, and the decoder with it against the decoder without it.

The kernel is native code built per machine by ``scripts/kernels/build_cpu_kernels.sh``; these
tests skip where it is not built, except where ``LAMINA_REQUIRE_CPU_KERNELS=1`` says it must be
(the tox ``ggml`` env builds it first and sets that).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lamina_jax.model import attention_kernel, llama
from lamina_jax.testing import cpu_kernels_absent, decode_steps, random_weights, tiny_config, to_params

built = pytest.mark.skipif(cpu_kernels_absent(), reason="the CPU kernels are not built here")


def _pools(rng: np.random.Generator, blocks: int, kv_heads: int, block: int, dim: int, dtype: str):
    shape = (blocks, kv_heads, block, dim)
    return tuple(jnp.asarray(3 * rng.standard_normal(shape), dtype) for _ in range(2))


@built
@pytest.mark.parametrize(("dtype", "heads", "kv_heads", "dim", "block"),
                         [("float32", 9, 3, 64, 16), ("bfloat16", 9, 3, 64, 16), ("float32", 8, 2, 32, 4),
                          ("float32", 4, 4, 128, 32)])
def test_the_kernel_attends_as_the_jax_form(dtype: str, heads: int, kv_heads: int, dim: int, block: int) -> None:
    """Rows of many lengths (one within a block, some across many, one a whole table) over scattered,
    shared blocks; table entries past a row's length name blocks outside the pool and are not read."""
    rng = np.random.default_rng(0)
    blocks, width = 40, 8
    k_pool, v_pool = _pools(rng, blocks, kv_heads, block, dim, dtype)
    lengths = np.array([1, block - 1, block + 3, 3 * block, 5 * block + 7, width * block, 2], np.int32)
    tables = rng.integers(0, blocks, (len(lengths), width)).astype(np.int32)
    for row, length in enumerate(lengths):
        tables[row, -(-length // block):] = blocks + 5  # outside the pool
    q = jnp.asarray(rng.standard_normal((len(lengths), heads, dim)), jnp.float32)
    got = jax.jit(attention_kernel.decode_attention)(q, k_pool, v_pool, jnp.asarray(tables), jnp.asarray(lengths))
    safe = np.where(tables < blocks, tables, 0)
    want = llama.jax_decode_attention(q, (k_pool, v_pool, None, None), jnp.asarray(safe), jnp.asarray(lengths) - 1)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-5, rtol=1e-5)


@built
def test_a_row_of_length_zero_gives_zeros_and_a_block_outside_the_pool_is_refused() -> None:
    rng = np.random.default_rng(1)
    k_pool, v_pool = _pools(rng, 4, 2, 16, 32, "float32")
    q = jnp.asarray(rng.standard_normal((2, 4, 32)), jnp.float32)
    tables = jnp.asarray([[0, 1], [2, 3]], jnp.int32)
    out = attention_kernel.decode_attention(q, k_pool, v_pool, tables, jnp.asarray([0, 20], jnp.int32))
    assert not np.asarray(out[0]).any() and np.asarray(out[1]).any()
    with pytest.raises(Exception, match="outside the pool"):
        attention_kernel.decode_attention(q, k_pool, v_pool, jnp.asarray([[0, 1], [2, 9]], jnp.int32),
                                          jnp.asarray([5, 20], jnp.int32)).block_until_ready()


@built
@pytest.mark.parametrize("kv_dtype", ["float32", "bfloat16"])
def test_decode_with_the_kernel_matches_decode_without_it(kv_dtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiny decoder's batched decode steps (a padding row among them) give the same logits and
    cache with the kernel as with the JAX form."""
    config = tiny_config()
    params = to_params(random_weights(config, seed=0))
    assert attention_kernel.usable(config.n_heads, llama.init_cache(config, num_blocks=1, block_size=4,
                                                                      dtype=kv_dtype).k[0])
    with_kernel, kernel_cache = decode_steps(config, params, kv_dtype=kv_dtype, steps=4)
    jax.clear_caches()  # decode is traced again, now without the kernel
    monkeypatch.setattr(attention_kernel, "usable", lambda *_: False)
    without, jax_cache = decode_steps(config, params, kv_dtype=kv_dtype, steps=4)
    for a, b in zip(with_kernel, without, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-4, rtol=0)
    for layer in range(config.n_layers):
        np.testing.assert_allclose(np.asarray(kernel_cache.k[layer], np.float32),
                                   np.asarray(jax_cache.k[layer], np.float32), atol=1e-4, rtol=0)
