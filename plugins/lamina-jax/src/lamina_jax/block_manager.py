"""Which KV blocks each sequence owns: allocation, growth, hand-over to the prefix cache, pins.

The device holds the block pools (see ``model/llama.py`` and the model runner); this module
only decides which block ids a sequence writes. A sequence takes blocks as it grows and gives
them back when it finishes, is aborted or is preempted, so memory frees at once.

With a prefix cache (layer 4), a sequence starting its prefill first takes the longest cached
prefix of its tokens (under its tenant's salt) and computes only the rest. When a sequence
leaves, the whole blocks it computed are offered to the cache, which keeps the ones it had no
copy of; the rest go back to the free list. When the free list runs dry, the cache gives up
least-recently-used unpinned blocks. Pre-warm prefixes are pinned in the cache so eviction cannot
take them, and give way only when a request needs their memory.

A forked sequence (another choice of the same request) shares the whole prompt blocks its parent
computed: those blocks count their extra readers, and a sequence leaving while another still reads
one of its blocks frees only the blocks nobody else reads and offers the cache nothing; the last
reader gives them back (or to the cache) as usual. Nobody writes into a shared block: both
sequences write only past the prompt's shared part.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterable

from lamina_hookspecs.protocols import PrefixCache
from lamina_hookspecs.types import PrefixMatch, WarmPrefix
from lamina_jax.sequence import Sequence


def blocks_for(num_tokens: int, block_size: int) -> int:
    """Blocks needed to hold ``num_tokens`` positions."""
    return -(-num_tokens // block_size)


class BlockAllocator:
    """A free list over ``num_blocks`` block ids."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self._free: deque[int] = deque(range(num_blocks))

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def allocate(self, count: int) -> list[int] | None:
        """``count`` block ids, or ``None`` (and nothing taken) when fewer are free."""
        if count > len(self._free):
            return None
        return [self._free.popleft() for _ in range(count)]

    def free(self, blocks: list[int]) -> None:
        """Return blocks to the pool."""
        self._free.extend(blocks)


PrefixKey = tuple[bytes, tuple[int, ...]]
"""A pre-warm prefix: (salt, token ids)."""


class BlockManager:
    """The blocks of every sequence, over a free list and an optional prefix cache."""

    def __init__(self, allocator: BlockAllocator, *, block_size: int, prefix_cache: PrefixCache | None = None) -> None:
        self.allocator = allocator
        self.block_size = block_size
        self.prefix_cache = prefix_cache
        self.kept: dict[PrefixKey, PrefixMatch] = {}
        """Pre-warm prefixes pinned in the cache."""
        self._missing: set[PrefixKey] = set()
        self.readers: dict[int, int] = {}
        """Blocks shared by forked sequences: how many sequences read each beside one."""

    def grow(self, seq: Sequence, num_tokens: int, *, evict: bool = True) -> bool:
        """Make ``seq`` own blocks for ``num_tokens`` positions; False (nothing taken) if memory is short.
        Without ``evict``, only free blocks are taken (nothing cached gives way)."""
        missing = blocks_for(num_tokens, self.block_size) - len(seq.blocks)
        if missing <= 0:
            return True
        blocks = self.allocator.allocate(missing)
        for unpin in (False, True):  # pinned pre-warm prefixes give way only to a request that needs them
            if blocks is not None or self.prefix_cache is None or not evict or (unpin and not self.kept):
                break
            if unpin:
                self._unkeep()
            self.allocator.free(self.prefix_cache.evict(missing - self.allocator.num_free))
            blocks = self.allocator.allocate(missing)
        if blocks is None:
            return False
        seq.blocks.extend(blocks)
        return True

    def reuse_cached_prefix(self, seq: Sequence) -> None:
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

    def fork(self, seq: Sequence) -> None:
        """Start ``seq``'s prefill from what its ``fork_of`` computed: its cached prefix as any sequence
        takes it, then the parent's other whole prompt blocks, shared (leaving at least one token to
        compute, for the logits to sample from). A parent that is gone shares nothing."""
        parent, seq.fork_of = seq.fork_of, None
        self.reuse_cached_prefix(seq)
        if parent is None or seq.output_ids:
            return
        whole = min(parent.num_computed, len(seq.prompt_ids) - 1, len(parent.blocks) * self.block_size)
        cache = self.prefix_cache  # the parent's cached blocks are its match's, read by seq through its own
        shared = list(itertools.takewhile(lambda b: cache is None or not cache.owns(b),
                                          parent.blocks[len(seq.blocks): whole // self.block_size]))
        for block in shared:
            self.readers[block] = self.readers.get(block, 0) + 1
        seq.blocks.extend(shared)
        seq.num_computed = seq.cached_tokens = len(seq.blocks) * self.block_size

    def release(self, seq: Sequence, *, keep: bool = True) -> None:
        """Free a sequence's blocks; with a prefix cache, first offer it what was computed (``keep``).
        Blocks another sequence still reads stay, and then nothing is offered."""
        shared = {b for b in seq.blocks if b in self.readers}
        for block in shared:
            self.readers[block] -= 1
            if not self.readers[block]:
                del self.readers[block]
        if shared:
            seq.blocks, keep = [b for b in seq.blocks if b not in shared], False
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

    def discard_cached(self) -> None:
        """Unpin and evict everything cached (after a failed step the device pools may hold garbage)."""
        self._unkeep()
        if self.prefix_cache is not None:
            self.allocator.free(self.prefix_cache.evict(self.allocator.num_blocks))

    def keep(self, wanted: Iterable[WarmPrefix], *, idle: bool) -> WarmPrefix | None:
        """Pin the ``wanted`` prefixes (whole blocks) that are cached, unpin those no longer wanted;
        return the first wanted one that is not fully cached, if any. A prefix found missing is
        looked up again only when ``idle`` (so busy steps add no lookups)."""
        cache = self.prefix_cache
        if cache is None:
            return None
        kept: dict[PrefixKey, PrefixMatch] = {}
        missing: set[PrefixKey] = set()
        first = None
        for prefix in wanted:
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
