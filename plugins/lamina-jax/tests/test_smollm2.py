"""The real SmolLM2-135M-Instruct GGUF against a recorded float32 reference (transformers, torch CPU)."""

import hashlib
import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from lamina_jax.model.llama import decode, init_cache, prefill
from lamina_jax.testing import cpu_kernels_absent, device_counts
from lamina_jax.tokenizer import Tokenizer, IncrementalDetokenizer
from lamina_jax.weights.gguf import GGUFModel, load_gguf, smollm2_path

pytestmark = pytest.mark.slow

REFERENCE = json.loads((Path(__file__).parent / "data" / "smollm2_greedy_reference.json").read_text())
PROMPTS = REFERENCE["prompts"]
PADDED_LEN, BLOCK, BLOCKS_PER_SEQ = 16, 16, 4


@pytest.fixture(scope="module")
def model() -> GGUFModel:
    try:
        path = smollm2_path()
    except FileNotFoundError as error:
        pytest.skip(str(error))
    return load_gguf(path)


@pytest.fixture(scope="module")
def tokenizer(model: GGUFModel) -> Tokenizer:
    return Tokenizer.from_gguf(model.metadata)


@pytest.fixture(scope="module")
def greedy(model: GGUFModel) -> tuple[list[np.ndarray], list[list[int]]]:
    """Prefill each reference prompt into its own blocks, then decode all of them greedily as one batch."""
    cache = init_cache(model.config, num_blocks=len(PROMPTS) * BLOCKS_PER_SEQ, block_size=BLOCK)
    tables = jnp.arange(len(PROMPTS) * BLOCKS_PER_SEQ, dtype=jnp.int32).reshape(len(PROMPTS), BLOCKS_PER_SEQ)
    last_logits, generated = [], []
    for row, prompt in enumerate(PROMPTS):
        ids = prompt["prompt_token_ids"]
        tokens = jnp.asarray(ids + [0] * (PADDED_LEN - len(ids)), jnp.int32)
        logits, cache = prefill(model.params, cache, tokens, len(ids), tables[row], 0, config=model.config)
        last_logits.append(np.asarray(logits))
        generated.append([int(np.argmax(logits))])
    positions = np.asarray([len(prompt["prompt_token_ids"]) for prompt in PROMPTS], np.int32)
    for _ in range(len(PROMPTS[0]["greedy_token_ids"]) - 1):
        tokens = jnp.asarray([ids[-1] for ids in generated], jnp.int32)
        logits, cache = decode(model.params, cache, tokens, tables, jnp.asarray(positions), config=model.config)
        for ids, row in zip(generated, np.asarray(logits), strict=True):
            ids.append(int(np.argmax(row)))
        positions += 1
    return last_logits, generated


def test_shipped_file_and_config(model: GGUFModel) -> None:
    with smollm2_path().open("rb") as file:
        assert hashlib.file_digest(file, "sha256").hexdigest() == REFERENCE["gguf_sha256"]
    config = model.config
    assert (config.n_layers, config.dim, config.ffn_dim, config.vocab_size) == (30, 576, 1536, 49152)
    assert (config.n_heads, config.n_kv_heads, config.head_dim, config.rope_base) == (9, 3, 64, 100000.0)
    assert model.params.lm_head is None


def test_prompt_token_ids(tokenizer: Tokenizer) -> None:
    assert (tokenizer.backend.post_processor is not None) == REFERENCE["gguf_add_bos_token"]
    assert (tokenizer.bos_id, tokenizer.eos_id) == (REFERENCE["bos_token_id"], REFERENCE["eos_token_id"])
    for prompt in PROMPTS:
        assert tokenizer.encode(prompt["prompt"]) == prompt["prompt_token_ids"]


@pytest.mark.parametrize("index", range(len(PROMPTS)))
def test_top5_logits_at_last_prompt_position(greedy: tuple, index: int) -> None:
    logits = greedy[0][index]
    top5 = PROMPTS[index]["top5_last_prompt_position"]
    assert np.argsort(-logits)[:5].tolist() == [entry["token_id"] for entry in top5]
    np.testing.assert_allclose([logits[e["token_id"]] for e in top5], [e["logit"] for e in top5], atol=1e-3)


@pytest.mark.parametrize("index", range(len(PROMPTS)))
def test_greedy_tokens_and_text(greedy: tuple, tokenizer: Tokenizer, index: int) -> None:
    prompt = PROMPTS[index]
    assert greedy[1][index] == prompt["greedy_token_ids"]
    detokenizer = IncrementalDetokenizer(tokenizer, prompt["prompt_token_ids"])
    assert "".join(detokenizer.add(token_id) for token_id in greedy[1][index]) == prompt["greedy_text"]


def test_chat_prompt_uses_control_tokens(tokenizer: Tokenizer) -> None:
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    text = tokenizer.render_chat(messages)
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")
    ids = tokenizer.encode_chat(messages)
    assert ids.count(REFERENCE["bos_token_id"]) == 3 and ids.count(REFERENCE["eos_token_id"]) == 2
    assert tokenizer.decode(ids) == text


@pytest.mark.parametrize(("weights_dtype", "devices"), [
    ("auto", 1), pytest.param("q4_1-f32", 1, marks=pytest.mark.skipif(
        cpu_kernels_absent(), reason="the ggml matmul kernel is not built here")),
    *(pytest.param("float32", *p.values, marks=p.marks, id=f"float32-{p.id}") for p in device_counts(2, 4))])
def test_default_executor_reproduces_the_reference_concurrently(weights_dtype: str, devices: int) -> None:
    """The default stack's executor (built-in model, default options) serving all reference prompts
    at once, with a small prefill chunk so prefill and decode interleave: greedy tokens equal. So
    does every shape in ``q4_1-f32``, the GGUF's own blocks against float32 activations, which
    ``auto`` may choose where the ggml kernel is built, and float32 split over 2 or 4 devices
    (SmolLM2's 3 KV heads divide by neither: attention whole on each, the MLP and vocabulary split)."""
    import asyncio

    from lamina_hookspecs.types import Request, SamplingParams

    from lamina_jax.executor import JaxExecutor
    from lamina_jax.options import JaxOptions

    async def go() -> list[list[int]]:
        executor = JaxExecutor(JaxOptions(prefill_chunk=16, kv_cache_mb=64, weights_dtype=weights_dtype,
                                          tensor_parallel=devices))
        await executor.start()
        sampling = SamplingParams(max_tokens=len(PROMPTS[0]["greedy_token_ids"]), temperature=0.0, ignore_eos=True)

        async def one(i: int, ids: list[int]) -> list[int]:
            request = Request(id=f"r{i}", model=executor.model.id, prompt_token_ids=ids, sampling=sampling)
            return [t async for chunk in executor.generate(request) for t in chunk.token_ids]

        try:
            return await asyncio.gather(*(one(i, p["prompt_token_ids"]) for i, p in enumerate(PROMPTS)))
        finally:
            await executor.stop()

    for prompt, output in zip(PROMPTS, asyncio.run(go()), strict=True):
        assert output == prompt["greedy_token_ids"]
