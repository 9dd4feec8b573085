"""Decode attention over the paged KV cache as a Pallas kernel, for GPUs (Pallas' Triton lowering).

The contract is `lamina_jax.model.attention_kernel`'s (the native CPU kernel): one query per row
reads the first ``lengths[b]`` positions that row's block table names, where they lie in the pools
``[num_blocks, H_kv, block_size, d]``, with no gather into a new array. JAX's own
``pallas.ops.gpu.paged_attention`` wants the pools head-major (``[H_kv, pages, page, d]``), which
would mean a copy of the whole cache per layer and step, so this kernel reads Lamina's layout.

One program per row and KV head: its group of query heads (padded to ``MIN_ROWS``, the least a
Triton dot takes) walks the row's blocks ``BLOCKS_PER_STEP`` at a time, folding each step into a
running softmax, and stops at the row's length. Off a GPU the kernel runs in Pallas' interpreter,
which is how the tests check it against the JAX form (`lamina_jax.model.llama.jax_decode_attention`)
on the CPU; `usable` keeps the model on the JAX form or the CPU kernel there.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

MIN_ROWS = 16
"""Query heads per program, at least: Triton's dot takes no fewer rows."""
BLOCKS_PER_STEP = 8
"""Cache blocks read per loop step (128 keys at block size 16)."""
_POOL_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))
_MASKED = float(np.finfo(np.float32).min)


def _power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def usable(n_heads: int, pool: jax.Array) -> bool:
    """Whether the pools live on a GPU and the kernel takes their shape: Triton's blocks want a power of
    two for the head size (16 or more) and the block size."""
    n_kv_heads, block_size, head_dim = pool.shape[1], pool.shape[2], pool.shape[3]
    return (jax.default_backend() == "gpu" and pool.dtype in _POOL_DTYPES and n_heads % n_kv_heads == 0
            and _power_of_two(head_dim) and head_dim >= 16 and _power_of_two(block_size))


def _kernel(lengths_ref, q_ref, k_ref, v_ref, tables_ref, out_ref, *, block_size: int) -> None:  # noqa: ANN001
    """One row's group of query heads ``q_ref [G, d]`` over its KV head's blocks ``k_ref, v_ref [N, bs, d]``."""
    length = lengths_ref[0]
    q = q_ref[...]
    rows, head_dim = q.shape
    span = BLOCKS_PER_STEP * block_size

    def step(i: jax.Array, carry: tuple[jax.Array, jax.Array, jax.Array]) -> tuple[jax.Array, ...]:
        out, top, norm = carry
        blocks = tables_ref[pl.ds(i * BLOCKS_PER_STEP, BLOCKS_PER_STEP)]
        keys = k_ref[blocks].reshape(span, head_dim).astype(jnp.float32)
        values = v_ref[blocks].reshape(span, head_dim).astype(jnp.float32)
        scores = plgpu.dot(q, keys, trans_b=True, allow_tf32=False)  # [G, span], in full float32 as on the CPU
        seen = (i * span + jnp.arange(span))[None, :] < length
        scores = jnp.where(seen, scores, _MASKED)
        new_top = jnp.maximum(top, scores.max(axis=-1))
        probs = jnp.where(seen, jnp.exp(scores - new_top[:, None]), 0.0)
        rescale = jnp.exp(top - new_top)
        return (out * rescale[:, None] + plgpu.dot(probs, values, allow_tf32=False), new_top,
                norm * rescale + probs.sum(axis=-1))

    init = (jnp.zeros((rows, head_dim), jnp.float32), jnp.full((rows,), _MASKED, jnp.float32),
            jnp.zeros((rows,), jnp.float32))
    out, _, norm = lax.fori_loop(0, pl.cdiv(length, span), step, init)
    out_ref[...] = out / jnp.maximum(norm, np.finfo(np.float32).tiny)[:, None]


@functools.partial(jax.jit, static_argnames=("interpret",))
def _call(q: jax.Array, k_pool: jax.Array, v_pool: jax.Array, tables: jax.Array, lengths: jax.Array,
          interpret: bool) -> jax.Array:
    batch, n_heads, head_dim = q.shape
    num_blocks, n_kv_heads, block_size, _ = k_pool.shape
    group = n_heads // n_kv_heads
    rows = max(MIN_ROWS, -(-group // MIN_ROWS) * MIN_ROWS)
    grouped = (q.astype(jnp.float32) / math.sqrt(head_dim)).reshape(batch, n_kv_heads, group, head_dim)
    grouped = jnp.pad(grouped, ((0, 0), (0, 0), (0, rows - group), (0, 0)))
    width = tables.shape[1] + -tables.shape[1] % BLOCKS_PER_STEP
    tables = jnp.pad(tables.astype(jnp.int32), ((0, 0), (0, width - tables.shape[1])))  # block 0: read, masked
    pool_spec = pl.BlockSpec((num_blocks, None, block_size, head_dim), lambda b, h: (0, h, 0, 0))
    head_spec = pl.BlockSpec((None, None, rows, head_dim), lambda b, h: (b, h, 0, 0))
    out = pl.pallas_call(
        functools.partial(_kernel, block_size=block_size),
        grid=(batch, n_kv_heads),
        in_specs=[pl.BlockSpec((1,), lambda b, h: (b,)), head_spec, pool_spec, pool_spec,
                  pl.BlockSpec((None, width), lambda b, h: (b, 0))],
        out_specs=head_spec,
        out_shape=jax.ShapeDtypeStruct(grouped.shape, jnp.float32),
        interpret=interpret,
        compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=2),
        name="lamina_paged_decode_attention",
    )(lengths.astype(jnp.int32), grouped, k_pool, v_pool, tables)
    return out[:, :, :group].reshape(batch, n_heads, head_dim)


def decode_attention(q: jax.Array, k_pool: jax.Array, v_pool: jax.Array, tables: jax.Array,
                     lengths: jax.Array) -> jax.Array:
    """Attention of ``q [B, H, d]`` (one position per row) over the first ``lengths [B]`` positions of
    block tables ``tables [B, n]`` in pools ``[num_blocks, H_kv, block_size, d]``; a row of length 0
    gives zeros. Returns ``[B, H, d]`` float32. Compiled for the GPU there, interpreted elsewhere."""
    return _call(q, k_pool, v_pool, tables, lengths, interpret=jax.default_backend() != "gpu")
