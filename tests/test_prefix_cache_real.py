"""The real model with the radix prefix cache: greedy tokens and logprobs unchanged, shared prompts reused."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
from lamina_hookspecs.types import ChatMessage, Request, SamplingParams

from lamina.kernel.plugins import load_plugins
from lamina.kernel.stack import Stack
from lamina.kernel.stack_config import StackConfig

pytestmark = pytest.mark.slow

SYSTEM = ("You are a careful assistant for a small bookshop. Answer in one short sentence, be polite, "
          "never invent prices, and suggest a classic novel whenever the customer seems unsure.")
QUESTIONS = ["Do you open on Sundays?", "Can you recommend a book about the sea?",
             "What is a good gift for a ten-year-old?", "Do you sell used books?"]


def requests() -> list[Request]:
    greedy = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True, logprobs=True, top_logprobs=5)
    return [Request(id=f"q{i}", model="any", tenant="acme", sampling=greedy,
                    messages=[ChatMessage(role="system", content=SYSTEM), ChatMessage(role="user", content=q)])
            for i, q in enumerate(QUESTIONS)]


def run(prefix_cache: bool) -> tuple[list[list[int]], list[int], dict[str, float], np.ndarray]:
    # float32 weights: with "auto", bfloat16 prompt chunks of other lengths move logprobs by ~0.02
    config: dict[str, Any] = {"executor": {"use": "jax", "weights_dtype": "float32"}}
    if prefix_cache:
        config["prefix_cache"] = {"use": "radix"}
    plugins = load_plugins()
    stack = Stack(StackConfig.from_dict(config, plugins.registry), plugins)
    executor: Any = stack.backends["local"]

    async def go() -> tuple[list[list[int]], list[int], dict[str, float], np.ndarray]:
        await stack.start()
        try:
            tokens, cached, logprobs = [], [], []
            for request in requests():  # one after another: each finds the earlier ones' blocks
                chunks = [c async for c in executor.generate(request)]
                tokens.append([t for c in chunks for t in c.token_ids])
                cached.append(chunks[-1].usage.cached_tokens)
                logprobs += [[top.logprob for top in c.top_logprobs[0]] for c in chunks if c.token_ids]
            stats = dict(stack.prefix_cache.instances[""].stats()) if prefix_cache else {}
            return tokens, cached, stats, np.array(logprobs)
        finally:
            await stack.stop()

    return asyncio.run(go())


def test_real_model_same_greedy_tokens_with_the_cache_and_reuses_the_system_prompt() -> None:
    without, cached_off, _, logprobs_off = run(False)
    with_cache, cached_on, stats, logprobs_on = run(True)
    assert all(len(t) == 16 for t in without)
    assert with_cache == without
    assert logprobs_on.shape == (16 * len(QUESTIONS), 5)
    np.testing.assert_allclose(logprobs_on, logprobs_off, atol=1e-3)  # top-5 logprobs of every step
    assert cached_off == [0] * len(QUESTIONS)
    assert cached_on[0] == 0, "nothing cached before the first request"
    assert all(c >= 16 for c in cached_on[1:]), cached_on  # at least one whole block of the shared prompt
    assert all(c % 16 == 0 for c in cached_on), cached_on  # whole blocks only
    assert stats["hit_tokens"] >= sum(cached_on) and stats["cached_blocks"] > 0, stats
