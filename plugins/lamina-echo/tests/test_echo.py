import asyncio

import pytest
from lamina.testing.contracts import ExecutorContract
from lamina_hookspecs.errors import ContextLengthError
from lamina_hookspecs.types import ChatMessage, Request, SamplingParams

from lamina_echo.executor import EchoExecutor, EchoOptions


class TestEchoContract(ExecutorContract):
    registered_name = "echo"


def _collect(executor: EchoExecutor, request: Request) -> list:
    async def run() -> list:
        return [chunk async for chunk in executor.generate(request)]

    return asyncio.run(run())


def test_echoes_words_and_stops() -> None:
    chunks = _collect(EchoExecutor(EchoOptions()), Request(id="r", model="echo", prompt="hello big world",
                                                           sampling=SamplingParams(max_tokens=10)))
    assert "".join(c.text for c in chunks) == "hello big world"
    assert chunks[-1].finish_reason == "stop" and chunks[-1].usage.completion_tokens == 3


def test_chat_echoes_last_message_and_honours_stop_strings() -> None:
    request = Request(id="r", model="echo", messages=[ChatMessage(role="user", content="one two three four")],
                      sampling=SamplingParams(max_tokens=10, stop=["thr"]))
    chunks = _collect(EchoExecutor(EchoOptions()), request)
    assert "".join(c.text for c in chunks) == "one two "
    assert chunks[-1].finish_reason == "stop"


def test_context_length_is_enforced() -> None:
    executor = EchoExecutor(EchoOptions(context_length=4))
    with pytest.raises(ContextLengthError):
        executor.generate(Request(id="r", model="echo", prompt="a b c", sampling=SamplingParams(max_tokens=2)))


def test_cost_model_queues_prefills_caches_prefixes_and_reports_load() -> None:
    options = EchoOptions(prefill_s_per_token=0.002, cache_blocks=8, block_tokens=2, token_delay_s=0.001)
    executor = EchoExecutor(options)
    prompt = " ".join(f"w{i}" for i in range(10))

    def request(tenant: str) -> Request:
        return Request(id="r", model="echo", prompt=prompt, tenant=tenant, sampling=SamplingParams(max_tokens=2))

    async def run() -> tuple[list, list, list, list]:
        first, second = await asyncio.gather(_drain(executor, request("a")), _drain(executor, request("a")))
        seen = []
        stream = executor.generate(request("b"))
        seen.append(executor.state())
        again = [chunk async for chunk in stream]
        return first, second, again, seen

    first, second, other_tenant, _ = asyncio.run(run())
    usages = sorted([first[-1].usage, second[-1].usage], key=lambda u: u.queue_s)
    assert usages[0].cached_tokens == 0 and usages[1].cached_tokens == 10, "the second found the first's blocks"
    assert usages[1].queue_s >= 10 * 0.002 * 0.9, "the second waited for the first's prefill"
    assert other_tenant[-1].usage.cached_tokens == 0, "another tenant's prompt is not a hit"
    state = executor.state()
    assert state.kv_blocks_used == 8 and state.kv_blocks_total == 8, "LRU keeps the cache within its blocks"
    assert state.outstanding_requests == 0 and state.outstanding_tokens == 0 and state.queue_depth == 0


async def _drain(executor: EchoExecutor, request: Request) -> list:
    return [chunk async for chunk in executor.generate(request)]


def test_cost_model_reports_queue_and_outstanding_tokens_while_busy() -> None:
    executor = EchoExecutor(EchoOptions(prefill_s_per_token=0.01))
    prompt = "a b c d e"

    async def run() -> tuple[object, object]:
        streams = [executor.generate(Request(id=str(i), model="echo", prompt=prompt,
                                             sampling=SamplingParams(max_tokens=3))) for i in range(3)]
        tasks = [asyncio.create_task(_consume(s)) for s in streams]
        await asyncio.sleep(0.02)
        busy = executor.state()
        await asyncio.gather(*tasks)
        return busy, executor.state()

    busy, idle = asyncio.run(run())
    assert busy.outstanding_requests == 3 and busy.queue_depth == 2
    assert busy.outstanding_tokens == 3 * (5 + 3), "a prompt counts until its prefill is done, then the output left"
    assert idle.outstanding_tokens == 0 and idle.queue_depth == 0


async def _consume(stream) -> None:
    async for _ in stream:
        pass
