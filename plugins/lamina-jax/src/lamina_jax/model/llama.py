"""A Llama-family decoder in plain JAX with a paged KV cache for continuous batching.

Conventions:

- Linear weights keep the GGUF (and PyTorch) layout ``[out_features, in_features]``: ``y = x @ w.T``.
  They may be float32, bfloat16, `Int8Weight` or `GgmlWeight` (see `linear`); activations are float32. The KV cache is stored as float32,
  bfloat16, int8 or fp8 e4m3 (the last two with a float32 scale per token and head, absmax / qmax),
  quantized on write and dequantized to float32 after the gather, inside attention.
- Q and K weights are in Hugging Face row order (the GGUF loader undoes llama.cpp's permutation), so
  RoPE is the NeoX half-split form: dimensions ``i`` and ``i + head_dim // 2`` rotate together.
- The KV cache is paged: per layer one K and one V buffer ``[num_blocks, n_kv_heads, block_size,
  head_dim]`` (heads before positions, so attention's products need no transpose of the keys). A sequence owns a list of blocks (its *block table*); position ``p`` lives in block
  ``table[p // block_size]`` at offset ``p % block_size``. Blocks can be shared by sequences with a
  common prefix. ``prefill``, ``prefill_packed`` and ``decode`` donate the cache, so XLA updates it
  in place; layers are unrolled in Python rather than run under ``lax.scan``, which would copy the
  buffers every step.
- Attention loops over only the blocks a sequence uses (`_paged_attention`), so block tables may be
  padded to the most a sequence can need: their width costs nothing and shapes stay few. Padding
  entries may name any block: positions past a sequence's length are masked.
- Writes aimed at block ``num_blocks`` (one past the end) are dropped: padded prompt tokens and the
  padding rows of a decode batch (``position = -1``) write nothing. Block bookkeeping (which blocks a
  sequence owns) belongs to the host-side engine.
"""

import functools
import math
from collections.abc import Callable
from typing import Literal, TypeVar

import attrs
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from lamina_jax.model import attention_kernel, ggml, pallas_attention, rope
from lamina_jax.model.config import LlamaConfig
from lamina_jax.model.ggml import GgmlWeight

_C = TypeVar("_C", bound=type)
_MASKED = float(np.finfo(np.float32).min)  # finite, so a row with every key masked gives no NaN


def _pytree(cls: _C) -> _C:
    """Register an attrs class as a JAX pytree whose fields are all children."""
    fields = [field.name for field in attrs.fields(cls)]
    return jax.tree_util.register_dataclass(cls, data_fields=fields, meta_fields=[])


@_pytree
@attrs.frozen
class Int8Weight:
    """A matrix ``[out, in]`` held as int8 with a float32 scale per output row and one per input
    column: ``q * row[:, None] * col[None, :]`` is its value."""

    q: jax.Array
    row: jax.Array
    col: jax.Array

    @property
    def shape(self) -> tuple[int, ...]:
        return self.q.shape


INT8_BALANCING_ROUNDS = 3


def quantize_int8(w: jax.Array) -> Int8Weight:
    """``w [out, in]`` rounded to int8, symmetric, after balancing the absmax of its rows and columns.

    A scale per row alone lets a few large columns set every row's step; dividing the columns by
    a scale first (folded into the activations in `linear`, SmoothQuant-style) evens them out.
    Each balancing round moves the column scales halfway (geometrically) to the columns' absmax
    once rows are normalized. On SmolLM2-135M this halves the perplexity cost of a row scale alone
    (see ``benchmarks/weights_dtype.py``)."""
    w = w.astype(jnp.float32)

    def nonzero(a: jax.Array) -> jax.Array:
        return jnp.where(a > 0, a, 1.0)

    col = jnp.ones(w.shape[1], jnp.float32)
    for _ in range(INT8_BALANCING_ROUNDS):
        row = nonzero(jnp.max(jnp.abs(w / col), axis=1))
        col = jnp.sqrt(col * nonzero(jnp.max(jnp.abs(w / row[:, None]), axis=0)))
    row = nonzero(jnp.max(jnp.abs(w / col), axis=1)) / 127.0
    q = jnp.clip(jnp.round(w / col / row[:, None]), -127, 127)
    return Int8Weight(q.astype(jnp.int8), row, col)


Weight = jax.Array | Int8Weight | GgmlWeight


@_pytree
@attrs.frozen(kw_only=True)
class LayerParams:
    """Weights of one decoder block. The optional ones are what some families add: biases of the
    Q, K and V projections (Qwen2) and an RMS norm of each query and key head (Qwen3)."""

    attn_norm: jax.Array  # [dim]
    wq: Weight  # [n_heads * head_dim, dim]
    wk: Weight  # [n_kv_heads * head_dim, dim]
    wv: Weight  # [n_kv_heads * head_dim, dim]
    wo: Weight  # [dim, n_heads * head_dim]
    ffn_norm: jax.Array  # [dim]
    w_gate: Weight  # [ffn_dim, dim]
    w_up: Weight  # [ffn_dim, dim]
    w_down: Weight  # [dim, ffn_dim]
    bq: jax.Array | None = None  # [n_heads * head_dim]
    bk: jax.Array | None = None  # [n_kv_heads * head_dim]
    bv: jax.Array | None = None  # [n_kv_heads * head_dim]
    q_norm: jax.Array | None = None  # [head_dim]
    k_norm: jax.Array | None = None  # [head_dim]


@_pytree
@attrs.frozen(kw_only=True)
class LlamaParams:
    """All weights of the decoder; ``lm_head`` is ``None`` when the output head is the tied embedding."""

    embed: Weight  # [vocab_size, dim]
    layers: tuple[LayerParams, ...]
    norm: jax.Array  # [dim]
    lm_head: Weight | None  # [vocab_size, dim]

    @property
    def head(self) -> Weight:
        """The output head: ``lm_head``, or the tied embedding."""
        return self.embed if self.lm_head is None else self.lm_head


KVDtype = Literal["float32", "bfloat16", "int8", "fp8"]
"""Storage dtype of the KV cache: ``int8`` and ``fp8`` (e4m3) keep a float32 scale per token and head."""

_STORAGE = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "int8": jnp.int8, "fp8": jnp.float8_e4m3fn}
_QMAX = {jnp.dtype(jnp.int8): 127.0, jnp.dtype(jnp.float8_e4m3fn): 448.0}


def kv_bytes_per_position(config: LlamaConfig, dtype: KVDtype = "float32") -> int:
    """Bytes of K and V (and their scales) for one position in all layers."""
    per_head = config.head_dim * jnp.dtype(_STORAGE[dtype]).itemsize
    if jnp.dtype(_STORAGE[dtype]) in _QMAX:
        per_head += 4  # the float32 scale
    return 2 * config.n_layers * config.n_kv_heads * per_head


@_pytree
@attrs.frozen(kw_only=True)
class KVCache:
    """Per-layer K and V block pools, each ``[num_blocks, n_kv_heads, block_size, head_dim]``.

    The pools' dtype is the storage dtype. For the quantized ones (int8, fp8) ``k_scale`` and
    ``v_scale`` hold per-layer float32 scales ``[num_blocks, n_kv_heads, block_size]``: a stored
    vector times its scale is the value; otherwise they are ``None``.
    """

    k: tuple[jax.Array, ...]
    v: tuple[jax.Array, ...]
    k_scale: tuple[jax.Array, ...] | None = None
    v_scale: tuple[jax.Array, ...] | None = None

    @property
    def num_blocks(self) -> int:
        return self.k[0].shape[0]

    @property
    def block_size(self) -> int:
        return self.k[0].shape[2]


def init_cache(config: LlamaConfig, *, num_blocks: int, block_size: int, dtype: KVDtype = "float32") -> KVCache:
    """Allocate a zeroed pool of ``num_blocks`` blocks of ``block_size`` positions, stored as ``dtype``."""
    storage = _STORAGE[dtype]
    shape = (num_blocks, config.n_kv_heads, block_size, config.head_dim)

    def pools(shape: tuple[int, ...], dtype: object) -> tuple[jax.Array, ...]:
        return tuple(jnp.zeros(shape, dtype) for _ in range(config.n_layers))

    scaled = jnp.dtype(storage) in _QMAX
    return KVCache(
        k=pools(shape, storage), v=pools(shape, storage),
        k_scale=pools(shape[:-1], jnp.float32) if scaled else None,
        v_scale=pools(shape[:-1], jnp.float32) if scaled else None,
    )


def _gather(pool: jax.Array, tables: jax.Array) -> jax.Array:
    """The positions ``tables [..., n]`` point at, heads first: ``[..., n_kv_heads, n * block_size,
    *pool.shape[3:]]``."""
    lead = tables.ndim - 1
    blocks = jnp.moveaxis(pool[tables], lead + 1, lead)  # [..., n_kv_heads, n, block_size, ...]
    return blocks.reshape(*tables.shape[:-1], pool.shape[1], tables.shape[-1] * pool.shape[2], *pool.shape[3:])


def _write(pool: jax.Array, scale: jax.Array | None, x: jax.Array, blocks: jax.Array,
           offsets: jax.Array) -> tuple[jax.Array, jax.Array | None]:
    """Store ``x [N, n_kv_heads, head_dim]`` at ``(blocks, offsets)``, quantizing if ``scale`` is given."""
    if scale is None:
        return pool.at[blocks, :, offsets].set(x.astype(pool.dtype), mode="drop"), None
    qmax = _QMAX[jnp.dtype(pool.dtype)]
    s = jnp.max(jnp.abs(x), axis=-1) / qmax  # [N, n_kv_heads]
    q = x / jnp.where(s > 0, s, 1.0)[..., None]
    if jnp.issubdtype(pool.dtype, jnp.integer):
        q = jnp.clip(jnp.round(q), -qmax, qmax)
    return (pool.at[blocks, :, offsets].set(q.astype(pool.dtype), mode="drop"),
            scale.at[blocks, :, offsets].set(s, mode="drop"))


_Pools = tuple[jax.Array, jax.Array, jax.Array | None, jax.Array | None]
"""One layer's K pool, V pool and their scales (``None`` unless quantized)."""


def _read(pool: jax.Array, scale: jax.Array | None, tables: jax.Array) -> jax.Array:
    """The float32 positions ``tables`` point at, dequantized after the gather."""
    values = _gather(pool, tables).astype(jnp.float32)
    return values if scale is None else values * _gather(scale, tables)[..., None]


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def linear(x: jax.Array, w: Weight, matmul_dtype: str | None = None) -> jax.Array:
    """``x @ w.T`` in float32. With a low-precision ``w`` and no ``matmul_dtype``, the activations
    are cast to its dtype and the dot accumulates in float32, so the backend runs its native
    kernel (bf16 × bf16 → f32, say); with ``matmul_dtype="float32"`` the weight is converted inside
    the product instead (see `LlamaConfig.matmul_dtype`). An `Int8Weight` is converted to float32
    inside the product, its column scales applied to ``x`` before and its row scales after: XLA:CPU
    fuses that conversion (and no other producer) into a matrix-vector product, so a one-row decode
    reads one byte per weight. A `GgmlWeight` goes to the ggml matmul kernel (`ggml.matmul`), with
    float32 activations when ``matmul_dtype="float32"``."""
    if isinstance(w, GgmlWeight):
        return ggml.matmul(x, w, float32_activations=matmul_dtype == "float32")
    if isinstance(w, Int8Weight):
        return ((x * w.col) @ w.q.astype(jnp.float32).T) * w.row
    if w.dtype == x.dtype:
        return x @ w.T
    if matmul_dtype is not None:
        return x @ w.astype(matmul_dtype).T
    return lax.dot_general(x.astype(w.dtype), w, (((x.ndim - 1,), (1,)), ((), ())),
                           preferred_element_type=jnp.float32)


def _embed(table: Weight, tokens: jax.Array) -> jax.Array:
    """The float32 embedding rows of ``tokens``."""
    if isinstance(table, Int8Weight):
        return table.q[tokens].astype(jnp.float32) * table.row[tokens][..., None] * table.col
    return table[tokens].astype(jnp.float32)


def _rope(x: jax.Array, positions: jax.Array, config: LlamaConfig) -> jax.Array:
    """NeoX (half-split) rotary embedding of ``x [B, T, heads, head_dim]`` at ``positions [B, T]``,
    with the frequencies (and YaRN's factor) of the configuration's scaling (`rope`)."""
    half = x.shape[-1] // 2
    inv_freq = rope.inv_frequencies(config.head_dim, config.rope_base, config.rope_scaling)
    angles = positions.astype(jnp.float32)[..., None, None] * inv_freq  # [B, T, 1, half]
    factor = rope.attention_factor(config.rope_scaling)
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    if factor != 1.0:
        cos, sin = cos * factor, sin * factor
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def _project(h: jax.Array, w: Weight, bias: jax.Array | None, heads: int, config: LlamaConfig) -> jax.Array:
    """``h [B, T, dim]`` projected (plus ``bias``) and split into ``heads`` heads."""
    out = linear(h, w, config.matmul_dtype)
    if bias is not None:
        out = out + bias.astype(jnp.float32)
    return out.reshape(*h.shape[:2], heads, config.head_dim)


def _qkv(
    layer: LayerParams, x: jax.Array, positions: jax.Array, config: LlamaConfig
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Project ``x [B, T, dim]`` to rotated queries and keys and to values, split into heads."""
    h = rms_norm(x, layer.attn_norm, config.norm_eps)
    q = _project(h, layer.wq, layer.bq, config.n_heads, config)
    k = _project(h, layer.wk, layer.bk, config.n_kv_heads, config)
    v = _project(h, layer.wv, layer.bv, config.n_kv_heads, config)
    if layer.q_norm is not None:
        q = rms_norm(q, layer.q_norm.astype(jnp.float32), config.norm_eps)
    if layer.k_norm is not None:
        k = rms_norm(k, layer.k_norm.astype(jnp.float32), config.norm_eps)
    return _rope(q, positions, config), _rope(k, positions, config), v


def _visible(key_pos: jax.Array, query_pos: jax.Array, window: int | None) -> jax.Array:
    """Whether a query at ``query_pos`` sees the key at ``key_pos`` (broadcast): causal, and within
    the last ``window`` positions where the model has a sliding window."""
    seen = key_pos <= query_pos
    return seen if window is None else seen & (key_pos > query_pos - window)


def _attend(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
    """Grouped-query attention of ``q [B, T, H, d]`` over ``k, v [B, L, H_kv, d]`` where ``mask [B, T, L]``
    (the cache-free `forward`); scores are laid out keys before heads, as in the cache."""
    batch, length, n_heads, head_dim = q.shape
    n_kv_heads = k.shape[2]
    q = q.reshape(batch, length, n_kv_heads, n_heads // n_kv_heads, head_dim)
    scores = jnp.einsum("btkgd,blkd->btlkg", q, k) / math.sqrt(head_dim)
    scores = jnp.where(mask[:, :, :, None, None], scores, _MASKED)
    probs = jax.nn.softmax(scores, axis=2)
    out = jnp.einsum("btlkg,blkd->btkgd", probs, v)
    return out.reshape(batch, length, n_heads * head_dim)


ATTENTION_CHUNK = 4
"""Blocks of keys each iteration of `_paged_attention` reads (64 positions at block size 16)."""


def _paged_attention(q: jax.Array, pools: _Pools, tables: jax.Array, num_chunks: jax.Array,
                     key_mask: Callable[[jax.Array], jax.Array]) -> jax.Array:
    """Attention of queries ``q [G, T, H, d]`` over the cached positions of block tables ``tables [G, n]``.

    A loop runs over the tables ``ATTENTION_CHUNK`` blocks at a time, folding each chunk into a
    running softmax (max, normaliser, weighted sum), so no ``[T, L]`` score matrix over the whole
    context is ever held. The rows are split into ``S = len(num_chunks)`` equal segments, each
    looping for its own ``num_chunks[s]`` chunks (traced: only the blocks in use are read, and the
    tables' width is no compiled shape), so short rows do not pay for the longest.
    ``key_mask(i) [G, T, chunk positions]`` says which keys of chunk ``i`` each query may see;
    every real query must see at least one key somewhere (its own position). ``n`` must be a
    multiple of ``ATTENTION_CHUNK``.
    """
    k_pool, v_pool, k_scale, v_scale = pools
    groups, length, n_heads, head_dim = q.shape
    n_kv_heads = k_pool.shape[1]
    group = n_heads // n_kv_heads
    # each KV head's queries (every position's, each of its query heads) in one matrix [T * group, d],
    # so that the scores and the weighted sum are one plain matrix product per KV head
    q = q.reshape(groups, length, n_kv_heads, group, head_dim).transpose(0, 2, 1, 3, 4)
    q = q.reshape(groups, n_kv_heads, length * group, head_dim) / math.sqrt(head_dim)
    rows = groups // num_chunks.shape[0]

    def segment(s: int) -> jax.Array:
        part = slice(s * rows, (s + 1) * rows)
        qs, ts = q[part], tables[part]

        def chunk(i: jax.Array, carry: tuple[jax.Array, jax.Array, jax.Array]) -> tuple[jax.Array, ...]:
            top, norm, acc = carry
            blocks = lax.dynamic_slice_in_dim(ts, i * ATTENTION_CHUNK, ATTENTION_CHUNK, axis=1)
            keys, values = _read(k_pool, k_scale, blocks), _read(v_pool, v_scale, blocks)  # [R, H_kv, L, d]
            scores = jnp.einsum("gkqd,gkld->gkql", qs, keys)
            visible = jnp.repeat(key_mask(i)[part], group, axis=1)[:, None]
            new_top = jnp.maximum(top, jnp.max(jnp.where(visible, scores, _MASKED), axis=-1))
            probs = jnp.where(visible, jnp.exp(scores - new_top[..., None]), 0.0)
            rescale = jnp.exp(top - new_top)
            return (new_top, norm * rescale + jnp.sum(probs, axis=-1),
                    acc * rescale[..., None] + jnp.einsum("gkql,gkld->gkqd", probs, values))

        shape = qs.shape[:-1]
        init = (jnp.full(shape, _MASKED), jnp.zeros(shape), jnp.zeros(qs.shape))
        _, norm, acc = lax.fori_loop(0, num_chunks[s], chunk, init)
        return acc / jnp.maximum(norm, np.finfo(np.float32).tiny)[..., None]

    out = jnp.concatenate([segment(s) for s in range(num_chunks.shape[0])])
    out = out.reshape(groups, n_kv_heads, length, group, head_dim).transpose(0, 2, 1, 3, 4)
    return out.reshape(groups, length, n_heads * head_dim)


DECODE_SEGMENT_ROWS = 4
"""Rows per segment of decode attention (see `_paged_attention`): each segment loops as far as its
longest row, so the runner orders rows by length (`ModelRunner.decode`). Fewer segments, fewer
loops to compile: at 32 rows, 4 per segment compiled in 10 s against 1 per segment's 45 and
decoded as fast or faster (benchmarks/README.md)."""


def _chunked(table: jax.Array) -> jax.Array:
    """``table [..., n]`` padded with block 0 to a multiple of ``ATTENTION_CHUNK`` entries."""
    extra = -table.shape[-1] % ATTENTION_CHUNK
    return jnp.pad(table, [(0, 0)] * (table.ndim - 1) + [(0, extra)]) if extra else table


def _chunks_for(num_positions: jax.Array, block_size: int) -> jax.Array:
    """Chunks of `_paged_attention` that hold positions ``0 .. num_positions - 1``."""
    span = ATTENTION_CHUNK * block_size
    return (jnp.maximum(num_positions, 0) + span - 1) // span


def _finish_block(layer: LayerParams, x: jax.Array, attn: jax.Array, config: LlamaConfig) -> jax.Array:
    """Output projection, residual, and the SwiGLU MLP with its residual."""
    x = x + linear(attn, layer.wo, config.matmul_dtype)
    h = rms_norm(x, layer.ffn_norm, config.norm_eps)
    mm = config.matmul_dtype
    return x + linear(jax.nn.silu(linear(h, layer.w_gate, mm)) * linear(h, layer.w_up, mm), layer.w_down, mm)


def _logits(params: LlamaParams, x: jax.Array, config: LlamaConfig) -> jax.Array:
    return linear(rms_norm(x, params.norm, config.norm_eps), params.head, config.matmul_dtype)


def _scale(scales: tuple[jax.Array, ...] | None, layer: int) -> jax.Array | None:
    return None if scales is None else scales[layer]


def _rebuild(pools: list[tuple[jax.Array, jax.Array, jax.Array | None, jax.Array | None]]) -> KVCache:
    k, v, k_scale, v_scale = zip(*pools, strict=True)
    quantized = k_scale[0] is not None
    return KVCache(k=k, v=v, k_scale=k_scale if quantized else None, v_scale=v_scale if quantized else None)


@functools.partial(jax.jit, static_argnames=("config",))
def forward(params: LlamaParams, tokens: jax.Array, *, config: LlamaConfig) -> jax.Array:
    """Logits ``[T, vocab]`` for every position of ``tokens [T]``, causal, without a cache."""
    positions = jnp.arange(tokens.shape[0])[None]
    mask = _visible(positions[0][None, :], positions[0][:, None], config.sliding_window)
    x = _embed(params.embed, tokens)[None]
    for layer in params.layers:
        q, k, v = _qkv(layer, x, positions, config)
        x = _finish_block(layer, x, _attend(q, k, v, mask[None]), config)
    return _logits(params, x[0], config)


def _kernel_may_attend(config: LlamaConfig) -> bool:
    """Whether a kernel (native or Pallas) may take attention from the JAX form: the kernels have no
    sliding window, and XLA cannot split a custom call over devices."""
    return config.sliding_window is None and config.tensor_parallel == 1


def _kernel_attention(config: LlamaConfig, pool: jax.Array) -> bool:
    """Whether the native CPU kernel (`attention_kernel`) attends over pools like ``pool``: built here,
    for their dtype, and `_kernel_may_attend`."""
    return _kernel_may_attend(config) and attention_kernel.usable(config.n_heads, pool)


def _prefill_attention(config: LlamaConfig, positions: jax.Array, seen: jax.Array, table: jax.Array,
                       starts: jax.Array, num_chunks: jax.Array,
                       key_mask: Callable[[jax.Array], jax.Array]) -> Callable[[jax.Array, _Pools], jax.Array]:
    """Attention of prompt queries ``q [1, T, H, d]`` at ``positions [T]``: in the native kernel where it
    serves, each token over the first ``seen [T]`` positions of its sequence's blocks, which begin
    at ``starts [T]`` in ``table [n]``; otherwise in `_paged_attention` over ``table``'s first
    ``num_chunks`` chunks, as ``key_mask`` allows. On a GPU or TPU the JAX form stays: its scores
    are matrix products, which their matrix units run well."""

    def attend(q: jax.Array, layer_pools: _Pools) -> jax.Array:
        if _kernel_attention(config, layer_pools[0]):
            out = attention_kernel.paged_attention(q[0], layer_pools[0], layer_pools[1], table, starts, seen)
            return out.reshape(1, positions.shape[0], -1)
        return _paged_attention(q, layer_pools, table[None], num_chunks, key_mask)

    return attend


def _prefill_layers(params: LlamaParams, cache: KVCache, tokens: jax.Array, positions: jax.Array,
                    write_blocks: jax.Array, attend: Callable[[jax.Array, _Pools], jax.Array],
                    config: LlamaConfig) -> tuple[jax.Array, KVCache]:
    """Hidden states ``[T, dim]`` of prompt tokens at ``positions [T]``, their K/V written to
    ``write_blocks [T]``; ``attend`` (`_prefill_attention`) gives each layer's attention."""
    offsets = positions % cache.block_size
    x = _embed(params.embed, tokens)[None]
    pools = []
    for i, layer in enumerate(params.layers):
        q, k, v = _qkv(layer, x, positions[None], config)
        k_pool, k_scale = _write(cache.k[i], _scale(cache.k_scale, i), k[0], write_blocks, offsets)
        v_pool, v_scale = _write(cache.v[i], _scale(cache.v_scale, i), v[0], write_blocks, offsets)
        layer_pools = (k_pool, v_pool, k_scale, v_scale)
        x = _finish_block(layer, x, attend(q, layer_pools), config)
        pools.append(layer_pools)
    return x[0], _rebuild(pools)


def _chunk_positions(i: jax.Array, block_size: int) -> jax.Array:
    """Indices, within the table, of the key positions in chunk ``i``."""
    return i * ATTENTION_CHUNK * block_size + jnp.arange(ATTENTION_CHUNK * block_size)


@functools.partial(jax.jit, static_argnames=("config", "all_logits"), donate_argnames=("cache",))
def prefill(
    params: LlamaParams,
    cache: KVCache,
    tokens: jax.Array,
    true_len: jax.Array | int,
    block_table: jax.Array,
    start_pos: jax.Array | int,
    *,
    config: LlamaConfig,
    all_logits: bool = False,
) -> tuple[jax.Array, KVCache]:
    """Run a prompt chunk of one sequence and write its K/V into the sequence's blocks.

    :param tokens: ``[T_padded]`` token ids; only the first ``true_len`` are real.
    :param block_table: ``[n]`` the sequence's blocks, padded; ``n * block_size >= start_pos + T_padded``.
    :param start_pos: position of ``tokens[0]``; positions ``< start_pos`` must already be in the
        sequence's blocks (an earlier chunk or a reused prefix) and are attended to.
    :param all_logits: return logits for every position ``[T_padded, vocab]`` (for scoring) instead of
        only for the last real token ``[vocab]``.
    :return: the logits and the updated cache (the input cache is donated).
    """
    size = cache.block_size
    index = jnp.arange(tokens.shape[0])
    positions = start_pos + index
    write_blocks = jnp.where(index < true_len, block_table[positions // size], cache.num_blocks)

    def key_mask(i: jax.Array) -> jax.Array:
        return _visible(_chunk_positions(i, size)[None, :], positions[:, None], config.sliding_window)[None]

    table = _chunked(block_table)
    num_chunks = jnp.minimum(_chunks_for(start_pos + true_len, size), table.shape[0] // ATTENTION_CHUNK)[None]
    seen = jnp.where(index < true_len, positions + 1, 0)
    attend = _prefill_attention(config, positions, seen, table, jnp.zeros_like(index), num_chunks, key_mask)
    hidden, cache = _prefill_layers(params, cache, tokens, positions, write_blocks, attend, config)
    return _logits(params, hidden if all_logits else hidden[true_len - 1], config), cache


@functools.partial(jax.jit, static_argnames=("config",), donate_argnames=("cache",))
def prefill_packed(
    params: LlamaParams,
    cache: KVCache,
    tokens: jax.Array,
    positions: jax.Array,
    rows: jax.Array,
    table: jax.Array,
    table_rows: jax.Array,
    starts: jax.Array,
    last: jax.Array,
    *,
    config: LlamaConfig,
) -> tuple[jax.Array, KVCache]:
    """Prompt chunks of several sequences in one call, their tokens packed one after another, so
    the weights are read once for all of them (a few short prompts cost little more than one).

    :param tokens: ``[T]`` the chunks' token ids, one chunk after another, then padding.
    :param positions: ``[T]`` each token's position in its own sequence.
    :param rows: ``[T]`` the sequence (``0..S-1``) each token belongs to; ``-1`` for padding, which
        writes nothing.
    :param table: ``[n]`` the sequences' block tables one after another, then padding entries; each
        covers its sequence up to the end of its chunk. Attention reads only the entries in use.
    :param table_rows: ``[n]`` the sequence each entry of ``table`` belongs to (``-1``: padding, all
        after the entries in use).
    :param starts: ``[S]`` where each sequence's block table begins in ``table``.
    :param last: ``[S]`` the index in ``tokens`` of each sequence's last chunk token.
    :return: logits ``[S, vocab]`` at ``last`` and the updated cache (the input cache is donated).
    """
    size = cache.block_size
    write_blocks = jnp.where(rows >= 0, table[starts[rows] + positions // size], cache.num_blocks)
    attend = packed_prefill_attention(config, size, positions, rows, table, table_rows, starts)
    hidden, cache = _prefill_layers(params, cache, tokens, positions, write_blocks, attend, config)
    return _logits(params, hidden[last], config), cache


def packed_prefill_attention(config: LlamaConfig, block_size: int, positions: jax.Array, rows: jax.Array,
                             table: jax.Array, table_rows: jax.Array,
                             starts: jax.Array) -> Callable[[jax.Array, _Pools], jax.Array]:
    """The attention of `prefill_packed`'s tokens (its arguments of the same names), each over its own
    sequence's positions up to its own (`_prefill_attention`)."""
    table, table_rows = _chunked(table), _chunked(table_rows + 1) - 1  # padding entries stay -1
    entry_pos = (jnp.arange(table.shape[0]) - starts[table_rows]) * block_size  # first position of each entry

    def key_mask(i: jax.Array) -> jax.Array:
        index = _chunk_positions(i, block_size)
        key_rows, key_pos = table_rows[index // block_size], entry_pos[index // block_size] + index % block_size
        seen = _visible(key_pos[None, :], positions[:, None], config.sliding_window)
        return ((key_rows[None, :] == rows[:, None]) & seen)[None]

    num_chunks = _chunks_for(jnp.sum(table_rows >= 0), 1)[None]
    seen = jnp.where(rows >= 0, positions + 1, 0)
    return _prefill_attention(config, positions, seen, table, starts[jnp.maximum(rows, 0)], num_chunks, key_mask)


def jax_decode_attention(q: jax.Array, pools: _Pools, block_tables: jax.Array, positions: jax.Array,
                         sliding_window: int | None = None) -> jax.Array:
    """Decode attention in JAX (`_paged_attention`), as `decode` runs it where the native kernel is not
    used: queries ``q [B, H, d]`` at ``positions [B]`` (``-1``: a padding row) over block tables
    ``[B, n]``, in segments of ``DECODE_SEGMENT_ROWS`` rows, each seeing the last ``sliding_window``
    positions (``None``: all). Returns ``[B, H, d]``."""
    size = pools[0].shape[2]
    segments = q.shape[0] // math.gcd(q.shape[0], DECODE_SEGMENT_ROWS)  # equal segments
    num_chunks = _chunks_for(jnp.max(positions.reshape(segments, -1), axis=1) + 1, size)

    def key_mask(i: jax.Array) -> jax.Array:
        return _visible(_chunk_positions(i, size)[None, :], positions[:, None], sliding_window)[:, None]

    return _paged_attention(q[:, None], pools, _chunked(block_tables), num_chunks, key_mask).reshape(q.shape)


@functools.partial(jax.jit, static_argnames=("config",), donate_argnames=("cache",))
def decode(
    params: LlamaParams,
    cache: KVCache,
    tokens: jax.Array,
    block_tables: jax.Array,
    positions: jax.Array,
    *,
    config: LlamaConfig,
) -> tuple[jax.Array, KVCache]:
    """One decoding step for a batch of sequences.

    :param tokens: ``[B]`` the latest token of each sequence.
    :param block_tables: ``[B, n]`` each sequence's blocks, padded; ``n * block_size > max(positions)``.
        Attention reads only the blocks in use, so ``n`` may be the most any sequence can need.
    :param positions: ``[B]`` position of each token (its sequence's length so far); a padding row
        uses ``-1`` and writes nothing. Attention runs in the native kernel where it is built, reads
        the pools' dtype (`attention_kernel`) and the model is on one device, or in a Pallas kernel
        on a GPU or TPU (`pallas_attention`) on the same terms; otherwise each segment
        of ``DECODE_SEGMENT_ROWS`` rows (fewer where ``B`` is no multiple of it) reads only as far as
        its own longest.
    :return: logits ``[B, vocab]`` and the updated cache (the input cache is donated).
    """
    size = cache.block_size
    rows = jnp.arange(tokens.shape[0])
    write_blocks = jnp.where(positions >= 0, block_tables[rows, jnp.maximum(positions, 0) // size], cache.num_blocks)
    offsets = jnp.maximum(positions, 0) % size

    def attend(q: jax.Array, layer_pools: _Pools) -> jax.Array:
        if _kernel_attention(config, layer_pools[0]):
            out = attention_kernel.decode_attention(q[:, 0], layer_pools[0], layer_pools[1], block_tables,
                                                    positions + 1)
        elif _kernel_may_attend(config) and pallas_attention.usable(config.n_heads, layer_pools[0]):
            out = pallas_attention.decode_attention(q[:, 0], layer_pools[0], layer_pools[1], block_tables,
                                                    positions + 1)
        else:
            out = jax_decode_attention(q[:, 0], layer_pools, block_tables, positions, config.sliding_window)
        return out.reshape(q.shape[0], 1, -1)

    x = _embed(params.embed, tokens)[:, None]
    pools = []
    for i, layer in enumerate(params.layers):
        q, k, v = _qkv(layer, x, positions[:, None], config)
        k_pool, k_scale = _write(cache.k[i], _scale(cache.k_scale, i), k[:, 0], write_blocks, offsets)
        v_pool, v_scale = _write(cache.v[i], _scale(cache.v_scale, i), v[:, 0], write_blocks, offsets)
        layer_pools = (k_pool, v_pool, k_scale, v_scale)
        x = _finish_block(layer, x, attend(q, layer_pools), config)
        pools.append(layer_pools)
    return _logits(params, x[:, 0], config), _rebuild(pools)
