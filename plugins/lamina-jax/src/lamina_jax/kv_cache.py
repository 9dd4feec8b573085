"""Host-side bookkeeping of the paged KV cache: which blocks are free.

The device holds the block pools (see ``model/llama.py``); this module only hands out block
ids. A sequence asks for blocks as it grows and gives them back when it finishes or is
aborted, so a finished request frees its memory at once.
"""

from __future__ import annotations

from collections import deque


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
