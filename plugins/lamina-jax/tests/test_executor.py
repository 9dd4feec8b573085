"""The jax executor end to end on a tiny random GGUF model: batching, paging, sampling, aborts."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import attrs
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from lamina.kernel.choices import fork, merge
from lamina.testing.contracts import ExecutorContract
from lamina_hookspecs.errors import ContextLengthError, InvalidRequestError, ServiceUnavailableError
from lamina_hookspecs.types import ChatMessage, Request, SamplingParams, TokenChunk

from lamina_jax.executor import JaxExecutor, kv_budget
from lamina_jax.model.llama import LlamaParams, forward
from lamina_jax.options import JaxOptions
from lamina_jax.rates import SpacedRate
from lamina_jax.weights.gguf import load_gguf
from lamina_jax.weights.model_files import ModelFiles
from lamina_jax.testing import cpu_kernels_absent, device_counts, tiny_config

GREEDY = dict(temperature=0.0, ignore_eos=True)


def run(make: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    return asyncio.run(make())


async def collect(executor: JaxExecutor, request: Request) -> list[TokenChunk]:
    return [chunk async for chunk in executor.generate(request)]


def executor_for(path: Path, **options: Any) -> JaxExecutor:
    # float32 everywhere: these tests compare tokens with a float32 reference, across batch sizes
    options = {"kv_cache_mb": 1, "max_model_len": 128, "weights_dtype": "float32", **options}
    return JaxExecutor(JaxOptions(model=str(path), **options))


async def started(path: Path, **options: Any) -> JaxExecutor:
    executor = executor_for(path, **options)
    await executor.start()
    return executor


def tokens_of(chunks: list[TokenChunk]) -> list[int]:
    return [t for c in chunks for t in c.token_ids]


class TestJaxContract(ExecutorContract):
    @pytest.fixture
    def component(self, tiny_gguf: Path) -> JaxExecutor:
        return executor_for(tiny_gguf)


def greedy_reference(path: Path, prompt: list[int], count: int) -> list[int]:
    """Greedy continuation by full causal forward passes (padded to one length: one compile)."""
    model = load_gguf(path)
    tokens = list(prompt)
    for _ in range(count):
        logits = forward(model.params, jnp.asarray(tokens + [0] * (128 - len(tokens))), config=model.config)
        tokens.append(int(np.argmax(logits[len(tokens) - 1])))
    return tokens[len(prompt):]


@pytest.mark.parametrize("devices", device_counts(1, 2, 4))
def test_concurrent_greedy_streams_match_a_full_forward_pass(tiny_gguf: Path, devices: int) -> None:
    """Six concurrent requests with chunked prefill (chunk 16), a decode batch cap of 6, and a KV
    pool so small that sequences get preempted and recomputed: every stream still equals the
    greedy continuation computed by a plain forward pass over the whole sequence (on one device),
    whatever number of devices the executor is split over."""
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, 200, n).tolist() for n in (5, 40, 17, 3, 33, 60)]

    async def go() -> tuple[list[list[int]], int]:
        # 0.03 MiB is 30 blocks of 4 positions, raised to the 32 that one full-length sequence needs:
        # 128 positions for the ~300 these requests need together, which forces preemptions.
        executor = await started(tiny_gguf, max_batch=6, prefill_chunk=16, block_size=4, kv_cache_mb=0.03,
                                 tensor_parallel=devices)
        assert executor.state().kv_blocks_total == 32
        requests = [Request(id=f"r{i}", model=executor.model.id, prompt_token_ids=p,
                            sampling=SamplingParams(max_tokens=24, **GREEDY)) for i, p in enumerate(prompts)]
        outputs = await asyncio.gather(*(collect(executor, r) for r in requests))
        preemptions = executor.engine.scheduler.num_preemptions
        await executor.stop()
        return [tokens_of(o) for o in outputs], preemptions

    outputs, preemptions = run(go)
    assert preemptions > 0
    for prompt, output in zip(prompts, outputs, strict=True):
        assert output == greedy_reference(tiny_gguf, prompt, 24)


@pytest.mark.parametrize("sampling", [GREEDY, dict(temperature=1.0, top_k=3, ignore_eos=True)],
                         ids=["greedy", "sampled"])
def test_drafted_decoding_gives_plain_decodings_tokens_and_logprobs_and_frees_every_block(
        tiny_gguf: Path, sampling: dict[str, Any]) -> None:
    """Repetitive prompts (a random model soon repeats itself too), decoded with and without drafting,
    alone and two at a time: the same tokens (greedy: those of a full forward pass; sampled: those
    each request's seed gives) and logprobs; drafts were taken and some kept, and no block stays held."""
    rng = np.random.default_rng(3)
    prompts = [rng.integers(3, 200, 6).tolist() * 4, rng.integers(3, 200, 9).tolist() * 3]

    async def go(speculative_tokens: int) -> tuple[list[list[int]], list[list[float]], int, int]:
        executor = await started(tiny_gguf, speculative_tokens=speculative_tokens, speculative_sampling=True,
                                 max_batch=8)
        requests = [Request(id=f"r{i}", model=executor.model.id, prompt_token_ids=p, sampling=SamplingParams(
            max_tokens=40, logprobs=True, top_logprobs=2, seed=i, **sampling)) for i, p in enumerate(prompts)]
        outputs = [await collect(executor, requests[0])]
        outputs += await asyncio.gather(*(collect(executor, r) for r in requests))
        state = executor.state()
        assert state.kv_blocks_used == 0
        drafted, accepted = state.draft_tokens, state.accepted_draft_tokens
        await executor.stop()
        return ([tokens_of(o) for o in outputs], [[lp for c in o for lp in c.logprobs or ()] for o in outputs],
                drafted, accepted)

    plain, plain_logprobs, none_drafted, _ = asyncio.run(go(0))
    drafted, drafted_logprobs, count, accepted = asyncio.run(go(4))
    assert none_drafted == 0
    assert 0 < accepted < count, "some drafts kept, some refused: both paths taken"
    assert drafted == plain
    greedy = greedy_reference(tiny_gguf, prompts[0], 40)
    assert plain[0] == greedy if sampling is GREEDY else plain[0] != greedy
    np.testing.assert_allclose(drafted_logprobs, plain_logprobs, atol=1e-4)


def test_a_finished_stream_has_freed_its_blocks_when_its_client_sees_the_end(tiny_gguf: Path) -> None:
    """Freeing is made slow here: the last chunk still waits for it, so a client (or a router reading
    the executor's state) that sees a request end never counts its blocks as held."""
    async def go() -> list[int]:
        executor = await started(tiny_gguf)
        scheduler = executor.engine.scheduler
        remove = scheduler.remove

        def slow_remove(seq: Any) -> bool:
            time.sleep(0.2)
            return remove(seq)

        scheduler.remove = slow_remove  # type: ignore[method-assign]
        held = []
        for i, max_tokens in enumerate((1, 5)):
            request = Request(id=f"r{i}", model=executor.model.id, prompt="a b c d e f " * 3,
                              sampling=SamplingParams(max_tokens=max_tokens, **GREEDY))
            async for chunk in executor.generate(request):
                if chunk.finish_reason is not None:
                    held.append(executor.state().kv_blocks_used)
        await executor.stop()
        return held

    assert run(go) == [0, 0]


def test_seed_gives_the_same_tokens_whatever_shares_the_batch(tiny_gguf: Path) -> None:
    sampling = SamplingParams(max_tokens=10, temperature=1.0, top_p=0.9, seed=1234, ignore_eos=True)

    async def go() -> list[list[int]]:
        executor = await started(tiny_gguf)
        alone = await collect(executor, Request(id="a", model=executor.model.id, prompt="the cat", sampling=sampling))
        crowd = [Request(id=f"n{i}", model=executor.model.id, prompt="noise " * i,
                         sampling=SamplingParams(max_tokens=10, temperature=1.0)) for i in range(1, 4)]
        together = await asyncio.gather(
            collect(executor, Request(id="b", model=executor.model.id, prompt="the cat", sampling=sampling)),
            *(collect(executor, r) for r in crowd))
        unseeded = await asyncio.gather(*(collect(executor, Request(
            id=f"u{i}", model=executor.model.id, prompt="the cat",
            sampling=SamplingParams(max_tokens=10, temperature=1.0, ignore_eos=True))) for i in range(2)))
        await executor.stop()
        return [tokens_of(alone), tokens_of(together[0]), *map(tokens_of, unseeded)]

    alone, together, first, second = run(go)
    assert alone == together
    assert first != second, "without a seed two requests should differ"


def test_forked_choices_read_the_first_ones_prompt_and_sample_as_they_would_alone(tiny_gguf: Path) -> None:
    """Three choices of a 42-token prompt (core's forks, as for n = 3): the second and third start
    from the first's whole prompt blocks (40 tokens, reported as cached), each samples what its
    seed gives it alone, and once they end, or their merged stream is closed early, no block is
    held or shared."""
    prompt = np.random.default_rng(1).integers(3, 200, 42).tolist()
    request = Request(id="r", model="tiny", prompt_token_ids=prompt, n=3,
                      sampling=SamplingParams(max_tokens=12, temperature=1.0, seed=7, ignore_eos=True))

    async def idle(executor: JaxExecutor) -> tuple[int, dict[int, int]]:
        for _ in range(1000):  # aborts are applied at the engine's next step boundary
            if executor.state().kv_blocks_used == 0:
                break
            await asyncio.sleep(0.01)
        return executor.state().kv_blocks_used, executor.engine.scheduler.blocks.readers

    async def go() -> tuple[list[list[TokenChunk]], list[list[TokenChunk]], tuple[int, dict[int, int]],
                            tuple[int, dict[int, int]]]:
        executor = await started(tiny_gguf, block_size=4)
        alone = [await collect(executor, attrs.evolve(one, id=f"alone-{i}", fork_of=None))
                 for i, one in enumerate(fork(request))]
        forked = await asyncio.gather(*(collect(executor, one) for one in fork(request)))
        after_end = await idle(executor)
        merged = merge([executor.generate(one) for one in fork(attrs.evolve(request, id="q"))])
        await anext(merged)
        await merged.aclose()
        after_close = await idle(executor)
        await executor.stop()
        return alone, forked, after_end, after_close

    alone, forked, after_end, after_close = run(go)
    assert list(map(tokens_of, forked)) == list(map(tokens_of, alone))
    assert len({tuple(tokens_of(c)) for c in forked}) == 3, "different seeds should give different choices"
    assert [c[-1].usage.cached_tokens for c in forked] == [0, 40, 40]
    assert [c[-1].usage.cached_tokens for c in alone] == [0, 0, 0]
    assert after_end == (0, {}) and after_close == (0, {})


def test_stops_logprobs_and_chat(tiny_gguf: Path) -> None:
    async def go() -> dict[str, list[TokenChunk]]:
        executor = await started(tiny_gguf)
        model = executor.model.id
        free = await collect(executor, Request(id="f", model=model, prompt="in the", sampling=SamplingParams(
            max_tokens=20, **GREEDY)))
        text = "".join(c.text for c in free)
        stop_word = text[len(text) // 2: len(text) // 2 + 2]
        out = {
            "free": free,
            "stop_string": await collect(executor, Request(id="s", model=model, prompt="in the", sampling=SamplingParams(
                max_tokens=20, stop=[stop_word], **GREEDY))),
            "stop_token": await collect(executor, Request(id="t", model=model, prompt="in the", sampling=SamplingParams(
                max_tokens=20, stop_token_ids=[free[3].token_ids[0]], **GREEDY))),
            "logprobs": await collect(executor, Request(id="l", model=model, prompt="in the", sampling=SamplingParams(
                max_tokens=3, logprobs=True, top_logprobs=4, **GREEDY))),
            "chat": await collect(executor, Request(id="c", model=model, messages=[
                ChatMessage(role="user", content="hi")], sampling=SamplingParams(max_tokens=2, **GREEDY))),
        }
        out["stop_word"] = stop_word  # type: ignore[assignment]
        await executor.stop()
        return out

    out = run(go)
    free_text = "".join(c.text for c in out["free"])
    stopped = "".join(c.text for c in out["stop_string"])
    assert out["stop_string"][-1].finish_reason == "stop"
    assert stopped == free_text[: free_text.index(out["stop_word"])]
    assert tokens_of(out["stop_token"]) == tokens_of(out["free"])[:4] and out["stop_token"][-1].finish_reason == "stop"
    assert out["free"][-1].finish_reason == "length" and out["free"][-1].usage.completion_tokens == 20
    for chunk in out["logprobs"]:
        assert len(chunk.top_logprobs[0]) == 4 and chunk.top_logprobs[0][0].token_id == chunk.token_ids[0]
        assert chunk.logprobs[0] == pytest.approx(chunk.top_logprobs[0][0].logprob) and chunk.logprobs[0] < 0
    assert out["chat"][-1].usage.prompt_tokens > 5, "the chat template wraps the message"


def test_closed_streams_free_their_blocks(tiny_gguf: Path) -> None:
    async def go() -> tuple[int, int]:
        executor = await started(tiny_gguf)
        streams = [executor.generate(Request(id=f"a{i}", model=executor.model.id, prompt="a b c d e f " * 3,
                                             sampling=SamplingParams(max_tokens=60, **GREEDY))) for i in range(8)]
        for stream in streams:
            await stream.__anext__()
        busy = executor.state().kv_blocks_used
        assert executor.state().tokens_per_s > 0
        for stream in streams:
            await stream.aclose()
        for _ in range(1000):  # aborts are applied at the engine's next step boundary
            if executor.state().kv_blocks_used == 0:
                break
            await asyncio.sleep(0.01)
        idle = executor.state()
        await executor.stop()
        assert idle.outstanding_requests == 0 and idle.queue_depth == 0
        return busy, idle.kv_blocks_used

    busy, idle = run(go)
    assert busy > 0 and idle == 0


def test_bad_requests_get_clear_errors(tiny_gguf: Path) -> None:
    async def go() -> None:
        executor = await started(tiny_gguf)
        model = executor.model.id
        with pytest.raises(ContextLengthError, match="maximum context length is 128"):
            executor.generate(Request(id="x", model=model, prompt_token_ids=[5] * 100,
                                      sampling=SamplingParams(max_tokens=40)))
        with pytest.raises(InvalidRequestError, match=r"token ids must be in \[0, "):
            executor.generate(Request(id="x", model=model, prompt_token_ids=[10**6]))
        with pytest.raises(InvalidRequestError, match="empty"):
            executor.generate(Request(id="x", model=model, prompt=""))
        await executor.stop()
        # One batch slot, held by a long request; a second one waits; a third finds the queue full.
        executor = await started(tiny_gguf, max_batch=1, max_queue=1, max_model_len=256)
        first = executor.generate(Request(id="a", model=model, prompt="a", sampling=SamplingParams(
            max_tokens=250, **GREEDY)))
        await first.__anext__()
        second = executor.generate(Request(id="b", model=model, prompt="b", sampling=SamplingParams(max_tokens=5)))
        waiting = asyncio.ensure_future(second.__anext__())
        while executor.engine.num_waiting < 1:
            await asyncio.sleep(0.001)
        with pytest.raises(ServiceUnavailableError, match="queue is full"):  # no await since the check
            executor.generate(Request(id="c", model=model, prompt="c"))
        await first.aclose()
        await waiting
        await second.aclose()
        await executor.stop()

    run(go)


def test_a_request_that_waits_past_max_queue_wait_s_fails_and_an_overloaded_queue_refuses_at_once(
        tiny_gguf: Path) -> None:
    """One batch slot, held by a long request: a second one waits past its ``max_queue_wait_s`` (the
    client's, tighter than the executor's) and gets 503 ``queue_timeout`` (holding no KV block,
    nothing left queued); once requests have started at a known rate, a queue that means a longer
    wait than the executor's bound refuses a new one at once."""
    async def go() -> None:
        executor = await started(tiny_gguf, max_batch=1, max_model_len=256, max_queue_wait_s=5.0)
        model = executor.model.id
        decode = executor.engine.runner.decode

        def slow_decode(*args: Any) -> Any:  # a model slow enough that the first request outlasts the bound
            time.sleep(0.02)
            return decode(*args)

        executor.engine.runner.decode = slow_decode
        first = executor.generate(Request(id="a", model=model, prompt="a", sampling=SamplingParams(
            max_tokens=250, **GREEDY)))
        await first.__anext__()
        blocks = executor.state().kv_blocks_used
        loop = asyncio.get_running_loop()
        submitted = loop.time()
        with pytest.raises(ServiceUnavailableError) as failed:
            await collect(executor, Request(id="b", model=model, prompt="b", sampling=SamplingParams(max_tokens=5),
                                            max_queue_wait_s=0.3))
        waited = loop.time() - submitted
        assert failed.value.code == "queue_timeout" and failed.value.retry_after == 0.3
        assert 0.3 <= waited < 2.0, waited
        state = executor.state()
        assert state.queue_depth == 0 and executor.engine.queue_timeouts == 1
        assert state.kv_blocks_used <= blocks + 1  # the running request's growth only
        executor.engine._submitted += 3
        assert executor.engine.expected_wait_s() == 0.0, "one start says nothing of the rate yet"
        executor.engine._submitted -= 3
        # the last requests started 2 s apart and 3 are queued: a new one would wait about 6 s
        executor.engine.starts = SpacedRate()
        for i in range(4):
            executor.engine.starts.add(100.0 + 2 * i)
        executor.engine._submitted += 3
        with pytest.raises(ServiceUnavailableError, match="overloaded") as refused:
            executor.generate(Request(id="c", model=model, prompt="c"))
        assert refused.value.code == "overloaded" and 5 < refused.value.retry_after < 7
        executor.engine._submitted -= 3
        await first.aclose()
        await executor.stop()

    run(go)


def test_steady_state_serving_compiles_nothing_new(tiny_gguf: Path) -> None:
    """Every shape is compiled while the executor starts: a varied workload (prompt lengths, batch
    sizes, sampling modes, logprobs) then triggers no XLA compilation at all."""
    compiles: list[str] = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda name, duration, **kw: compiles.append(name) if name.endswith("backend_compile_duration") else None)
    rng = np.random.default_rng(3)
    workload = [
        Request(id=f"w{i}", model="tiny-llama", prompt_token_ids=rng.integers(3, 200, int(n)).tolist(),
                sampling=SamplingParams(max_tokens=int(m), temperature=float(t), top_k=int(k), logprobs=bool(lp),
                                        top_logprobs=3 if lp else 0, ignore_eos=True))
        for i, (n, m, t, k, lp) in enumerate(zip(rng.integers(1, 70, 12), rng.integers(1, 30, 12),
                                                 rng.choice([0.0, 0.8], 12), rng.choice([0, 5], 12),
                                                 rng.choice([False, True], 12), strict=True))
    ]

    async def go() -> int:
        executor = await started(tiny_gguf, max_batch=8)
        before = len(compiles)
        for group in (workload[:1], workload[1:4], workload[4:]):
            await asyncio.gather(*(collect(executor, r) for r in group))
        await executor.stop()
        return len(compiles) - before

    assert run(go) == 0


def test_a_missing_model_file_is_a_config_error() -> None:
    with pytest.raises(ValueError, match="no GGUF file and no Hugging Face model directory .* at '/no/such.gguf'"):
        JaxOptions(model="/no/such.gguf")


def test_the_kv_budget_is_a_share_of_the_free_memory_of_the_fullest_device() -> None:
    gib = 2**30
    stats = [{"bytes_limit": 80 * gib, "bytes_in_use": 20 * gib}, {"bytes_limit": 80 * gib, "bytes_in_use": 30 * gib}]
    assert kv_budget(stats, 0.5) == 25 * gib
    assert kv_budget(stats[:1], 0.9) == int(0.9 * 60 * gib)
    assert kv_budget([{"bytes_limit": gib, "bytes_in_use": 2 * gib}], 0.9) == 0
    assert kv_budget([*stats, None], 0.9) is None and kv_budget([], 0.9) is None


class FakeAccelerator:
    """A GPU as `JaxExecutor._kv_blocks` sees one: its platform and its memory statistics."""

    platform = "gpu"

    def __init__(self, free_mib: float | None) -> None:
        self.free_mib = free_mib

    def memory_stats(self) -> dict[str, int] | None:
        if self.free_mib is None:
            return None
        return {"bytes_limit": 2**40, "bytes_in_use": 2**40 - int(self.free_mib * 2**20)}


@pytest.mark.parametrize(("free_mib", "options", "blocks", "sized_by"), [
    ([64], {"kv_memory_fraction": 0.5}, 4096, {"kv_memory_fraction": 0.5, "kv_mib_per_device": 32.0}),
    ([64], {}, int(0.9 * 64 * 2**20) // 8192, {"kv_memory_fraction": 0.9, "kv_mib_per_device": 57.6}),
    ([64, 32], {"kv_memory_fraction": 0.5}, 4096,  # each device holds half of each block
     {"kv_memory_fraction": 0.5, "kv_mib_per_device": 16.0}),
    ([0], {}, 8, {"kv_memory_fraction": 0.9, "kv_mib_per_device": 0.0}),  # still one 128-token sequence
    ([64], {"kv_cache_mb": 1}, 128, {"kv_cache_mb": 1}),
    ([None], {}, 65536, {"kv_cache_mb": 512}),  # a device without memory statistics: 512 MiB
], ids=["fraction", "default", "split", "full", "kv_cache_mb", "no-stats"])
def test_on_an_accelerator_the_kv_cache_takes_a_share_of_the_memory_left_free(
        tiny_gguf: Path, monkeypatch: pytest.MonkeyPatch, free_mib: list[float | None], options: dict[str, float],
        blocks: int, sized_by: dict[str, float]) -> None:
    """A block of the tiny model holds 16 float32 positions of 2 layers' 2 KV heads of 16: 8 KiB,
    split by KV head over 2 devices."""
    monkeypatch.setattr("lamina_jax.executor._devices", lambda mesh: [FakeAccelerator(f) for f in free_mib])
    mesh = None if len(free_mib) == 1 else SimpleNamespace(size=len(free_mib))
    executor = executor_for(tiny_gguf, **{"kv_cache_mb": None, **options})
    assert executor._kv_blocks(tiny_config(), 128, mesh) == (blocks, sized_by)


def test_kv_memory_fraction_is_a_share_beside_no_kv_cache_mb() -> None:
    for bad in (0, 1.5):
        with pytest.raises(ValueError, match="kv_memory_fraction"):
            JaxOptions(kv_memory_fraction=bad)
    with pytest.raises(ValueError, match="kv_cache_mb and kv_memory_fraction both size the KV cache"):
        JaxOptions(kv_cache_mb=64, kv_memory_fraction=0.5)


def test_the_decoding_prefill_chunk_is_at_most_the_prefill_chunk() -> None:
    with pytest.raises(ValueError, match=r"decoding_prefill_chunk \(512\) is over prefill_chunk \(256\)"):
        JaxOptions(decoding_prefill_chunk=512)
    with pytest.raises(ValueError, match="decoding_prefill_chunk"):
        JaxOptions(decoding_prefill_chunk=8)
    assert JaxOptions(prefill_chunk=64, decoding_prefill_chunk=64).decoding_prefill_chunk == 64


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="refused on the CPU backend only")
def test_kv_memory_fraction_is_refused_on_the_cpu(tiny_gguf: Path) -> None:
    with pytest.raises(ValueError, match="kv_memory_fraction = 0.5 sizes the KV cache on a GPU or TPU, and JAX "
                                         "runs on the CPU here: set kv_cache_mb instead"):
        run(executor_for(tiny_gguf, kv_cache_mb=None, kv_memory_fraction=0.5).start)


@pytest.mark.parametrize("fmt", ["bfloat16", "int8", *(pytest.param(f, marks=pytest.mark.skipif(
    cpu_kernels_absent(), reason="no ggml kernel")) for f in ("q4_1", "q4_1-f32"))])
def test_low_precision_weights_serve_the_same_greedy_start(tiny_gguf: Path, fmt: str) -> None:
    """Weights held in bfloat16, int8 or ggml's Q4_1 blocks (chosen in the stack file) run the same
    code path; on this tiny model the first greedy tokens agree with float32."""
    from lamina_jax.model.ggml import GgmlWeight
    from lamina_jax.model.llama import Int8Weight

    request = Request(id="b", model="tiny-llama", prompt="in the", sampling=SamplingParams(max_tokens=3, **GREEDY))

    async def go(dtype: str) -> list[int]:
        executor = await started(tiny_gguf, weights_dtype=dtype)
        try:
            params = executor.engine.runner.params
            if dtype.startswith("q4_1"):  # the matrices in Q4_1 blocks, the output head in Q8_0, the embedding gathered
                assert {w.kind for w in (params.layers[0].wq, params.layers[1].w_down)} == {"q4_1"}
                assert isinstance(params.lm_head, GgmlWeight) and params.lm_head.kind == "q8_0"
                assert params.embed.dtype == jnp.float32
            elif dtype == "int8":
                assert isinstance(params.embed, Int8Weight)
            else:
                assert params.embed.dtype == jnp.dtype(dtype)
            return tokens_of(await collect(executor, request))
        finally:
            await executor.stop()

    assert run(lambda: go(fmt))[:2] == run(lambda: go("float32"))[:2]


def test_auto_weights_serve_each_shape_in_the_format_measured_fastest(tiny_gguf: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """``weights_dtype = "auto"`` times the formats on a float32 probe of the first layers, then reads
    the model once in each dtype the measurement chose, and runs every shape in its own format;
    here the measurement is made to prefer bfloat16 computed in float32 below 16 rows and native
    bfloat16 from 16 on (so float32 weights are not held at all)."""
    from lamina_jax import weight_formats

    def measured(params: LlamaParams, row_counts: list[int], formats: tuple[str, ...],
                 n_layers: int) -> dict[int, dict[str, float]]:
        assert row_counts == sorted(row_counts) and row_counts[0] == 1 and "int8" not in formats
        assert len(params.layers) == 1 < n_layers, "a probe of one layer"
        return {rows: {"float32": 1.0, "bfloat16": 2.0 if rows < 16 else 0.5, "bfloat16-f32": 0.7}
                for rows in row_counts}

    reads: list[tuple[str, int | None]] = []
    load_params = ModelFiles.load_params

    def read(files: ModelFiles, progress: object, dtype: str, place: object, layers: int | None) -> LlamaParams:
        reads.append((dtype, layers))
        return load_params(files, progress, dtype, place, layers)

    monkeypatch.setattr(weight_formats, "measure", measured)
    monkeypatch.setattr(weight_formats, "PROBE_BYTES", 1)
    monkeypatch.setattr(ModelFiles, "load_params", read)
    request = Request(id="a", model="tiny-llama", prompt="in the", sampling=SamplingParams(max_tokens=3, **GREEDY))

    async def go() -> tuple[object, list[int]]:
        executor = await started(tiny_gguf, weights_dtype="auto", max_batch=32)
        try:
            return executor.engine.runner, tokens_of(await collect(executor, request))
        finally:
            await executor.stop()

    runner, output = run(go)
    # rows 1..8 (decode only) take bfloat16-f32; 16..256 (decode and prefill), the majority, bfloat16
    assert runner.params.embed.dtype == jnp.bfloat16 and runner.config.matmul_dtype is None
    assert {shape: (p.embed.dtype, c.matmul_dtype) for shape, (p, c) in runner.shape_weights.items()} == {
        ("decode", rows): (jnp.bfloat16, "float32") for rows in (1, 2, 4, 8)}
    assert runner.shape_weights[("decode", 1)][0] is runner.params, "one bfloat16 copy serves both formats"
    assert reads == [("float32", 1), ("bfloat16", None)], \
        "a float32 probe, then the model read once, as bfloat16: never whole in float32"
    assert len(output) == 3


def test_the_format_measurement_times_every_format() -> None:
    from lamina_jax import weight_formats
    from lamina_jax.testing import random_weights, tiny_config, to_params

    params = to_params(random_weights(tiny_config(), seed=0))
    formats = weight_formats.auto(params)
    assert set(formats) == {"float32", "bfloat16", "bfloat16-f32"}
    timings = weight_formats.measure(params, [1, 16], formats, len(params.layers))
    assert set(timings) == {1, 16} and all(set(t) == set(formats) for t in timings.values())
    assert all(seconds > 0 for t in timings.values() for seconds in t.values())
    assert weight_formats.fastest({1: {"float32": 2.0, "bfloat16": 1.0}}) == {1: "bfloat16"}


def test_the_format_measurement_scales_the_timed_layers_to_the_model_and_drops_formats_far_behind(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An estimate is the median layer time times the model's depth over the probe's, plus the head's; a
    format more than `DROP_BEHIND` times the fastest after the first round is not timed again."""
    from lamina_jax import weight_formats
    from lamina_jax.testing import random_weights, tiny_config, to_params

    params = to_params(random_weights(tiny_config(), seed=0))
    per_call = {"float32": (0.010, 0.004), "bfloat16": (0.012, 0.001), "bfloat16-f32": (0.5, 0.1)}
    calls: list[str] = []

    by_pair = {pair: fmt for fmt, pair in weight_formats.FORMATS.items()}

    def timed(held: LlamaParams, x: object, matmul_dtype: str | None) -> tuple[list[float], list[float]]:
        fmt = by_pair[(str(held.head.dtype), matmul_dtype)]
        calls.append(fmt)
        layer, head = per_call[fmt]
        return [layer] * weight_formats.CALLS, [head] * weight_formats.CALLS

    monkeypatch.setattr(weight_formats, "_time_format", timed)
    timings = weight_formats.measure(attrs.evolve(params, layers=params.layers[:1]), [4], tuple(per_call), 2)
    assert timings[4] == pytest.approx({"float32": 0.024, "bfloat16": 0.025, "bfloat16-f32": 1.1})
    assert calls.count("bfloat16-f32") == 1
    assert calls.count("float32") == calls.count("bfloat16") == weight_formats.ROUNDS
    assert weight_formats.fastest(timings) == {4: "float32"}


def test_bfloat16_computed_in_float32_is_close_to_float32(tiny_gguf: Path) -> None:
    """The ``bfloat16-f32`` format rounds only the weights: the first greedy tokens agree."""
    request = Request(id="b", model="tiny-llama", prompt="in the", sampling=SamplingParams(max_tokens=3, **GREEDY))

    async def go(fmt: str) -> list[int]:
        executor = await started(tiny_gguf, weights_dtype=fmt)
        try:
            return tokens_of(await collect(executor, request))
        finally:
            await executor.stop()

    assert run(lambda: go("bfloat16-f32"))[:2] == run(lambda: go("float32"))[:2]


def penalized_greedy(path: Path, prompt: list[int], count: int, *, presence: float, frequency: float,
                     repetition: float) -> list[int]:
    """Greedy continuation with vLLM's penalty formulas applied to full forward passes' logits."""
    model = load_gguf(path)
    tokens = list(prompt)
    for _ in range(count):
        logits = np.asarray(forward(model.params, jnp.asarray(tokens + [0] * (128 - len(tokens))),
                                    config=model.config)[len(tokens) - 1], np.float64)
        for token in set(tokens):
            logits[token] = logits[token] / repetition if logits[token] > 0 else logits[token] * repetition
        outputs = tokens[len(prompt):]
        for token in set(outputs):
            logits[token] -= frequency * outputs.count(token) + presence
        tokens.append(int(np.argmax(logits)))
    return tokens[len(prompt):]


def test_penalties_logit_bias_and_min_tokens_through_the_executor(tiny_gguf: Path) -> None:
    prompt = [5, 9, 14, 9, 5, 22, 31]
    penalties = dict(presence_penalty=0.7, frequency_penalty=0.4, repetition_penalty=1.8)

    async def go() -> list[list[int]]:
        executor = await started(tiny_gguf, max_batch=4)
        eos = executor.tokenizer.eos_id
        requests = [
            Request(id="pen", model="m", prompt_token_ids=prompt,
                    sampling=SamplingParams(max_tokens=12, **GREEDY, **penalties)),
            Request(id="plain", model="m", prompt_token_ids=prompt, sampling=SamplingParams(max_tokens=12, **GREEDY)),
            Request(id="bias", model="m", prompt_token_ids=prompt,
                    sampling=SamplingParams(max_tokens=5, temperature=0.9, seed=3, logit_bias=((42, 100.0),))),
            Request(id="eos-now", model="m", prompt_token_ids=prompt,
                    sampling=SamplingParams(max_tokens=8, temperature=0.0, logit_bias=((eos, 100.0),))),
            Request(id="eos-later", model="m", prompt_token_ids=prompt,
                    sampling=SamplingParams(max_tokens=8, temperature=0.0, logit_bias=((eos, 100.0),), min_tokens=3)),
        ]
        results = await asyncio.gather(*(collect(executor, r) for r in requests))
        with pytest.raises(InvalidRequestError, match="logit_bias: token ids must be below"):
            executor.generate(Request(id="x", model="m", prompt_token_ids=prompt,
                                      sampling=SamplingParams(logit_bias=((10**6, 1.0),))))
        await executor.stop()
        assert results[3][-1].finish_reason == results[4][-1].finish_reason == "stop"
        return [tokens_of(chunks) for chunks in results]

    penalized, plain, biased, eos_now, eos_later = run(go)
    assert penalized == penalized_greedy(tiny_gguf, prompt, 12, presence=0.7, frequency=0.4, repetition=1.8)
    assert penalized != plain and len(set(penalized)) >= len(set(plain))
    assert biased == [42] * 5
    eos = eos_now[0]
    assert eos_now == [eos] and len(eos_later) == 4 and eos not in eos_later[:3] and eos_later[3] == eos
