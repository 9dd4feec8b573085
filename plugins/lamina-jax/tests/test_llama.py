"""The JAX decoder on a tiny random Llama: cached prefill/decode against a full forward pass."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lamina_jax.model.llama import (
    Int8Weight, KVCache, LlamaParams, decode, forward, init_cache, linear, prefill, prefill_packed, quantize_int8,
)
from lamina_jax.testing import random_weights, reference_logits, tiny_config, to_params

CONFIG = tiny_config()
NUM_BLOCKS, BLOCK = 24, 4


@pytest.fixture(scope="module")
def weights() -> dict:
    return random_weights(CONFIG, seed=0)


@pytest.fixture(scope="module")
def params(weights: dict) -> LlamaParams:
    return to_params(weights)


def stale_cache(seed: int = 1) -> KVCache:
    """A cache full of large random values, standing in for whatever earlier sequences left behind."""
    rng = np.random.default_rng(seed)
    shape = (NUM_BLOCKS, CONFIG.n_kv_heads, BLOCK, CONFIG.head_dim)

    def buffers() -> tuple:
        return tuple(jnp.asarray(10 * rng.standard_normal(shape), jnp.float32) for _ in range(CONFIG.n_layers))

    return KVCache(k=buffers(), v=buffers())


def padded(tokens: list[int], length: int) -> jnp.ndarray:
    return jnp.asarray(tokens + [0] * (length - len(tokens)), jnp.int32)


def table(blocks: list[int], length: int) -> jnp.ndarray:
    """A block table padded to ``length`` entries with block 0 (masked anyway)."""
    return padded(blocks, length)


def random_tokens(seed: int, length: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, CONFIG.vocab_size, length).tolist()


@pytest.mark.parametrize("tied", [False, True])
def test_forward_matches_numpy_reference(tied: bool) -> None:
    weights = random_weights(CONFIG, seed=3, tied=tied)
    tokens = random_tokens(4, 40)
    logits = forward(to_params(weights), jnp.asarray(tokens), config=CONFIG)
    np.testing.assert_allclose(logits, reference_logits(weights, CONFIG, tokens), atol=1e-4, rtol=0)


def dequantized(w: Int8Weight) -> np.ndarray:
    return np.asarray(w.q, np.float32) * np.asarray(w.row)[:, None] * np.asarray(w.col)[None, :]


def test_int8_weights_balance_columns_and_multiply_as_their_value() -> None:
    rng = np.random.default_rng(5)
    w = rng.standard_normal((48, 64)).astype(np.float32)
    w[:, [3, 40]] *= 20  # two outlier columns, as activations' channels often have
    quantized = quantize_int8(jnp.asarray(w))
    assert quantized.q.dtype == jnp.int8 and quantized.shape == w.shape
    row_only = np.max(np.abs(w), axis=1, keepdims=True) / 127
    row_only_error = np.abs(np.round(w / row_only) * row_only - w).mean()
    error = np.abs(dequantized(quantized) - w).mean()
    assert error < row_only_error / 1.5, "balanced scales keep the outlier columns from coarsening every row"
    x = jnp.asarray(rng.standard_normal((5, 64)), jnp.float32)
    np.testing.assert_allclose(linear(x, quantized), np.asarray(x) @ dequantized(quantized).T, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("tied", [False, True])
def test_int8_weights_run_the_whole_decoder(tied: bool) -> None:
    """Every matrix quantized (the embedding too, looked up from int8): the forward pass computes
    with the dequantized values."""
    from lamina_jax.weight_formats import cast

    params = to_params(random_weights(CONFIG, seed=3, tied=tied))
    quantized = cast(params, "int8")
    assert isinstance(quantized.embed, Int8Weight) and quantized.norm.dtype == jnp.float32
    as_float = jax.tree.map(lambda a: jnp.asarray(dequantized(a)) if isinstance(a, Int8Weight) else a, quantized,
                            is_leaf=lambda a: isinstance(a, Int8Weight))
    tokens = jnp.asarray(random_tokens(4, 24))
    np.testing.assert_allclose(forward(quantized, tokens, config=CONFIG), forward(as_float, tokens, config=CONFIG),
                               atol=1e-4, rtol=1e-4)


def test_init_cache_shape() -> None:
    cache = init_cache(CONFIG, num_blocks=3, block_size=8)
    assert (cache.num_blocks, cache.block_size) == (3, 8)
    assert len(cache.k) == len(cache.v) == CONFIG.n_layers
    assert cache.k[0].shape == (3, CONFIG.n_kv_heads, 8, CONFIG.head_dim)


def test_prefill_and_batched_decode_match_forward(params: LlamaParams) -> None:
    """Three sequences of different lengths in scattered blocks, decoded together until each ends."""
    blocks = [[5, 2, 9, 11, 3, 17, 20], [0, 7, 8, 14], [1, 4, 6, 10, 12, 13, 15]]
    prompt_lens, total_lens = [3, 7, 12], [20, 15, 25]
    sequences = [random_tokens(10 + i, n) for i, n in enumerate(total_lens)]
    expected = [np.asarray(forward(params, jnp.asarray(seq), config=CONFIG)) for seq in sequences]
    cache = stale_cache()
    for i, (seq, n) in enumerate(zip(sequences, prompt_lens, strict=True)):
        logits, cache = prefill(params, cache, padded(seq[:n], 16), n, table(blocks[i], 4), 0, config=CONFIG)
        np.testing.assert_allclose(logits, expected[i][n - 1], atol=1e-4, rtol=0)
    for position in range(min(prompt_lens), max(total_lens)):
        active = [i for i in range(3) if prompt_lens[i] <= position < total_lens[i]]
        rows = [*active, None]  # one padding row that must write nothing
        tokens = jnp.asarray([sequences[i][position] if i is not None else 0 for i in rows], jnp.int32)
        tables = jnp.stack([table(blocks[i] if i is not None else [16], 8) for i in rows])
        positions = jnp.asarray([position if i is not None else -1 for i in rows], jnp.int32)
        logits, cache = decode(params, cache, tokens, tables, positions, config=CONFIG)
        for row, i in enumerate(active):
            np.testing.assert_allclose(logits[row], expected[i][position], atol=1e-4, rtol=0)
    untouched = stale_cache()
    for layer in range(CONFIG.n_layers):  # blocks 16, 18, 19, 21+ belong to nobody
        for block in (16, 18, 19, 21):
            np.testing.assert_array_equal(cache.k[layer][block], untouched.k[layer][block])
            np.testing.assert_array_equal(cache.v[layer][block], untouched.v[layer][block])


def test_prefill_writes_only_real_tokens(params: LlamaParams) -> None:
    tokens = padded(random_tokens(5, 5), 16)
    cache = prefill(params, stale_cache(), tokens, 5, table([3, 8], 4), 0, config=CONFIG)[1]
    before = stale_cache()
    for layer in range(CONFIG.n_layers):
        assert not np.allclose(cache.k[layer][3], before.k[layer][3])
        assert not np.allclose(cache.k[layer][8, :, :1], before.k[layer][8, :, :1])
        np.testing.assert_array_equal(cache.k[layer][8, :, 1:], before.k[layer][8, :, 1:])
        np.testing.assert_array_equal(cache.v[layer][0], before.v[layer][0])


def test_packed_prefill_of_several_sequences_matches_forward(params: LlamaParams) -> None:
    """Three chunks in one call: a fresh 6-token prompt, positions 5-9 of a sequence whose first 5
    are already cached, and a fresh 3-token prompt; padding tokens and table entries write nothing."""
    seqs = [random_tokens(20, 6), random_tokens(21, 10), random_tokens(22, 3)]
    blocks = [[5, 2], [9, 4, 7], [11]]
    expected = [np.asarray(forward(params, jnp.asarray(seq), config=CONFIG)) for seq in seqs]
    cache = prefill(params, stale_cache(), padded(seqs[1][:5], 8), 5, table(blocks[1], 4), 0, config=CONFIG)[1]
    chunks = [(seqs[0], 0), (seqs[1][5:], 5), (seqs[2], 0)]  # (tokens, start)
    tokens = padded([t for chunk, _ in chunks for t in chunk], 16)
    positions = padded([p for chunk, start in chunks for p in range(start, start + len(chunk))], 16)
    rows = jnp.asarray([i for i, (chunk, _) in enumerate(chunks) for _ in chunk] + [-1] * 2, jnp.int32)
    flat = table([b for bs in blocks for b in bs], 8)
    table_rows = jnp.asarray([i for i, bs in enumerate(blocks) for _ in bs] + [-1] * 2, jnp.int32)
    starts, last = jnp.asarray([0, 2, 5, 0], jnp.int32), jnp.asarray([5, 10, 13, 0], jnp.int32)
    logits, cache = prefill_packed(params, cache, tokens, positions, rows, flat, table_rows, starts, last,
                                   config=CONFIG)
    for row, (seq, want) in enumerate(zip(seqs, expected, strict=True)):
        np.testing.assert_allclose(logits[row], want[len(seq) - 1], atol=1e-4, rtol=0)
    untouched = stale_cache()
    for layer in range(CONFIG.n_layers):  # block 0 pads the table; 7 and 11 are written only in part
        np.testing.assert_array_equal(cache.k[layer][0], untouched.k[layer][0])
        np.testing.assert_array_equal(cache.k[layer][7, :, 2:], untouched.k[layer][7, :, 2:])
        np.testing.assert_array_equal(cache.v[layer][11, :, 3:], untouched.v[layer][11, :, 3:])


def test_chunked_prefill_with_all_logits_matches_forward(params: LlamaParams) -> None:
    seq = random_tokens(6, 11)
    expected = np.asarray(forward(params, jnp.asarray(seq), config=CONFIG))
    blocks = table([9, 2, 5], 4)
    cache = stale_cache()
    first, cache = prefill(params, cache, padded(seq[:5], 8), 5, blocks, 0, config=CONFIG, all_logits=True)
    second, cache = prefill(params, cache, padded(seq[5:], 8), 6, blocks, 5, config=CONFIG, all_logits=True)
    np.testing.assert_allclose(first[:5], expected[:5], atol=1e-4, rtol=0)
    np.testing.assert_allclose(second[:6], expected[5:], atol=1e-4, rtol=0)


def test_shared_prefix_blocks_serve_two_sequences(params: LlamaParams) -> None:
    """A second sequence reuses the first one's full prefix block and prefills only its own tail."""
    prefix = random_tokens(30, BLOCK)
    a, b = prefix + random_tokens(31, 3), prefix + random_tokens(32, 2)
    cache = stale_cache()
    cache = prefill(params, cache, padded(a, 8), len(a), table([6, 7], 4), 0, config=CONFIG)[1]
    logits, cache = prefill(params, cache, padded(b[BLOCK:], 8), 2, table([6, 12], 4), BLOCK, config=CONFIG)
    expected = np.asarray(forward(params, jnp.asarray(b), config=CONFIG))
    np.testing.assert_allclose(logits, expected[-1], atol=1e-4, rtol=0)


def test_batched_decode_equals_single_decode_and_table_buckets_agree(params: LlamaParams) -> None:
    prompts = [random_tokens(20 + i, n) for i, n in enumerate([4, 9, 6])]
    blocks = [[0, 1], [2, 3, 4], [5, 6]]
    next_tokens = jnp.asarray([5, 17, 200], jnp.int32)
    caches = []
    for _ in range(2):
        cache = stale_cache()
        for prompt, owned in zip(prompts, blocks, strict=True):
            cache = prefill(params, cache, padded(prompt, 16), len(prompt), table(owned, 4), 0, config=CONFIG)[1]
        caches.append(cache)
    positions = jnp.asarray([len(p) for p in prompts], jnp.int32)
    tables = jnp.stack([table(owned, 4) for owned in blocks])
    batched, batched_cache = decode(params, caches[0], next_tokens, tables, positions, config=CONFIG)
    single_cache = caches[1]
    for row in range(3):
        one = slice(row, row + 1)
        wide = jnp.stack([table(blocks[row], 8)])
        logits, single_cache = decode(params, single_cache, next_tokens[one], wide, positions[one], config=CONFIG)
        np.testing.assert_allclose(logits[0], batched[row], atol=1e-5, rtol=0)
    for layer in range(CONFIG.n_layers):
        np.testing.assert_allclose(batched_cache.k[layer], single_cache.k[layer], atol=1e-6, rtol=0)
        np.testing.assert_allclose(batched_cache.v[layer], single_cache.v[layer], atol=1e-6, rtol=0)


@pytest.mark.parametrize("rows", [8, 6])
def test_decode_in_attention_segments_equals_single_decode(params: LlamaParams, rows: int) -> None:
    """Rows of very different lengths, in no order, in segments of ``DECODE_SEGMENT_ROWS`` rows (8)
    or of fewer (6 is no multiple of 4): each row's logits are its own."""
    lengths = [3, 11, 6, 1, 9, 2, 7, 5][:rows]
    prompts = [random_tokens(40 + i, n) for i, n in enumerate(lengths)]
    blocks = [[3 * i, 3 * i + 1, 3 * i + 2] for i in range(rows)]
    cache = stale_cache()
    for prompt, owned in zip(prompts, blocks, strict=True):
        cache = prefill(params, cache, padded(prompt, 16), len(prompt), table(owned, 4), 0, config=CONFIG)[1]
    next_tokens = jnp.asarray(random_tokens(99, rows), jnp.int32)
    positions = jnp.asarray(lengths, jnp.int32)
    tables = jnp.stack([table(owned, 4) for owned in blocks])
    batched, cache = decode(params, cache, next_tokens, tables, positions, config=CONFIG)  # rewritten alike below
    for row in range(rows):
        one = slice(row, row + 1)
        logits, cache = decode(params, cache, next_tokens[one], tables[one], positions[one], config=CONFIG)
        np.testing.assert_allclose(logits[0], batched[row], atol=1e-5, rtol=0)


def test_cache_buffers_are_donated_and_updated_in_place(params: LlamaParams) -> None:
    cache = init_cache(CONFIG, num_blocks=NUM_BLOCKS, block_size=BLOCK)
    pointer = cache.k[1].unsafe_buffer_pointer()
    _, after_prefill = prefill(params, cache, padded([1, 2], 8), 2, table([0], 4), 0, config=CONFIG)
    assert cache.k[1].is_deleted()
    _, after_decode = decode(
        params, after_prefill, jnp.asarray([3]), jnp.stack([table([0], 4)]), jnp.asarray([2]), config=CONFIG
    )
    assert after_decode.k[1].unsafe_buffer_pointer() == pointer
