"""The JAX executor with the radix prefix cache: same tokens as without, less prefill."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pytest
from lamina_hookspecs.types import Request, SamplingParams
from lamina_jax.testing import device_counts, write_tiny_gguf

from lamina.kernel.choices import fork
from lamina.kernel.plugins import load_plugins
from lamina.kernel.stack import Stack
from lamina.kernel.stack_config import StackConfig


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "tiny-llama.gguf", seed=3)


def run_stack(model: Path, prefix_cache: bool, rounds: list[list[Request]], **executor: Any
              ) -> tuple[list[list[list[int]]], dict[str, float]]:
    config: dict[str, Any] = {"executor": {"use": "jax", "model": str(model), "block_size": 4, "max_batch": 4,
                                           "prefill_chunk": 16, "max_model_len": 256, "kv_cache_mb": 0.1,
                                           "weights_dtype": "float32", **executor}}
    if prefix_cache:
        config["prefix_cache"] = {"use": "radix", "block_size": 4}
    plugins = load_plugins()
    stack = Stack(StackConfig.from_dict(config, plugins.registry), plugins)
    executor = stack.backends["local"]

    async def go() -> list[list[list[int]]]:
        await stack.start()
        try:
            outputs = []
            for requests in rounds:  # each round's requests run concurrently, rounds one after another
                results = await asyncio.gather(*(_collect(executor, r) for r in requests))
                outputs.append(results)
            blocks = executor.engine.scheduler.blocks
            # the engine thread frees a sequence's blocks just after its last chunk: let it, for up to 5 s
            cached = lambda: executor.prefix_cache.stats()["cached_blocks"] if executor.prefix_cache else 0  # noqa: E731
            for _ in range(250):
                if blocks.allocator.num_free + cached() == blocks.allocator.num_blocks:
                    break
                await asyncio.sleep(0.02)
            stats.update(preemptions=executor.engine.scheduler.num_preemptions, shared_blocks=len(blocks.readers),
                         free_blocks=blocks.allocator.num_free, total_blocks=blocks.allocator.num_blocks,
                         **(executor.prefix_cache.stats() if executor.prefix_cache else {}))
            return outputs
        finally:
            await stack.stop()

    stats: dict[str, float] = {}
    return asyncio.run(go()), stats


async def _collect(executor: Any, request: Request) -> list[int]:
    chunks = [c async for c in executor.generate(request)]
    return [t for c in chunks for t in c.token_ids] + [-chunks[-1].usage.cached_tokens]


def workload() -> list[list[Request]]:
    """A first request, six concurrent ones sharing its 37-token "system prompt", and one
    more from another tenant."""
    rng = np.random.default_rng(5)
    system = rng.integers(3, 200, 37).tolist()
    greedy = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)

    def request(i: int, tail: int, tenant: str = "acme") -> Request:
        return Request(id=f"r{i}", model="tiny-llama", tenant=tenant, sampling=greedy,
                       prompt_token_ids=system + rng.integers(3, 200, tail).tolist())

    return [[request(0, 5)], [request(i, 3 + i) for i in range(1, 7)], [request(9, 4, tenant="other")]]


@pytest.mark.parametrize("devices", device_counts(1, 2))
def test_under_memory_pressure_the_cache_changes_no_token(tiny_model: Path, devices: int) -> None:
    """32 blocks of 4 positions for six concurrent sequences of ~53 tokens: sequences are
    preempted and cached blocks evicted, and every stream still equals the run without a cache,
    on one device or split over two."""
    rounds = workload()
    tight = {"kv_cache_mb": 0.01, "max_model_len": 128, "max_batch": 6, "tensor_parallel": devices}
    without, _ = run_stack(tiny_model, False, rounds, **tight)
    with_cache, stats = run_stack(tiny_model, True, rounds, **tight)
    assert [[r[:-1] for r in g] for g in with_cache] == [[r[:-1] for r in g] for g in without]
    assert stats["preemptions"] > 0 and stats["evicted_blocks"] > 0, stats


def test_cache_on_gives_the_same_greedy_tokens_and_reuses_shared_prefixes(tiny_model: Path) -> None:
    rounds = workload()
    without, _ = run_stack(tiny_model, False, rounds)
    with_cache, stats = run_stack(tiny_model, True, rounds)
    tokens = lambda outs: [[r[:-1] for r in group] for group in outs]  # noqa: E731
    assert tokens(with_cache) == tokens(without)
    cached = [[-r[-1] for r in group] for group in with_cache]
    assert cached[0] == [0], "nothing cached yet"
    assert all(c == 36 for c in cached[1]), "the 9 whole blocks of the shared prefix are reused"
    assert cached[2] == [0], "another tenant cannot hit acme's prefixes"
    assert [-r[-1] for g in without for r in g] == [0] * 8
    assert stats["hit_tokens"] >= 6 * 36 and stats["cached_blocks"] > 0


def test_forked_choices_under_memory_pressure_give_the_same_tokens_with_and_without_the_cache(
        tiny_model: Path) -> None:
    """Three rounds of four choices forked from prompts that share a 37-token prefix, in 32 blocks:
    forks read their parent's blocks beside the cache's, sequences are preempted and blocks
    evicted, and the tokens are those of the run without a cache; at the end no block is shared,
    and every block is free or cached."""
    rng = np.random.default_rng(9)
    system = rng.integers(3, 200, 37).tolist()
    # greedy: preemptions depend on timing, and a recomputed prefix may differ in its last bits, which
    # can move a sampled token but not (on this random model) an argmax
    sampling = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    rounds = [fork(Request(id=f"f{i}", model="tiny-llama", tenant="acme", n=4, sampling=sampling,
                           prompt_token_ids=system + rng.integers(3, 200, 4 + i).tolist())) for i in range(3)]
    tight = {"kv_cache_mb": 0.01, "max_model_len": 128, "max_batch": 8}
    without, plain = run_stack(tiny_model, False, rounds, **tight)
    with_cache, stats = run_stack(tiny_model, True, rounds, **tight)
    assert [[r[:-1] for r in g] for g in with_cache] == [[r[:-1] for r in g] for g in without]
    assert plain["preemptions"] > 0 and stats["evicted_blocks"] > 0, stats
    assert all(-r[-1] >= 36 for g in without for r in g[1:]), "forks read their parent's prompt"
    assert plain["shared_blocks"] == stats["shared_blocks"] == 0
    assert plain["free_blocks"] == plain["total_blocks"]
    assert stats["free_blocks"] + stats["cached_blocks"] == stats["total_blocks"], stats


def run_prewarm_workload(model: Path, prewarm: bool) -> tuple[list[tuple[list[int], int]], dict[str, Any]]:
    """Three requests sharing a 37-token system prompt, a long one-off request that needs nearly
    all 32 KV blocks (so the cache gives up the shared prefix), a pause, then one more request
    with the system prompt: (tokens, cached tokens) of each, and what the engine did."""
    config: dict[str, Any] = {
        "executor": {"use": "jax", "model": str(model), "block_size": 4, "max_batch": 4, "prefill_chunk": 16,
                     "max_model_len": 128, "kv_cache_mb": 0.01, "weights_dtype": "float32"},
        "prefix_cache": {"use": "radix", "block_size": 4}}
    if prewarm:
        config["prewarm"] = {"use": "recurring", "block_size": 4, "min_tokens": 8}
    plugins = load_plugins()
    stack = Stack(StackConfig.from_dict(config, plugins.registry), plugins)
    executor = stack.backends["local"]
    rng = np.random.default_rng(11)
    system = rng.integers(3, 200, 37).tolist()
    greedy = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)

    def request(i: int, prompt: list[int], max_tokens: int = 10) -> Request:
        return Request(id=f"w{i}", model="tiny-llama", tenant="acme", prompt_token_ids=prompt,
                       sampling=attrs.evolve(greedy, max_tokens=max_tokens))

    async def settle(condition: Any) -> None:
        for _ in range(200):
            if condition():
                return
            await asyncio.sleep(0.02)

    async def go() -> tuple[list[tuple[list[int], int]], dict[str, Any]]:
        await stack.start()
        engine = executor.engine
        try:
            out = []
            for i in range(3):
                out.append(await _collect_with_cached(executor, request(i, system + rng.integers(3, 200, 5).tolist())))
            await settle(lambda: engine.scheduler.blocks.kept)
            pinned_before = sorted(len(t) for _, t in engine.scheduler.blocks.kept)
            out.append(await _collect_with_cached(executor, request(3, rng.integers(3, 200, 100).tolist(), 20)))
            await settle(lambda: engine.prewarm_computed and engine.scheduler.blocks.kept)
            out.append(await _collect_with_cached(executor, request(4, system + rng.integers(3, 200, 6).tolist())))
            return out, {"pinned_before": pinned_before, "computed": engine.prewarm_computed}
        finally:
            await stack.stop()

    return asyncio.run(go())


async def _collect_with_cached(executor: Any, request: Request) -> tuple[list[int], int]:
    chunks = [c async for c in executor.generate(request)]
    return [t for c in chunks for t in c.token_ids], chunks[-1].usage.cached_tokens


def test_prewarm_pins_a_recurring_prefix_and_computes_it_again_once_evicted(
        tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("lamina_jax.engine.PREWARM_S", 0.05)
    plain, plain_stats = run_prewarm_workload(tiny_model, prewarm=False)
    warmed, stats = run_prewarm_workload(tiny_model, prewarm=True)
    assert [tokens for tokens, _ in warmed] == [tokens for tokens, _ in plain], "pre-warming changes no token"
    assert stats["pinned_before"] == [36], "the 9 whole blocks of the shared 37 tokens were pinned"
    assert stats["computed"] == 1, "evicted for the long request, then computed again while idle"
    assert warmed[4][1] == 36 and plain[4][1] < 36, (warmed[4][1], plain[4][1])
