"""Continuous batching: which sequences run in the next engine step.

Every step decodes one token for each running sequence and, beside that, prefills one
chunk of at most ``prefill_chunk`` tokens of the oldest waiting sequence (chunked prefill),
so a long prompt delays running streams by one chunk per step, never by the whole prompt.
New sequences join the running batch as soon as their prompt is in the cache; finished and
aborted ones leave at once and free their blocks.

KV blocks are taken as sequences grow. When a running sequence needs a block and none is
free, the most recently admitted running sequence is preempted: its blocks are freed and
it goes back to the front of the queue, to be recomputed (prompt plus what it already
generated) when memory frees up — vLLM's recompute preemption. Its client sees only a pause.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import attrs

from lamina_hookspecs.types import SamplingParams
from lamina_jax.kv_cache import BlockAllocator, blocks_for


@attrs.define(eq=False)
class Sequence:
    """One request inside the engine; ``key`` is its sampling PRNG key, ``emit`` delivers its output.

    ``num_computed`` tokens of ``prompt_ids + output_ids`` have their K/V in ``blocks``. A
    decoding sequence has all but its last token computed; that token is the next input.
    """

    request_id: str
    prompt_ids: list[int]
    sampling: SamplingParams
    emit: Callable[[object], None]
    key: Any = None
    output_ids: list[int] = attrs.field(factory=list)
    blocks: list[int] = attrs.field(factory=list)
    num_computed: int = 0

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


@attrs.frozen
class PrefillWork:
    """Prefill ``tokens`` (positions ``start`` onwards) of ``seq``; ``last`` if it completes the prompt."""

    seq: Sequence
    start: int
    tokens: list[int]
    last: bool


@attrs.frozen
class Step:
    """What one engine step runs."""

    prefill: PrefillWork | None
    decode: list[Sequence]


class Scheduler:
    """Owns the queue, the running batch and the block allocator; runs on the engine thread."""

    def __init__(self, allocator: BlockAllocator, *, block_size: int, max_batch: int, prefill_chunk: int) -> None:
        self.allocator = allocator
        self.block_size = block_size
        self.max_batch = max_batch
        self.prefill_chunk = prefill_chunk
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def remove(self, seq: Sequence) -> bool:
        """Take a sequence out wherever it is and free its blocks (abort or finish)."""
        for group in (self.running, self.waiting):
            if seq in group:
                group.remove(seq)
                self._release(seq)
                return True
        return False

    def schedule(self) -> Step:
        decode = self._reserve_decode_blocks()
        return Step(prefill=self._next_prefill(len(decode)), decode=decode)

    def finish_prefill(self, work: PrefillWork) -> None:
        """Record a prefilled chunk; a sequence whose prompt is complete joins the running batch."""
        work.seq.num_computed = work.start + len(work.tokens)
        if work.last:
            self.waiting.remove(work.seq)
            self.running.append(work.seq)

    def _grow(self, seq: Sequence, num_tokens: int) -> bool:
        """Make ``seq`` own blocks for ``num_tokens`` positions; False if memory is short."""
        missing = blocks_for(num_tokens, self.block_size) - len(seq.blocks)
        if missing <= 0:
            return True
        blocks = self.allocator.allocate(missing)
        if blocks is None:
            return False
        seq.blocks.extend(blocks)
        return True

    def _reserve_decode_blocks(self) -> list[Sequence]:
        batch = []
        for seq in list(self.running):
            if seq not in self.running:  # preempted below, for an earlier sequence's block
                continue
            while not self._grow(seq, seq.num_computed + 1):
                victim = self.running[-1]
                self._preempt(victim)
                if victim is seq:
                    break
            else:
                batch.append(seq)
        return batch

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self._release(seq)
        if self.waiting:  # only the queue's head holds blocks (a partial prefill): it restarts later
            self._release(self.waiting[0])
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def _release(self, seq: Sequence) -> None:
        self.allocator.free(seq.blocks)
        seq.blocks = []
        seq.num_computed = 0

    def _next_prefill(self, num_decoding: int) -> PrefillWork | None:
        if not self.waiting or num_decoding >= self.max_batch:
            return None
        seq = self.waiting[0]
        start = seq.num_computed
        end = min(start + self.prefill_chunk, seq.prefill_target)
        if not self._grow(seq, end):
            return None
        return PrefillWork(seq=seq, start=start, tokens=seq.tokens[start:end], last=end == seq.prefill_target)
