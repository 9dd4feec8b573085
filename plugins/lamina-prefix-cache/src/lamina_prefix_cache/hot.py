"""The ``hot-prefix`` prefix cache: ``radix`` that keeps frequently recurring prefixes.

Every ``match`` and ``insert`` that reaches a block counts one use of that block (of the
prefix ending there). A block used at least ``min_uses`` times is *hot*: eviction takes
cold unpinned leaves first (least recently used first), and hot ones only when no cold
one is left, again least recently used first — so a shared system prompt or few-shot
preamble survives bursts of one-off prompts. Hot blocks are never held beyond need:
when only hot blocks are left they are evicted like any other, so memory can always be
reclaimed. Counts are per salt (per tenant) like everything else and vanish with the
block. Same ownership contract as ``radix`` (see :mod:`lamina_prefix_cache.radix`).
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from lamina_hookspecs.registration import BuildContext
from lamina_prefix_cache.radix import RadixCache, RadixOptions, _Node


@attrs.frozen(kw_only=True)
class HotPrefixOptions(RadixOptions):
    """Stack-file options of ``hot-prefix``."""

    min_uses: int = attrs.field(default=3, validator=attrs.validators.ge(1), metadata={
        "help": "matches plus inserts reaching a block before it is hot (evicted only after every cold block)"})


class HotPrefixCache(RadixCache):
    """``radix`` with frequently used prefixes evicted last."""

    def __init__(self, block_size: int = 16, max_blocks: int | None = None, min_uses: int = 3) -> None:
        if min_uses < 1:
            raise ValueError(f"min_uses must be >= 1, not {min_uses}")
        super().__init__(block_size=block_size, max_blocks=max_blocks)
        self.min_uses = min_uses

    def _priority(self, node: _Node) -> tuple[int, ...]:
        return (int(node.uses >= self.min_uses), node.last_access)

    def stats(self) -> Mapping[str, float]:
        """``radix``'s counters plus ``hot_blocks`` (blocks used at least ``min_uses`` times)."""
        out = dict(super().stats())
        with self._lock:
            out["hot_blocks"] = float(sum(1 for n in self._by_block.values() if n.uses >= self.min_uses))
        return out


def build_hot_prefix(options: HotPrefixOptions, context: BuildContext) -> HotPrefixCache:
    """A radix prefix cache that evicts frequently recurring prefixes last."""
    return HotPrefixCache(block_size=options.block_size, max_blocks=options.max_blocks, min_uses=options.min_uses)
