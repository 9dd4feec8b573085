"""Continuous batching: which sequences run in the next engine step.

Every step decodes one token for each running sequence and, beside that, prefills waiting
sequences in queue order, packed into one call, within a budget of ``prefill_chunk`` tokens:
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

KV blocks are taken as sequences grow. When a running sequence needs a block and none is
free, the most recently admitted running sequence is preempted: its blocks are freed and
it goes back to the front of the queue, to be recomputed (prompt plus what it already
generated) when memory frees up — vLLM's recompute preemption. Its client sees only a pause.

With a prefix cache (layer 4), a sequence starting its prefill first takes the longest
cached prefix of its tokens (under its tenant's salt) and computes only the rest. When a
sequence leaves (finished, aborted or preempted) the whole blocks it computed are offered
to the cache, which keeps the ones it had no copy of; the rest go back to the allocator.
When the allocator runs dry, the cache gives up least-recently-used unpinned blocks.

With a pre-warm policy (the stack's ``[prewarm]``), every new prompt is shown to it, and
:meth:`Scheduler.keep_wanted` (called by the engine now and then) pins the wanted prefixes
that are cached — so eviction cannot take them — and names one that is not, which the
engine computes when idle as a ``warm`` sequence (one prefill, no client). Pinned prefixes
give way when a request needs their memory.
"""

from __future__ import annotations

import itertools
import math
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import attrs

from lamina_hookspecs.protocols import BatchingPolicy, PrefixCache, PrewarmPolicy
from lamina_hookspecs.types import PrefixMatch, SamplingParams, SchedulerState, WarmPrefix
from lamina_jax.kv_cache import BlockAllocator, blocks_for

ARRIVAL_WINDOW_S = 2.0
"""Time constant of the arrival-rate moving average that batching policies see."""


@attrs.define(eq=False)
class Sequence:
    """One request inside the engine; ``key`` is its sampling PRNG key, ``emit`` delivers its output,
    ``salt`` isolates its prefix-cache entries (its tenant), ``match`` pins the cached prefix it reads.

    ``num_computed`` tokens of ``prompt_ids + output_ids`` have their K/V in ``blocks``. A
    decoding sequence has all but its last token computed; that token is the next input.
    ``queue_s`` is how long it waited from submission to its first prefill chunk. A ``warm``
    sequence computes a pre-warm prefix for the cache; nobody reads its output.
    """

    request_id: str
    prompt_ids: list[int]
    sampling: SamplingParams
    emit: Callable[[object], None]
    key: Any = None
    salt: bytes = b""
    match: PrefixMatch | None = None
    cached_tokens: int = 0
    output_ids: list[int] = attrs.field(factory=list)
    blocks: list[int] = attrs.field(factory=list)
    num_computed: int = 0
    submitted_at: float = attrs.field(factory=time.monotonic)
    queue_s: float | None = None
    warm: bool = False

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
    """What one engine step runs: prefill chunks (one call) and a decode batch."""

    prefills: list[PrefillWork]
    decode: list[Sequence]


class Scheduler:
    """Owns the queue, the running batch and the block allocator; runs on the engine thread."""

    def __init__(self, allocator: BlockAllocator, *, block_size: int, max_batch: int, prefill_chunk: int,
                 max_prefills: int = 8, table_capacity: int = 256, prefix_cache: PrefixCache | None = None, batching: BatchingPolicy | None = None,
                 prewarm: PrewarmPolicy | None = None) -> None:
        self.allocator = allocator
        self.prefix_cache = prefix_cache
        self.batching = batching
        self.prewarm = prewarm
        self.kept: dict[tuple[bytes, tuple[int, ...]], PrefixMatch] = {}
        """Pre-warm prefixes pinned in the cache, by (salt, token ids)."""
        self._missing: set[tuple[bytes, tuple[int, ...]]] = set()
        self.block_size = block_size
        self.max_batch = max_batch
        self.prefill_chunk = prefill_chunk
        self.max_prefills = max_prefills
        self.table_capacity = table_capacity
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.hold_s = 0.0  # how long the policy held new prefills at the last schedule (0: not held)
        self._arrivals = (0.0, 0.0)  # (when, decayed arrivals per second) at the last add

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)
        if seq.warm:
            return
        self._arrivals = (seq.submitted_at, self.arrival_rate(seq.submitted_at) + 1 / ARRIVAL_WINDOW_S)
        if self.prewarm is not None:
            self.prewarm.observe(seq.prompt_ids, salt=seq.salt, now=seq.submitted_at)

    def keep_wanted(self, now: float, *, idle: bool) -> WarmPrefix | None:
        """Pin the pre-warm policy's wanted prefixes (whole blocks) that are cached, unpin those
        no longer wanted; return the first wanted one that is not fully cached, if any. A prefix
        found missing is looked up again only when ``idle`` (so busy steps add no lookups)."""
        cache, policy = self.prefix_cache, self.prewarm
        if cache is None or policy is None:
            return None
        kept: dict[tuple[bytes, tuple[int, ...]], PrefixMatch] = {}
        missing: set[tuple[bytes, tuple[int, ...]]] = set()
        first = None
        for prefix in policy.wanted(now):
            tokens = prefix.token_ids[: len(prefix.token_ids) // self.block_size * self.block_size]
            key = (prefix.salt, tokens)
            if not tokens or key in kept or key in missing:
                continue
            if key in self.kept:
                kept[key] = self.kept.pop(key)
                continue
            if key in self._missing and not idle:
                missing.add(key)
                continue
            match = cache.match(tokens, salt=prefix.salt)
            if match.num_tokens == len(tokens):
                kept[key] = match
                continue
            cache.release(match)
            missing.add(key)
            first = first or WarmPrefix(token_ids=tokens, salt=prefix.salt, uses=prefix.uses)
        self._unkeep()
        self.kept, self._missing = kept, missing
        return first

    def _unkeep(self) -> None:
        if self.prefix_cache is not None:
            for match in self.kept.values():
                self.prefix_cache.release(match)
        self.kept = {}

    def arrival_rate(self, now: float) -> float:
        """Arrivals per second, exponentially averaged over ``ARRIVAL_WINDOW_S`` and decayed to ``now``."""
        when, rate = self._arrivals
        return rate * math.exp(-max(now - when, 0.0) / ARRIVAL_WINDOW_S)

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
                self._release(seq)
                return True
        return False

    def schedule(self, now: float | None = None) -> Step:
        """The next step; ``now`` (default: the monotonic clock) is the time the policy sees."""
        decode = self._reserve_decode_blocks()
        now = time.monotonic() if now is None else now
        return Step(prefills=self._next_prefills(len(decode), now), decode=decode)

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
        for unpin in (False, True):  # pinned pre-warm prefixes give way only to a request that needs them
            if blocks is not None or self.prefix_cache is None or (unpin and not self.kept):
                break
            if unpin:
                self._unkeep()
            self.allocator.free(self.prefix_cache.evict(missing - self.allocator.num_free))
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

    def _release(self, seq: Sequence, *, keep: bool = True) -> None:
        """Free a sequence's blocks; with a prefix cache, first offer it what was computed (``keep``)."""
        cache = self.prefix_cache
        if cache is None:
            self.allocator.free(seq.blocks)
        else:
            if keep:
                cache.insert(seq.tokens[: seq.num_computed], seq.blocks, salt=seq.salt)
            if seq.match is not None:
                cache.release(seq.match)
                seq.match = None
            self.allocator.free([b for b in seq.blocks if not cache.owns(b)])
        seq.blocks = []
        seq.num_computed = 0

    def discard_all(self) -> list[Sequence]:
        """Drop every sequence and everything cached, without keeping any KV: after a failed
        step the device cache may hold garbage. Returns the dropped sequences."""
        dropped = [*self.running, *self.waiting]
        for seq in dropped:
            self._release(seq, keep=False)
        self.running.clear()
        self.waiting.clear()
        self._unkeep()
        if self.prefix_cache is not None:
            self.allocator.free(self.prefix_cache.evict(self.allocator.num_blocks))
        return dropped

    def _reuse_cached_prefix(self, seq: Sequence) -> None:
        """Start a fresh prefill from the longest cached prefix (leaving at least one token to
        compute when the prefill must end with logits to sample from)."""
        cache = self.prefix_cache
        if cache is None or seq.blocks:
            return
        seq.match = cache.match(seq.tokens[: seq.prefill_target], salt=seq.salt)
        usable = seq.match.num_tokens
        if not seq.output_ids and usable == seq.prefill_target:
            usable -= self.block_size
        seq.blocks = list(seq.match.block_ids[: usable // self.block_size])
        seq.num_computed = usable
        if not seq.output_ids:
            seq.cached_tokens = usable

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
        budget, table_room = self.prefill_chunk, self.table_capacity
        for seq in itertools.islice(self.waiting, min(limit, room)):
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
        self._reuse_cached_prefix(seq)
        start = seq.num_computed
        end = min(start + budget, seq.prefill_target)
        if blocks_for(end, self.block_size) > table_room or not self._grow(seq, end):
            return None
        return PrefillWork(seq=seq, start=start, tokens=seq.tokens[start:end], last=end == seq.prefill_target)
