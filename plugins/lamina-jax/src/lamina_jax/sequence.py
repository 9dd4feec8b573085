"""A request inside the engine: its tokens, its KV blocks, how much of it is computed."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import attrs

from lamina_hookspecs.types import PrefixMatch, SamplingParams
from lamina_jax.structured_output import Matcher


@attrs.define(eq=False)
class Sequence:
    """One request inside the engine; ``key`` is its sampling PRNG key, ``emit`` delivers its output,
    ``salt`` isolates its prefix-cache entries (its tenant), ``match`` pins the cached prefix it reads,
    ``matcher`` (under structured output) is the grammar state its output has reached.

    ``num_computed`` tokens of ``prompt_ids + output_ids`` have their K/V in ``blocks``. A
    decoding sequence has all but its last token computed; that token is the next input.
    ``queue_s`` is how long it waited from submission to its first prefill chunk; one that has not
    started ``max_queue_wait_s`` after submission is failed (`Scheduler.expire`). A ``warm``
    sequence computes a pre-warm prefix for the cache; nobody reads its output. A sequence with a
    ``fork_of`` (another choice of the same request, `n` > 1) starts once that one's prompt is
    computed, reading its whole blocks instead of computing them again.
    """

    request_id: str
    prompt_ids: list[int]
    sampling: SamplingParams
    emit: Callable[[object], None]
    key: Any = None
    salt: bytes = b""
    match: PrefixMatch | None = None
    matcher: Matcher | None = None
    cached_tokens: int = 0
    output_ids: list[int] = attrs.field(factory=list)
    blocks: list[int] = attrs.field(factory=list)
    num_computed: int = 0
    submitted_at: float = attrs.field(factory=time.monotonic)
    queue_s: float | None = None
    max_queue_wait_s: float | None = None
    warm: bool = False
    fork_of: Sequence | None = None
    end_ids: frozenset[int] = frozenset()
    """The ids that would end it (end of sequence unless ignored, stop tokens): held back by ``min_tokens``."""

    @property
    def tokens(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def prefill_target(self) -> int:
        """Tokens whose K/V must be computed before decoding: the prompt, or after a
        preemption everything but the last generated token."""
        return len(self.prompt_ids) + max(len(self.output_ids) - 1, 0)

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)
