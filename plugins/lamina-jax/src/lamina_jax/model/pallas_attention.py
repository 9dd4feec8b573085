"""Decode attention over the paged KV cache as Pallas kernels: one for GPUs (Pallas' Triton
lowering), one for TPUs (Mosaic).

The contract is `lamina_jax.model.attention_kernel.decode_attention`'s (the native CPU kernel's):
one query per row reads the first ``lengths[b]`` positions that row's block table names, where
they lie in the pools ``[num_blocks, H_kv, block_size, d]``, with no gather into a new array. JAX's own paged-attention
kernels want the pools head-major (``[H_kv, pages, page, d]``), which would mean a copy of the
whole cache per layer and step, so these read Lamina's layout.

One program per row and KV head: its group of query heads (padded to the rows the backend's matrix
unit takes) walks the row's blocks ``BLOCKS_PER_STEP`` at a time, folding each step into a running
softmax, and stops at the row's length. On a GPU the program gathers the blocks from the pools; on
a TPU it copies them (DMA) from HBM into VMEM, the block tables and lengths prefetched as scalars.
Off its backend a kernel runs in Pallas' interpreter, which is how the tests check both against
the JAX form (`lamina_jax.model.llama.jax_decode_attention`) on the CPU; `usable` keeps the model
on the JAX form or the CPU kernel there.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

# Pallas and its Triton and Mosaic front ends are imported where a kernel is built, not here: they
# take about 0.4 s to import, and every process that loads the model would pay it, on the CPU too.

BLOCKS_PER_STEP = 8
"""Cache blocks read per loop step (128 keys at block size 16)."""
_POOL_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))
_MASKED = float(np.finfo(np.float32).min)
_Carry = tuple[jax.Array, jax.Array, jax.Array]
"""A running softmax: weighted sum ``[G, d]``, max and normaliser ``[G, 1]``."""


def _power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _rows(platform: str, group: int) -> int:
    """Query rows per program for ``group`` query heads: on a GPU a power of two of 16 or more (Triton
    loads powers of two, and its dot takes no fewer rows); on a TPU a whole sublane tile of 8."""
    return max(16, 1 << (group - 1).bit_length()) if platform == "gpu" else -(-group // 8) * 8


def takes(platform: str, n_heads: int, pool: jax.Array) -> bool:
    """Whether the ``platform`` kernel takes ``n_heads`` query heads over pools like ``pool``: float32
    or bfloat16; on a GPU a head size and block size Triton's blocks allow (powers of two, the head
    16 or more); on a TPU blocks of a multiple of 16 positions (whole tiles of either dtype)."""
    n_kv_heads, block_size, head_dim = pool.shape[1], pool.shape[2], pool.shape[3]
    if pool.dtype not in _POOL_DTYPES or n_heads % n_kv_heads:
        return False
    if platform == "gpu":
        return _power_of_two(head_dim) and head_dim >= 16 and _power_of_two(block_size)
    return platform == "tpu" and block_size % 16 == 0


def usable(n_heads: int, pool: jax.Array) -> bool:
    """Whether JAX runs on a GPU or TPU here and its kernel takes the pools (`takes`)."""
    return takes(jax.default_backend(), n_heads, pool)


def _gpu_kernel(lengths_ref, q_ref, k_ref, v_ref, tables_ref, out_ref, *, block_size: int) -> None:  # noqa: ANN001
    """One row's group of query heads ``q_ref [G, d]`` over its KV head's blocks ``k_ref, v_ref [N, bs, d]``."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu

    length = lengths_ref[0]
    q = q_ref[...]
    span = BLOCKS_PER_STEP * block_size

    def step(i: jax.Array, carry: _Carry) -> _Carry:
        blocks = tables_ref[pl.ds(i * BLOCKS_PER_STEP, BLOCKS_PER_STEP)]
        keys = k_ref[blocks].reshape(span, q.shape[1]).astype(jnp.float32)
        values = v_ref[blocks].reshape(span, q.shape[1]).astype(jnp.float32)
        scores = plgpu.dot(q, keys, trans_b=True, allow_tf32=False)  # [G, span], in full float32 as on the CPU
        return _fold(carry, scores, (i * span + jnp.arange(span))[None, :] < length,
                     lambda probs: plgpu.dot(probs, values, allow_tf32=False))

    out_ref[...] = _softmax_loop(q.shape, (length + span - 1) // span, step)


def _tpu_kernel(lengths_ref, tables_ref, q_ref, k_hbm, v_hbm, out_ref, k_buf, v_buf, copied, *,  # noqa: ANN001
                width: int, block_size: int) -> None:
    """One row's group of query heads ``q_ref [G, d]``; each step copies its KV head's blocks from
    the pools in HBM into ``k_buf, v_buf [BLOCKS_PER_STEP, bs, d]``."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    row, head = pl.program_id(0), pl.program_id(1)
    length = lengths_ref[row]
    q = q_ref[...]
    span = BLOCKS_PER_STEP * block_size

    def step(i: jax.Array, carry: _Carry) -> _Carry:
        copies = []
        for j in range(BLOCKS_PER_STEP):
            block = tables_ref[row * width + i * BLOCKS_PER_STEP + j]
            copies += [pltpu.make_async_copy(k_hbm.at[block, head], k_buf.at[j], copied.at[0, j]),
                       pltpu.make_async_copy(v_hbm.at[block, head], v_buf.at[j], copied.at[1, j])]
        for copy in copies:
            copy.start()
        for copy in copies:
            copy.wait()
        keys = k_buf[...].reshape(span, q.shape[1]).astype(jnp.float32)
        values = v_buf[...].reshape(span, q.shape[1]).astype(jnp.float32)
        scores = lax.dot_general(q, keys, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
        seen = i * span + lax.broadcasted_iota(jnp.int32, scores.shape, 1) < length
        return _fold(carry, scores, seen, lambda probs: jnp.dot(probs, values, preferred_element_type=jnp.float32))

    out_ref[...] = _softmax_loop(q.shape, (length + span - 1) // span, step)


def _fold(carry: _Carry, scores: jax.Array, seen: jax.Array, weigh: Callable[[jax.Array], jax.Array]) -> _Carry:
    """``carry`` with one step's ``scores [G, span]`` folded in where ``seen``; ``weigh(probs)`` is
    ``probs @ values``."""
    out, top, norm = carry
    scores = jnp.where(seen, scores, _MASKED)
    new_top = jnp.maximum(top, scores.max(axis=-1, keepdims=True))
    probs = jnp.where(seen, jnp.exp(scores - new_top), 0.0)
    rescale = jnp.exp(top - new_top)
    return out * rescale + weigh(probs), new_top, norm * rescale + probs.sum(axis=-1, keepdims=True)


def _softmax_loop(shape: tuple[int, ...], steps: jax.Array, step: Callable[[jax.Array, _Carry], _Carry]) -> jax.Array:
    """The attention of ``steps`` steps of ``step`` from an empty running softmax; zeros for none."""
    rows, head_dim = shape
    init = (jnp.zeros((rows, head_dim), jnp.float32), jnp.full((rows, 1), _MASKED, jnp.float32),
            jnp.zeros((rows, 1), jnp.float32))
    out, _, norm = lax.fori_loop(0, steps, step, init)
    return out / jnp.maximum(norm, np.finfo(np.float32).tiny)


@functools.partial(jax.jit, static_argnames=("platform", "interpret"))
def _call(q: jax.Array, k_pool: jax.Array, v_pool: jax.Array, tables: jax.Array, lengths: jax.Array,
          platform: str, interpret: bool) -> jax.Array:
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu
    from jax.experimental.pallas import triton as plgpu

    batch, n_heads, head_dim = q.shape
    num_blocks, n_kv_heads, block_size, _ = k_pool.shape
    group = n_heads // n_kv_heads
    rows = _rows(platform, group)
    grouped = (q.astype(jnp.float32) / math.sqrt(head_dim)).reshape(batch, n_kv_heads, group, head_dim)
    grouped = jnp.pad(grouped, ((0, 0), (0, 0), (0, rows - group), (0, 0)))
    width = tables.shape[1] + -tables.shape[1] % BLOCKS_PER_STEP
    tables = jnp.pad(tables.astype(jnp.int32), ((0, 0), (0, width - tables.shape[1])))  # block 0: read, masked
    lengths = lengths.astype(jnp.int32)
    out_shape = jax.ShapeDtypeStruct(grouped.shape, jnp.float32)
    if platform == "tpu":
        head_spec = pl.BlockSpec((None, None, rows, head_dim), lambda b, h, *_: (b, h, 0, 0))
        pools_spec = pl.BlockSpec(memory_space=pl.ANY)  # left in HBM: the kernel copies what it reads
        buffer = (BLOCKS_PER_STEP, block_size, head_dim)
        out = pl.pallas_call(
            functools.partial(_tpu_kernel, width=width, block_size=block_size),
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=2, grid=(batch, n_kv_heads), in_specs=[head_spec, pools_spec, pools_spec],
                out_specs=head_spec,
                scratch_shapes=[pltpu.VMEM(buffer, k_pool.dtype), pltpu.VMEM(buffer, v_pool.dtype),
                                pltpu.SemaphoreType.DMA((2, BLOCKS_PER_STEP))]),
            out_shape=out_shape, interpret=pltpu.InterpretParams() if interpret else False,
            compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
            name="lamina_paged_decode_attention",
        )(lengths, tables.reshape(-1), grouped, k_pool, v_pool)
    else:
        head_spec = pl.BlockSpec((None, None, rows, head_dim), lambda b, h: (b, h, 0, 0))
        pool_spec = pl.BlockSpec((num_blocks, None, block_size, head_dim), lambda b, h: (0, h, 0, 0))
        out = pl.pallas_call(
            functools.partial(_gpu_kernel, block_size=block_size),
            grid=(batch, n_kv_heads),
            in_specs=[pl.BlockSpec((1,), lambda b, h: (b,)), head_spec, pool_spec, pool_spec,
                      pl.BlockSpec((None, width), lambda b, h: (b, 0))],
            out_specs=head_spec, out_shape=out_shape, interpret=interpret,
            compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=2),
            name="lamina_paged_decode_attention",
        )(lengths, grouped, k_pool, v_pool, tables)
    return out[:, :, :group].reshape(batch, n_heads, head_dim)


def decode_attention(q: jax.Array, k_pool: jax.Array, v_pool: jax.Array, tables: jax.Array,
                     lengths: jax.Array, *, platform: str | None = None) -> jax.Array:
    """Attention of ``q [B, H, d]`` (one position per row) over the first ``lengths [B]`` positions of
    block tables ``tables [B, n]`` in pools ``[num_blocks, H_kv, block_size, d]``; a row of length 0
    gives zeros. Returns ``[B, H, d]`` float32. ``platform`` (default: JAX's backend) picks the TPU
    kernel for ``"tpu"``, else the GPU one; compiled on its own backend, interpreted elsewhere."""
    backend = jax.default_backend()
    platform = "tpu" if (platform or backend) == "tpu" else "gpu"
    return _call(q, k_pool, v_pool, tables, lengths, platform=platform, interpret=backend != platform)
