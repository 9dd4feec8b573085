"""Paged decode attention by the Pallas kernels (`lamina_jax.model.pallas_attention`), the GPU one and
the TPU one, run by Pallas' interpreter on the CPU, against the JAX form they stand in for; and the
decoder with each against the decoder without. On a GPU or TPU (``scripts/device_check.sh``) that
backend's kernel is compiled, and matrix products run in full float32 (no TF32) so that the forms
can agree this closely."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lamina_jax.model import attention_kernel, llama, pallas_attention
from lamina_jax.testing import decode_steps, random_weights, tiny_config, to_params


def _pools(rng: np.random.Generator, blocks: int, kv_heads: int, block: int, dim: int, dtype: str):
    shape = (blocks, kv_heads, block, dim)
    return tuple(jnp.asarray(3 * rng.standard_normal(shape), dtype) for _ in range(2))


@pytest.mark.parametrize(("platform", "dtype", "heads", "kv_heads", "dim", "block", "width"), [
    ("gpu", "float32", 9, 3, 64, 16, 8), ("gpu", "bfloat16", 9, 3, 64, 16, 8), ("gpu", "float32", 8, 2, 32, 4, 5),
    ("gpu", "float32", 48, 2, 16, 8, 11),
    ("tpu", "float32", 9, 3, 64, 16, 8), ("tpu", "bfloat16", 9, 3, 64, 16, 8), ("tpu", "float32", 40, 2, 128, 32, 5),
])
def test_the_kernel_attends_as_the_jax_form(platform: str, dtype: str, heads: int, kv_heads: int, dim: int,
                                            block: int, width: int) -> None:
    """Rows of many lengths (0, within a block, across steps, a whole table) over scattered, shared
    blocks; groups of 3, 4, 20 and 24 query heads (padded to the backend's rows); tables whose width is
    no multiple of the blocks per step."""
    rng = np.random.default_rng(0)
    blocks = 40
    k_pool, v_pool = _pools(rng, blocks, kv_heads, block, dim, dtype)
    assert pallas_attention.takes(platform, heads, k_pool)
    lengths = np.array([1, block - 1, block + 3, 3 * block, width * block, 2, 0], np.int32)
    tables = jnp.asarray(rng.integers(0, blocks, (len(lengths), width)), jnp.int32)
    q = jnp.asarray(rng.standard_normal((len(lengths), heads, dim)), jnp.float32)
    with jax.default_matmul_precision("highest"):
        got = np.asarray(pallas_attention.decode_attention(q, k_pool, v_pool, tables, jnp.asarray(lengths),
                                                           platform=platform))
        want = np.asarray(llama.jax_decode_attention(q, (k_pool, v_pool, None, None), tables,
                                                     jnp.asarray(lengths) - 1))
    np.testing.assert_allclose(got[:-1], want[:-1], atol=2e-5, rtol=1e-5)
    assert not got[-1].any()  # a row of length 0 (a padding row) gives zeros


def test_each_kernel_is_for_its_backend_and_the_shapes_it_takes(monkeypatch: pytest.MonkeyPatch) -> None:
    pool = jnp.zeros((4, 3, 16, 64), jnp.float32)
    assert pallas_attention.usable(9, pool) == (jax.default_backend() in ("gpu", "tpu"))
    for backend in ("gpu", "tpu"):
        monkeypatch.setattr(jax, "default_backend", lambda backend=backend: backend)
        assert pallas_attention.usable(9, pool) and pallas_attention.usable(9, pool.astype(jnp.bfloat16))
        assert not pallas_attention.usable(9, pool.astype(jnp.int8))  # quantized KV: the JAX form dequantizes
        assert not pallas_attention.usable(8, pool)  # 8 query heads over 3 KV heads
        assert not pallas_attention.usable(9, jnp.zeros((4, 3, 12, 64)))  # a block no Triton block nor TPU tile
    assert not pallas_attention.takes("gpu", 9, jnp.zeros((4, 3, 16, 48)))  # head size no power of two
    assert pallas_attention.takes("tpu", 9, jnp.zeros((4, 3, 16, 48)))
    assert pallas_attention.takes("gpu", 9, jnp.zeros((4, 3, 8, 64)))
    assert not pallas_attention.takes("tpu", 9, jnp.zeros((4, 3, 8, 64)))  # half a tile of positions
    assert not pallas_attention.takes("cpu", 9, pool)


@pytest.mark.parametrize("platform", ["gpu", "tpu"])
@pytest.mark.parametrize("kv_dtype", ["float32", "bfloat16"])
@jax.default_matmul_precision("highest")
def test_decode_with_the_kernel_matches_decode_without_it(platform: str, kv_dtype: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiny decoder's batched decode steps (a padding row among them) give the same logits with
    the platform's Pallas kernel chosen, as on that backend, as with the JAX form."""
    config = tiny_config()
    params = to_params(random_weights(config, seed=0))
    monkeypatch.setattr(attention_kernel, "usable", lambda *_: False)
    monkeypatch.setattr(pallas_attention, "usable", lambda *_: False)  # the JAX form, on a GPU too
    jax.clear_caches()
    without, _ = decode_steps(config, params, kv_dtype=kv_dtype, steps=3)
    jax.clear_caches()  # decode is traced again, now with the kernel
    monkeypatch.setattr(pallas_attention, "usable", lambda *_: True)
    called = []
    kernel = pallas_attention.decode_attention
    monkeypatch.setattr(pallas_attention, "decode_attention",
                        lambda *a: called.append(1) or kernel(*a, platform=platform))
    with_kernel, _ = decode_steps(config, params, kv_dtype=kv_dtype, steps=3)
    assert called
    for a, b in zip(with_kernel, without, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-4, rtol=0)
