"""The jax executor with a batching policy: B honoured, prefills held but never stalled, feedback."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import attrs
from lamina_hookspecs.protocols import BatchingPolicy
from lamina_hookspecs.types import Request, SamplingParams, SchedulerState

from lamina_jax.executor import JaxExecutor
from lamina_jax.block_manager import BlockAllocator, BlockManager
from lamina_jax.options import JaxOptions
from lamina_jax.scheduler import Scheduler
from lamina_jax.sequence import Sequence


@attrs.define
class Window:
    """A fixed window (as lamina-autoscale's ``fixed``, which this plugin's tests cannot import)."""

    window_s: float
    limit: int
    observed: list[float] = attrs.field(factory=list)

    def wait_s(self, state: SchedulerState) -> float:
        return 0.0 if state.waiting >= self.limit else max(self.window_s - state.oldest_wait_s, 0.0)

    def max_prefills(self, state: SchedulerState) -> int:
        return self.limit

    def observe(self, latency_s: float, state: SchedulerState) -> None:
        self.observed.append(latency_s)


def seq(name: str, prompt_len: int, at: float = 0.0) -> Sequence:
    return Sequence(request_id=name, prompt_ids=list(range(prompt_len)), sampling=SamplingParams(), emit=print,
                    submitted_at=at)


def test_the_window_holds_new_prefills_while_running_sequences_decode() -> None:
    policy = Window(window_s=0.1, limit=3)
    assert isinstance(policy, BatchingPolicy)
    scheduler = Scheduler(BlockManager(BlockAllocator(100), block_size=4), max_batch=8, prefill_chunk=32, batching=policy)
    runner = seq("running", 3, at=0.0)
    scheduler.add(runner)
    scheduler.finish_prefill(scheduler.schedule(now=0.2).prefills[0])  # waited 0.2 > W: started at once
    runner.output_ids.append(7)
    scheduler.add(seq("a", 5, at=1.0))
    step = scheduler.schedule(now=1.04)
    assert step.decode == [runner] and not step.prefills and abs(scheduler.hold_s - 0.06) < 1e-9
    assert scheduler.state(1.04).arrival_rate > 0
    step = scheduler.schedule(now=1.1)
    assert [w.seq.request_id for w in step.prefills] == ["a"] and scheduler.hold_s == 0


def test_at_most_b_prefills_per_step_within_the_token_budget() -> None:
    scheduler = Scheduler(BlockManager(BlockAllocator(100), block_size=4), max_batch=8, prefill_chunk=32,
                          batching=Window(window_s=1.0, limit=3))
    for i in range(4):
        scheduler.add(seq(f"s{i}", 12, at=0.0))

    def step(now: float) -> list[tuple[str, int, bool]]:
        works = scheduler.schedule(now=now).prefills
        for work in works:
            scheduler.finish_prefill(work)
        return [(w.seq.request_id, len(w.tokens), w.last) for w in works]

    # 4 wait, B = 3: no reason to hold; 32 tokens: s0 and s1 whole, then a first chunk of s2
    assert step(0.0) == [("s0", 12, True), ("s1", 12, True), ("s2", 8, False)]
    # 2 wait, fewer than B, inside the window: but a half-done prefill is never held
    assert step(0.0) == [("s2", 4, True), ("s3", 12, True)]
    scheduler.add(seq("s4", 12, at=0.5))
    assert step(0.5) == [] and scheduler.hold_s == 1.0
    assert step(1.5) == [("s4", 12, True)] and len(scheduler.running) == 5


def test_without_a_policy_every_waiting_prefill_that_fits_starts_at_once() -> None:
    scheduler = Scheduler(BlockManager(BlockAllocator(100), block_size=4), max_batch=8, prefill_chunk=32)
    for i in range(3):
        scheduler.add(seq(f"s{i}", 5))
    assert [w.seq.request_id for w in scheduler.schedule().prefills] == ["s0", "s1", "s2"] and scheduler.hold_s == 0


def test_a_policy_cannot_pack_more_than_the_executor_allows() -> None:
    scheduler = Scheduler(BlockManager(BlockAllocator(100), block_size=4), max_batch=8, prefill_chunk=64, max_prefills=2,
                          batching=Window(window_s=0.0, limit=5))
    for i in range(4):
        scheduler.add(seq(f"s{i}", 5))
    assert [w.seq.request_id for w in scheduler.schedule().prefills] == ["s0", "s1"]


async def started(path: Path, policy: BatchingPolicy | None, **options: Any) -> JaxExecutor:
    options = {"kv_cache_mb": 1, "max_model_len": 128, "weights_dtype": "float32", **options}
    executor = JaxExecutor(JaxOptions(model=str(path), **options),
                           batching=policy)
    await executor.start()
    return executor


def request(i: int, max_tokens: int = 6) -> Request:
    return Request(id=f"r{i}", model="tiny-llama", prompt_token_ids=[3 + (7 * i + j) % 190 for j in range(5 + 3 * i)],
                   sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))


async def tokens(executor: JaxExecutor, req: Request) -> list[int]:
    return [t async for chunk in executor.generate(req) for t in chunk.token_ids]


def test_b_is_honoured_end_to_end_and_packed_prefills_give_the_same_tokens(tiny_gguf: Path) -> None:
    """Ten requests at once with B = 3: no prefill call carries more than 3 sequences, some carry 3,
    and every greedy stream equals the one computed without a policy (as many per step as fit) and
    with one prefill per step."""
    async def go(policy: BatchingPolicy | None) -> tuple[list[list[int]], list[int]]:
        executor = await started(tiny_gguf, policy, max_batch=8)
        sizes: list[int] = []
        prefill = executor.engine.runner.prefill
        executor.engine.runner.prefill = lambda works: sizes.append(len(works)) or prefill(works)
        try:
            return list(await asyncio.gather(*(tokens(executor, request(i)) for i in range(10)))), sizes
        finally:
            await executor.stop()

    policy = Window(window_s=0.05, limit=3)
    batched, sizes = asyncio.run(go(policy))
    plain, plain_sizes = asyncio.run(go(None))
    single, single_sizes = asyncio.run(go(Window(window_s=0.0, limit=1)))
    assert max(sizes) == 3 and sum(sizes) >= 10 and max(plain_sizes) > 3 and set(single_sizes) == {1}
    assert batched == plain == single
    assert len(policy.observed) >= 4 and all(latency > 0 for latency in policy.observed)


def test_a_lone_request_waits_out_the_window_and_is_never_stalled(tiny_gguf: Path) -> None:
    async def go() -> tuple[float, float, list[int]]:
        executor = await started(tiny_gguf, Window(window_s=0.3, limit=4))
        try:
            await tokens(executor, request(0, 1))  # compiles the shapes
            start = time.monotonic()
            stream = executor.generate(request(1, 3))
            await stream.__anext__()
            ttft = time.monotonic() - start
            rest = [t async for chunk in stream for t in chunk.token_ids]
            return ttft, time.monotonic() - start, rest
        finally:
            await executor.stop()

    ttft, total, rest = asyncio.run(go())
    assert 0.3 <= ttft < 3.0, "held for the window, then started with nothing else to run"
    assert len(rest) == 2 and total < 5.0
