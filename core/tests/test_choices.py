"""A request for n choices: its forks, and their streams merged into one."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from lamina_hookspecs.errors import ServiceUnavailableError
from lamina_hookspecs.types import Request, SamplingParams, TokenChunk, Usage

from lamina.kernel.choices import fork, merge


def test_forks_keep_the_first_id_and_seed_and_count_up_from_them() -> None:
    request = Request(id="r", model="m", prompt="x", n=3, sampling=SamplingParams(seed=41, max_tokens=5))
    forks = fork(request)
    assert [(f.id, f.fork_of, f.sampling.seed, f.n) for f in forks] == [
        ("r", None, 41, 1), ("r-1", "r", 42, 1), ("r-2", "r", 43, 1)]
    assert all(f.prompt == "x" and f.sampling.max_tokens == 5 for f in forks)
    unseeded = fork(Request(id="u", model="m", prompt="x", n=2))
    assert [f.sampling.seed for f in unseeded] == [None, None]
    single = Request(id="s", model="m", prompt="x")
    assert fork(single) == [single]


class Replies:
    """Streams of scripted chunks, each waiting on its own event between chunks; records closing."""

    def __init__(self) -> None:
        self.closed: list[int] = []

    async def reply(self, choice: int, tokens: int, gate: asyncio.Event | None = None,
                    fail: bool = False) -> AsyncIterator[TokenChunk]:
        try:
            for i in range(tokens):
                if gate is not None:
                    await gate.wait()
                yield TokenChunk(request_id="r", index=i, token_ids=(100 * choice + i,), text=f"{choice}.{i} ")
            if fail:
                raise ServiceUnavailableError("gone", code="queue_full")
            yield TokenChunk(request_id="r", index=tokens, finish_reason="length",
                             usage=Usage(prompt_tokens=7, completion_tokens=tokens, cached_tokens=7 * choice))
        finally:
            self.closed.append(choice)


def test_merged_choices_end_once_with_the_usage_of_all() -> None:
    async def go() -> tuple[list[TokenChunk], list[int]]:
        replies = Replies()
        chunks = [c async for c in merge([replies.reply(0, 3), replies.reply(1, 1), replies.reply(2, 2)])]
        return chunks, replies.closed

    chunks, closed = asyncio.run(go())
    assert sorted(closed) == [0, 1, 2]
    for choice, tokens in ((0, 3), (1, 1), (2, 2)):
        mine = [c for c in chunks if c.choice == choice]
        assert [t for c in mine for t in c.token_ids] == [100 * choice + i for i in range(tokens)]
        assert mine[-1].finish_reason == "length" and all(c.finish_reason is None for c in mine[:-1])
    ends = [c for c in chunks if c.finish_reason is not None]
    assert [c.more for c in ends] == [True, True, False] and chunks[-1] is ends[-1] and chunks[-1].is_final
    assert [c.usage for c in ends[:2]] == [None, None]
    assert chunks[-1].usage == Usage(prompt_tokens=7, completion_tokens=6, cached_tokens=0)


def test_closing_the_merged_stream_closes_every_choice() -> None:
    async def go() -> list[int]:
        replies, gate = Replies(), asyncio.Event()
        merged = merge([replies.reply(0, 1), replies.reply(1, 5, gate), replies.reply(2, 5, gate)])
        first = await anext(merged)
        assert first.choice == 0
        await merged.aclose()  # type: ignore[attr-defined]
        return replies.closed

    assert sorted(asyncio.run(go())) == [0, 1, 2]


def test_a_failing_choice_fails_the_stream_and_closes_the_others() -> None:
    async def go() -> list[int]:
        replies, gate = Replies(), asyncio.Event()
        with pytest.raises(ServiceUnavailableError, match="gone"):
            async for _ in merge([replies.reply(0, 5, gate), replies.reply(1, 1, fail=True)]):
                pass
        return replies.closed

    assert sorted(asyncio.run(go())) == [0, 1]
