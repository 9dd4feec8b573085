"""A request for ``n`` choices: forked into ``n`` requests of one choice, their streams merged.

The first fork keeps the request's id; fork ``i`` is ``{id}-{i}`` with ``fork_of`` naming the first,
so an executor may compute the shared prompt once (see :class:`~lamina_hookspecs.types.Request`).
With a ``seed``, choice ``i`` samples with ``seed + i``: the choices differ from one another, and
the same request gets the same choices again.

The merged stream interleaves the forks' chunks as they come, each marked with its ``choice``; a
choice's last chunk has ``more`` set while others still run, and the stream's final chunk carries
the usage of the whole request: the prompt once (as the first choice computed it), the completion
tokens of every choice. Closing it closes every fork's stream (their executors free their work).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import attrs

from lamina_hookspecs.types import Request, TokenChunk, Usage


def fork(request: Request) -> list[Request]:
    """The ``n`` one-choice requests of ``request`` (``[request]`` when it asks for one)."""
    if request.n == 1:
        return [request]
    seed = request.sampling.seed
    return [attrs.evolve(request, n=1) if i == 0 else
            attrs.evolve(request, n=1, id=f"{request.id}-{i}", fork_of=request.id,
                         sampling=attrs.evolve(request.sampling, seed=None if seed is None else seed + i))
            for i in range(request.n)]


def total_usage(usages: Sequence[Usage]) -> Usage:
    """One request's usage from its choices' (the first choice's first): the prompt counted once."""
    first = usages[0]
    return attrs.evolve(first, completion_tokens=sum(u.completion_tokens for u in usages))


async def merge(streams: Sequence[AsyncIterator[TokenChunk]]) -> AsyncIterator[TokenChunk]:
    """The chunks of ``streams`` (choice ``i`` is ``streams[i]``) as one stream; see the module's doc.

    A stream that raises fails the merged one (and closes the others)."""
    queue: asyncio.Queue[tuple[int, TokenChunk | Exception | None]] = asyncio.Queue()

    async def pump(choice: int, stream: AsyncIterator[TokenChunk]) -> None:
        try:
            async for chunk in stream:
                queue.put_nowait((choice, chunk))
            queue.put_nowait((choice, None))
        except Exception as error:  # a LaminaError from the executor, raised below in the reader's task
            queue.put_nowait((choice, error))

    pumps = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    running, usages = set(range(len(streams))), {}
    try:
        while running:
            choice, item = await queue.get()
            if isinstance(item, Exception):
                raise item
            if item is None:
                running.discard(choice)
                continue
            if item.finish_reason is not None:
                running.discard(choice)
                if item.usage is not None:
                    usages[choice] = item.usage
                usage = total_usage([usages[i] for i in sorted(usages)]) if not running and usages else None
                item = attrs.evolve(item, choice=choice, more=bool(running), usage=usage)
            else:
                item = attrs.evolve(item, choice=choice)
            yield item
    finally:
        for task in pumps:
            task.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)
        for stream in streams:
            await stream.aclose()  # type: ignore[attr-defined]
