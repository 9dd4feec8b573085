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
