"""Paged attention by the native CPU kernel (`lamina_jax.model.attention_kernel`) against the JAX
form it replaces, for decoding rows and for prompt tokens, and the decoder with it against the
decoder without it.

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
@pytest.mark.parametrize(("heads", "kv_heads"), [(9, 3), (4, 4), (16, 2)])
def test_prompt_tokens_sharing_a_table_attend_as_the_jax_form(heads: int, kv_heads: int) -> None:
    """A packed prefill's rows: 23 tokens of one sequence from position 10, 7 of another from 0, and
    padding rows of length 0 (pointing at the first table, as `prefill_packed` makes them). The
    kernel takes rows with the same table together, as many as fill its 16 query heads."""
    rng = np.random.default_rng(3)
    blocks, block, dim = 30, 4, 32
    k_pool, v_pool = _pools(rng, blocks, kv_heads, block, dim, "float32")
    tables = [rng.permutation(blocks)[:9], rng.permutation(blocks)[:2]]
    flat = np.concatenate([*tables, [blocks + 1] * 3]).astype(np.int32)  # padding entries: never read
    starts = np.array([0] * 23 + [9] * 7 + [0] * 3, np.int32)
    lengths = np.array([*range(11, 34), *range(1, 8), 0, 0, 0], np.int32)
    q = jnp.asarray(rng.standard_normal((len(lengths), heads, dim)), jnp.float32)
    got = jax.jit(attention_kernel.paged_attention)(q, k_pool, v_pool, jnp.asarray(flat), jnp.asarray(starts),
                                                    jnp.asarray(lengths))
    per_row = np.stack([np.resize(flat[start:start + 9], 9) for start in starts])
    safe = jnp.asarray(np.where(per_row < blocks, per_row, 0))
    want = llama.jax_decode_attention(q, (k_pool, v_pool, None, None), safe, jnp.asarray(lengths) - 1)
    real = lengths > 0
    np.testing.assert_allclose(np.asarray(got)[real], np.asarray(want)[real], atol=2e-5, rtol=1e-5)
    assert not np.asarray(got)[~real].any()


@built
def test_a_row_of_length_zero_gives_zeros_and_reads_outside_the_pool_or_table_are_refused() -> None:
    rng = np.random.default_rng(1)
    k_pool, v_pool = _pools(rng, 4, 2, 16, 32, "float32")
    q = jnp.asarray(rng.standard_normal((2, 4, 32)), jnp.float32)
    tables = jnp.asarray([[0, 1], [2, 3]], jnp.int32)
    out = attention_kernel.decode_attention(q, k_pool, v_pool, tables, jnp.asarray([0, 20], jnp.int32))
    assert not np.asarray(out[0]).any() and np.asarray(out[1]).any()
    with pytest.raises(Exception, match="outside the pool"):
        attention_kernel.decode_attention(q, k_pool, v_pool, jnp.asarray([[0, 1], [2, 9]], jnp.int32),
                                          jnp.asarray([5, 20], jnp.int32)).block_until_ready()
    with pytest.raises(Exception, match="outside the table"):  # a row's table running past the flat one
        attention_kernel.paged_attention(q, k_pool, v_pool, jnp.asarray([0, 1, 2], jnp.int32),
                                         jnp.asarray([0, 2], jnp.int32), jnp.asarray([5, 20], jnp.int32),
                                         ).block_until_ready()


@built
@pytest.mark.parametrize("kv_dtype", ["float32", "bfloat16"])
def test_prefill_and_decode_with_the_kernel_match_them_without_it(kv_dtype: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiny decoder's prefills and batched decode steps (a padding row among them) give the same
    logits and cache with the kernel as with the JAX form."""
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


@built
def test_packed_prefill_with_the_kernel_matches_it_without(monkeypatch: pytest.MonkeyPatch) -> None:
    """Three prompt chunks in one `prefill_packed` call (one after a cached prefix), then padding:
    the same logits and cache with the kernel as with the JAX form."""
    config = tiny_config()
    params = to_params(random_weights(config, seed=1))
    rng = np.random.default_rng(4)
    cache = llama.init_cache(config, num_blocks=16, block_size=4)
    prefix = rng.integers(0, config.vocab_size, 8)
    cache = llama.prefill(params, cache, jnp.asarray(prefix, jnp.int32), 8, jnp.asarray([3, 4, 5, 6]), 0,
                          config=config)[1]
    chunks = [(0, 9, [0, 1, 2]), (8, 6, [3, 4, 5, 6]), (0, 3, [7])]  # (start, tokens, blocks)
    tokens = jnp.asarray(rng.integers(0, config.vocab_size, 32), jnp.int32)
    positions = np.zeros(32, np.int32)
    rows = np.full(32, -1, np.int32)
    at = 0
    for row, (start, n, _) in enumerate(chunks):
        positions[at:at + n], rows[at:at + n] = range(start, start + n), row
        at += n
    table = np.zeros(16, np.int32)
    table_rows = np.full(16, -1, np.int32)
    flat = [b for _, _, owned in chunks for b in owned]
    table[:len(flat)] = flat
    table_rows[:len(flat)] = [row for row, (_, _, owned) in enumerate(chunks) for _ in owned]
    args = (tokens, jnp.asarray(positions), jnp.asarray(rows), jnp.asarray(table), jnp.asarray(table_rows),
            jnp.asarray([0, 3, 7, 0], jnp.int32), jnp.asarray([8, 14, 17, 0], jnp.int32))

    def run() -> tuple[np.ndarray, llama.KVCache]:
        start = jax.tree.map(jnp.copy, cache)  # the call donates its cache
        logits, after = llama.prefill_packed(params, start, *args, config=config)
        return np.asarray(logits[:3]), after

    with_kernel, kernel_cache = run()
    jax.clear_caches()  # traced again, now without the kernel
    monkeypatch.setattr(attention_kernel, "usable", lambda *_: False)
    without, jax_cache = run()
    np.testing.assert_allclose(with_kernel, without, atol=1e-4, rtol=0)
    for layer in range(config.n_layers):
        np.testing.assert_allclose(np.asarray(kernel_cache.k[layer]), np.asarray(jax_cache.k[layer]), atol=1e-4)
