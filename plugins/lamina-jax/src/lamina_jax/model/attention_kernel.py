"""Attention over the paged KV cache by a native CPU kernel (``csrc/paged_attention.cc``): each row,
one query position (a decoding sequence's, or a prompt token's), reads the positions its block
table names where they lie in the pools, with no gather into a new array, no loop of XLA
operations per chunk of blocks, and no keys of other sequences scored and masked. The JAX form
(`lamina_jax.model.llama._paged_attention`) serves where the kernel is not built, on other
backends, and for the quantized KV dtypes.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from lamina_jax.model import cpu_kernels

_POOL_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))
MAX_GROUP, MAX_HEAD_DIM, LANES = 16, 256, 16
"""Query heads per KV head, head size, and the multiple of it the kernel handles (see the source)."""


def usable(n_heads: int, pool: jax.Array) -> bool:
    """Whether the kernel is built here and handles ``n_heads`` query heads over pools like ``pool``."""
    n_kv_heads, head_dim = pool.shape[1], pool.shape[3]
    return (pool.dtype in _POOL_DTYPES and n_heads % n_kv_heads == 0 and n_heads // n_kv_heads <= MAX_GROUP
            and head_dim % LANES == 0 and head_dim <= MAX_HEAD_DIM and cpu_kernels.available())


def paged_attention(q: jax.Array, k_pool: jax.Array, v_pool: jax.Array, table: jax.Array, starts: jax.Array,
                    lengths: jax.Array) -> jax.Array:
    """Attention of ``q [B, H, d]`` (one position per row) over the first ``lengths [B]`` positions of
    each row's block table, which begins at ``starts [B]`` in ``table [n]``, in pools
    ``[num_blocks, H_kv, block_size, d]``; a row of length 0 gives zeros. Rows that read the same
    table should be next to each other (a prompt's tokens): the kernel reads each key once for them.
    Returns ``[B, H, d]`` float32."""
    cpu_kernels.require()
    scaled = q.astype(jnp.float32) / math.sqrt(q.shape[-1])
    return jax.ffi.ffi_call("lamina_paged_attention", jax.ShapeDtypeStruct(q.shape, jnp.float32))(
        scaled, k_pool, v_pool, table.astype(jnp.int32), starts.astype(jnp.int32), lengths.astype(jnp.int32))


def decode_attention(q: jax.Array, k_pool: jax.Array, v_pool: jax.Array, tables: jax.Array,
                     lengths: jax.Array) -> jax.Array:
    """`paged_attention` with a table per row, ``tables [B, n]``; lengths past a table's ``n`` blocks
    see only those."""
    rows, width = tables.shape
    return paged_attention(q, k_pool, v_pool, tables.reshape(-1), jnp.arange(rows) * width,
                           jnp.minimum(lengths, width * k_pool.shape[2]))
