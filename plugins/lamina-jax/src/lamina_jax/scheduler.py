"""Continuous batching: which sequences run in the next engine step.

Every step decodes one token for each running sequence and, beside that, prefills waiting
sequences in queue order, packed into one call, within a budget of ``prefill_chunk`` tokens
(``decoding_prefill_chunk`` in a step that also decodes, so that running streams pause for less):
at most ``max_prefills`` of them, owning at most ``table_capacity`` blocks together, every one
but the last whole. A long prompt is prefilled in chunks (chunked prefill), so it delays running
streams by one chunk per step, never by the whole prompt, and a burst of short prompts starts
together instead of one per step. New sequences join the running batch as soon as their prompt
is in the cache; finished and aborted ones leave at once and free their blocks.

With a batching policy (the stack's ``[batching]``), at most ``policy.max_prefills`` are packed
instead, and before starting new sequences the scheduler asks ``policy.wait_s``: while it is
positive, no new prefill starts (one already half done continues) and ``hold_s`` says for how
long; running sequences keep decoding meanwhile. The engine reports each step's first-token
latency back to the policy.

KV blocks are taken as sequences grow (the :class:`~lamina_jax.block_manager.BlockManager`
decides which, and hands them to and from the prefix cache). When a running sequence needs a
block and none is free, the most recently admitted running sequence is preempted: its blocks
are freed and it goes back to the front of the queue, to be recomputed (prompt plus what it
already generated) when memory frees up — vLLM's recompute preemption. Its client sees only a
pause.

With ``speculative_tokens``, a decode step also drafts up to that many next tokens for each greedy
sequence (each sampled one too, with ``speculative_sampling``) whose sampling reads no history, from
its own context (`speculation`), as many as keep the step within ``speculative_rows`` rows
(sequences and drafts; an equal share each) and where blocks for them are free (no sequence is
preempted and nothing cached evicted for a draft); the step's ``drafts`` carries them, and the
engine reports how many tokens of each were kept.

With a pre-warm policy (the stack's ``[prewarm]``), every new prompt is shown to it, and
:meth:`Scheduler.keep_wanted` (called by the engine now and then) has the block manager pin the
wanted prefixes that are cached and name one that is not, which the engine computes when idle
as a ``warm`` sequence (one prefill, no client).
"""

from __future__ import annotations

import itertools
import time
from collections import deque

import attrs

from lamina_hookspecs.protocols import BatchingPolicy, PrewarmPolicy
from lamina_hookspecs.types import SchedulerState, WarmPrefix
from lamina_jax.block_manager import BlockManager, blocks_for
from lamina_jax.rates import EventRate
from lamina_jax.sequence import Sequence
from lamina_jax.speculation import Drafter, draftable

ARRIVAL_WINDOW_S = 2.0
"""Time constant of the arrival-rate moving average that batching policies see."""


@attrs.frozen
class PrefillWork:
    """Prefill ``tokens`` (positions ``start`` onwards) of ``seq``; ``last`` if it completes the prompt."""

    seq: Sequence
    start: int
    tokens: list[int]
    last: bool


@attrs.frozen
class Step:
    """What one engine step runs: prefill chunks (one call) and a decode batch, with the tokens
    drafted for each decoding sequence (``[]``: none)."""

    prefills: list[PrefillWork]
    decode: list[Sequence]
    drafts: list[list[int]]


class Scheduler:
    """Owns the queue and the running batch and decides each step; runs on the engine thread."""

    def __init__(self, blocks: BlockManager, *, max_batch: int, prefill_chunk: int,
                 decoding_prefill_chunk: int | None = None, max_prefills: int = 8, table_capacity: int = 256,
                 batching: BatchingPolicy | None = None, prewarm: PrewarmPolicy | None = None,
                 speculative_tokens: int = 0, speculative_rows: int = 0, speculative_sampling: bool = False,
                 max_model_len: int | None = None) -> None:
        self.blocks = blocks
        self.batching = batching
        self.prewarm = prewarm
        self.block_size = blocks.block_size
        self.max_batch = max_batch
        self.prefill_chunk = prefill_chunk
        self.decoding_prefill_chunk = decoding_prefill_chunk or prefill_chunk
        self.max_prefills = max_prefills
        self.table_capacity = table_capacity
        self.speculative_tokens, self.speculative_rows = speculative_tokens, speculative_rows
        self.speculative_sampling = speculative_sampling
        self.max_model_len = max_model_len
        self._drafters: dict[Sequence, Drafter] = {}
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.hold_s = 0.0  # how long the policy held new prefills at the last schedule (0: not held)
        self._arrivals = EventRate(ARRIVAL_WINDOW_S)

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)
        if seq.warm:
            return
        self._arrivals.add(seq.submitted_at)
        if self.prewarm is not None:
            self.prewarm.observe(seq.prompt_ids, salt=seq.salt, now=seq.submitted_at)

    def keep_wanted(self, now: float, *, idle: bool) -> WarmPrefix | None:
        """Pin the pre-warm policy's wanted prefixes that are cached; return the first wanted one
        that is not (see :meth:`BlockManager.keep`)."""
        if self.prewarm is None:
            return None
        return self.blocks.keep(self.prewarm.wanted(now), idle=idle)

    def arrival_rate(self, now: float) -> float:
        """Arrivals per second, exponentially averaged over ``ARRIVAL_WINDOW_S`` and decayed to ``now``."""
        return self._arrivals.at(now)

    def state(self, now: float) -> SchedulerState:
        """What the batching policy sees at ``now``."""
        oldest = now - self.waiting[0].submitted_at if self.waiting else 0.0
        return SchedulerState(now=now, waiting=len(self.waiting), running=len(self.running), max_batch=self.max_batch,
                              oldest_wait_s=max(oldest, 0.0), arrival_rate=self.arrival_rate(now))

    def observe(self, latency_s: float, now: float) -> None:
        """Tell the batching policy the longest time to first token of a step's new sequences."""
        if self.batching is not None:
            self.batching.observe(latency_s, self.state(now))

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def remove(self, seq: Sequence) -> bool:
        """Take a sequence out wherever it is and free its blocks (abort or finish)."""
        for group in (self.running, self.waiting):
            if seq in group:
                group.remove(seq)
                self.blocks.release(seq)
                self._drafters.pop(seq, None)
                return True
        return False

    def expire(self, now: float) -> list[Sequence]:
        """Take out and return the waiting sequences that have not started (no prefill chunk yet)
        and were submitted more than their ``max_queue_wait_s`` before ``now``."""
        expired = [seq for seq in self.waiting
                   if seq.queue_s is None and seq.max_queue_wait_s is not None
                   and now - seq.submitted_at > seq.max_queue_wait_s]
        for seq in expired:
            self.remove(seq)
        return expired

    def schedule(self, now: float | None = None) -> Step:
        """The next step; ``now`` (default: the monotonic clock) is the time the policy sees."""
        decode = self._reserve_decode_blocks()
        now = time.monotonic() if now is None else now
        return Step(prefills=self._next_prefills(len(decode), now), decode=decode, drafts=self._drafts(decode))

    def finish_prefill(self, work: PrefillWork) -> None:
        """Record a prefilled chunk; a sequence whose prompt is complete joins the running batch."""
        work.seq.num_computed = work.start + len(work.tokens)
        if work.last:
            self.waiting.remove(work.seq)
            self.running.append(work.seq)

    def _reserve_decode_blocks(self) -> list[Sequence]:
        batch = []
        for seq in list(self.running):
            if seq not in self.running:  # preempted below, for an earlier sequence's block
                continue
            while not self.blocks.grow(seq, seq.num_computed + 1):
                victim = self.running[-1]
                self._preempt(victim)
                if victim is seq:
                    break
            else:
                batch.append(seq)
        return batch

    def _drafts(self, decode: list[Sequence]) -> list[list[int]]:
        """Tokens drafted for each of ``decode``: each sequence's share of ``speculative_rows``, within
        its ``max_tokens`` and the context, where blocks for them are free."""
        drafts: list[list[int]] = [[] for _ in decode]
        rows = min(self.speculative_rows, self.max_batch)  # the decode shapes go up to max_batch rows
        share = min(self.speculative_tokens, (rows - len(decode)) // max(len(decode), 1))
        if share <= 0:
            return drafts
        for i, seq in enumerate(decode):
            left = seq.sampling.max_tokens - len(seq.output_ids) - 1
            if self.max_model_len is not None:
                left = min(left, self.max_model_len - seq.length - 1)
            count = min(share, left)
            if count <= 0 or not draftable(seq, sampled=self.speculative_sampling):
                continue
            draft = self._drafters.setdefault(seq, Drafter()).propose(seq.tokens, count)
            if draft and self.blocks.grow(seq, seq.num_computed + 1 + len(draft), evict=False):
                drafts[i] = draft
        return drafts

    def drafts_kept(self, seq: Sequence, count: int) -> None:
        """The model kept ``count`` tokens of the draft ``seq`` decoded in the last step."""
        drafter = self._drafters.get(seq)
        if drafter is not None:
            drafter.kept(count)

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.blocks.release(seq)
        if self.waiting:  # only the queue's head holds blocks (a partial prefill): it restarts later
            self.blocks.release(self.waiting[0])
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def discard_all(self) -> list[Sequence]:
        """Drop every sequence and everything cached, without keeping any KV: after a failed
        step the device cache may hold garbage. Returns the dropped sequences."""
        dropped = [*self.running, *self.waiting]
        for seq in dropped:
            self.blocks.release(seq, keep=False)
        self._drafters.clear()
        self.running.clear()
        self.waiting.clear()
        self.blocks.discard_cached()
        return dropped

    def _next_prefills(self, num_decoding: int, now: float) -> list[PrefillWork]:
        self.hold_s = 0.0
        room = self.max_batch - num_decoding
        if not self.waiting or room <= 0:
            return []
        limit = self.max_prefills
        if self.batching is not None:
            state = self.state(now)
            if not self.waiting[0].blocks:  # no prefill under way: the policy may hold new ones
                self.hold_s = self.batching.wait_s(state)
                if self.hold_s > 0:
                    return []
            limit = min(self.batching.max_prefills(state), limit)
        works: list[PrefillWork] = []
        budget = self.decoding_prefill_chunk if num_decoding else self.prefill_chunk
        table_room = self.table_capacity
        for seq in itertools.islice(self.waiting, min(limit, room)):
            if seq.fork_of is not None and seq.fork_of in self.waiting:
                break  # a forked choice starts once its parent's prompt is computed (it reads its blocks)
            work = self._chunk(seq, budget, table_room)
            if work is None:
                break
            works.append(work)
            budget -= len(work.tokens)
            table_room -= len(seq.blocks)
            if budget <= 0:  # the last work may be a partial chunk; the others are whole
                break
        return works

    def _chunk(self, seq: Sequence, budget: int, table_room: int) -> PrefillWork | None:
        """The next chunk of ``seq``, at most ``budget`` tokens, if ``seq`` then owns at most
        ``table_room`` blocks; ``None`` if it would not, or if memory is short."""
        if seq.fork_of is not None:
            self.blocks.fork(seq)
        else:
            self.blocks.reuse_cached_prefix(seq)
        start = seq.num_computed
        end = min(start + budget, seq.prefill_target)
        if blocks_for(end, self.block_size) > table_room or not self.blocks.grow(seq, end):
            return None
        return PrefillWork(seq=seq, start=start, tokens=seq.tokens[start:end], last=end == seq.prefill_target)
