"""Cross-package: a stack's ``[batching]`` policy reaches the JAX executor's scheduler and gets feedback."""

from __future__ import annotations

import asyncio
from pathlib import Path

from lamina_autoscale.adaptive_batching import Adaptive
from lamina_hookspecs.types import Request, SamplingParams
from lamina_jax.testing import write_tiny_gguf

from lamina.kernel.plugins import load_plugins
from lamina.kernel.stack import Stack
from lamina.kernel.stack_config import StackConfig


def test_the_stacks_batching_policy_drives_the_jax_scheduler(tmp_path: Path) -> None:
    model = write_tiny_gguf(tmp_path / "tiny-llama.gguf")
    plugins = load_plugins()
    config = {"executor": {"use": "jax", "model": str(model), "kv_cache_mb": 1, "max_model_len": 128},
              "batching": {"use": "adaptive", "w_min_s": 0.0, "w_max_s": 0.05, "max_prefills": 2}}
    stack = Stack(StackConfig.from_dict(config, plugins.registry), plugins)
    executor = stack.backends["local"]
    policy = stack.batching.instances[""]
    assert isinstance(policy, Adaptive) and executor.batching is policy

    async def go() -> list[int]:
        await stack.start()
        try:
            requests = [Request(id=f"r{i}", model=executor.model.id, prompt=f"hello {i}",
                                sampling=SamplingParams(max_tokens=3, temperature=0.0)) for i in range(4)]
            streams = [[c async for c in executor.generate(r)] for r in requests]
            assert executor.engine.scheduler.batching is policy
            return [len(s) for s in streams]
        finally:
            await stack.stop()

    assert all(n >= 1 for n in asyncio.run(go()))
    assert policy.steps >= 1 and 0.0 <= policy.window_s <= 0.05
