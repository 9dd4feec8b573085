"""KV cache storage dtypes (bfloat16, int8, fp8) against the float32 cache, on a tiny random Llama.

Tolerances were measured on this model (logits of magnitude ≈4, five random 40-token sequences:
24 prefilled, 16 decoded): max |Δlogit| vs the float32 cache ≈0.007 for bfloat16, ≈0.021 for int8
and ≈0.10 for fp8 e4m3 (per-token, per-head scales); teacher-forced top-1 agreement ≥ 0.95. The bounds
below leave about 2-3x headroom. Free-running greedy continuations (8 prompts of 12 tokens, 16 new)
matched the float32 cache's token for token with bfloat16 and int8 (128/128); with fp8, 100/128 (two
of the eight diverged early, and on this random model's flat logits a divergence never recovers).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from lamina_hookspecs.types import Request, SamplingParams

from lamina_jax.executor import JaxExecutor
from lamina_jax.model.llama import KVDtype, LlamaParams, decode, init_cache, kv_bytes_per_position, prefill
from lamina_jax.options import JaxOptions
from lamina_jax.testing import random_weights, tiny_config, to_params

CONFIG = tiny_config()
NUM_BLOCKS, BLOCK = 16, 4
MAX_DIFF: dict[KVDtype, float] = {"bfloat16": 0.02, "int8": 0.05, "fp8": 0.25}
MIN_GREEDY_AGREEMENT: dict[KVDtype, float] = {"bfloat16": 0.9, "int8": 0.9, "fp8": 0.6}


@pytest.fixture(scope="module")
def params() -> LlamaParams:
    return to_params(random_weights(CONFIG, seed=0))


def tokens(seed: int, length: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, CONFIG.vocab_size, length).tolist()


def teacher_forced(params: LlamaParams, dtype: KVDtype, seq: list[int], prompt_len: int) -> np.ndarray:
    """Logits at every position: the first ``prompt_len`` from one prefill, the rest decoded one by one."""
    cache = init_cache(CONFIG, num_blocks=NUM_BLOCKS, block_size=BLOCK, dtype=dtype)
    table = jnp.arange(NUM_BLOCKS, dtype=jnp.int32)
    logits, cache = prefill(params, cache, jnp.asarray(seq[:prompt_len], jnp.int32), prompt_len, table, 0,
                            config=CONFIG, all_logits=True)
    out = [np.asarray(logits)]
    for position in range(prompt_len, len(seq)):
        step, cache = decode(params, cache, jnp.asarray([seq[position]], jnp.int32), table[None],
                             jnp.asarray([position], jnp.int32), config=CONFIG)
        out.append(np.asarray(step))
    return np.concatenate(out)


def greedy(params: LlamaParams, dtype: KVDtype, prompt: list[int], count: int) -> list[int]:
    cache = init_cache(CONFIG, num_blocks=NUM_BLOCKS, block_size=BLOCK, dtype=dtype)
    table = jnp.arange(NUM_BLOCKS, dtype=jnp.int32)
    logits, cache = prefill(params, cache, jnp.asarray(prompt, jnp.int32), len(prompt), table, 0, config=CONFIG)
    out = [int(np.argmax(logits))]
    for position in range(len(prompt), len(prompt) + count - 1):
        step, cache = decode(params, cache, jnp.asarray([out[-1]], jnp.int32), table[None],
                             jnp.asarray([position], jnp.int32), config=CONFIG)
        out.append(int(np.argmax(step[0])))
    return out


def test_init_cache_dtypes_and_scales() -> None:
    for dtype, storage, scaled in [("float32", jnp.float32, False), ("bfloat16", jnp.bfloat16, False),
                                   ("int8", jnp.int8, True), ("fp8", jnp.float8_e4m3fn, True)]:
        cache = init_cache(CONFIG, num_blocks=3, block_size=8, dtype=dtype)
        assert cache.k[0].dtype == storage and cache.v[1].dtype == storage
        assert (cache.k_scale is not None) == scaled and (cache.v_scale is not None) == scaled
        if scaled:
            assert cache.k_scale[0].shape == (3, CONFIG.n_kv_heads, 8) and cache.k_scale[0].dtype == jnp.float32
    per_head = {"float32": 64, "bfloat16": 32, "int8": 16 + 4, "fp8": 16 + 4}
    for dtype, size in per_head.items():
        assert kv_bytes_per_position(CONFIG, dtype) == 2 * CONFIG.n_layers * CONFIG.n_kv_heads * size


@pytest.mark.parametrize("dtype", ["bfloat16", "int8", "fp8"])
def test_logits_close_to_float32_cache(params: LlamaParams, dtype: KVDtype) -> None:
    for seed in range(3):
        seq = tokens(seed, 40)
        reference = teacher_forced(params, "float32", seq, 24)
        logits = teacher_forced(params, dtype, seq, 24)
        assert np.abs(logits - reference).max() < MAX_DIFF[dtype]
        assert (logits.argmax(-1) == reference.argmax(-1)).mean() >= 0.9


@pytest.mark.parametrize("dtype", ["bfloat16", "int8", "fp8"])
def test_greedy_continuations_mostly_agree(params: LlamaParams, dtype: KVDtype) -> None:
    agree = total = 0
    for seed in range(8):
        prompt = tokens(100 + seed, 12)
        reference, ours = greedy(params, "float32", prompt, 16), greedy(params, dtype, prompt, 16)
        agree += sum(a == b for a, b in zip(reference, ours, strict=True))
        total += len(reference)
    assert agree / total >= MIN_GREEDY_AGREEMENT[dtype]


@pytest.mark.parametrize("dtype", ["int8", "fp8"])
def test_quantized_cache_is_donated_and_updated_in_place(params: LlamaParams, dtype: KVDtype) -> None:
    cache = init_cache(CONFIG, num_blocks=NUM_BLOCKS, block_size=BLOCK, dtype=dtype)
    pointers = cache.k[1].unsafe_buffer_pointer(), cache.k_scale[1].unsafe_buffer_pointer()
    table = jnp.zeros(4, jnp.int32)
    _, cache2 = prefill(params, cache, jnp.asarray([1, 2, 0, 0], jnp.int32), 2, table, 0, config=CONFIG)
    assert cache.k[1].is_deleted() and cache.k_scale[1].is_deleted()
    _, cache3 = decode(params, cache2, jnp.asarray([3]), table[None], jnp.asarray([2]), config=CONFIG)
    assert (cache3.k[1].unsafe_buffer_pointer(), cache3.k_scale[1].unsafe_buffer_pointer()) == pointers
    assert np.asarray(cache3.k_scale[1][0, :, :3]).min() > 0  # three positions written, with scales
    np.testing.assert_array_equal(np.asarray(cache3.k_scale[1][0, :, 3:]), 0)  # the rest untouched


def test_executor_with_int8_cache_fits_more_blocks(tiny_gguf: Path) -> None:
    async def go(kv_dtype: str) -> tuple[int, list[int]]:
        executor = JaxExecutor(JaxOptions(model=str(tiny_gguf), kv_dtype=kv_dtype, kv_cache_mb=0.1,
                                          max_model_len=128, weights_dtype="float32"))
        await executor.start()
        try:
            request = Request(id="r", model=executor.model.id, prompt="the cat sat on",
                              sampling=SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))
            chunks = [chunk async for chunk in executor.generate(request)]
            return executor.state().kv_blocks_total, [t for c in chunks for t in c.token_ids]
        finally:
            await executor.stop()

    blocks_f32, tokens_f32 = asyncio.run(go("float32"))
    blocks_int8, tokens_int8 = asyncio.run(go("int8"))
    assert blocks_int8 > blocks_f32
    assert len(tokens_int8) == 12
    assert sum(a == b for a, b in zip(tokens_f32, tokens_int8, strict=True)) >= 9
