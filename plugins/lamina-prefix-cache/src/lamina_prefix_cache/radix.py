"""The ``radix`` prefix cache: a radix tree over token ids at KV-block granularity.

Each tree node stands for one whole block of ``block_size`` token ids and holds the id of
the executor's KV block that stores that block's keys and values. A node's children are
keyed by the tuple of the next block's token ids, so a lookup costs O(blocks) dict probes.
A partial last block is never cached.

Tenant isolation: the ``salt`` picks a separate root, so the first level of the tree is
the tenant. A lookup under one salt never reads, pins or reorders another salt's nodes,
and its cost depends only on its own salt's subtree. (Eviction is global: all tenants
share the executor's KV memory.)

Block ownership between the cache and the executor follows ``lamina_hookspecs.protocols.PrefixCache``.
Beyond the protocol, :meth:`RadixCache.adopt` inserts and returns exactly which ids it took (and
which it evicted to make room), and :meth:`RadixCache.drain_evicted` hands back ids evicted
that way.

Eviction frees unpinned *leaves*, least recently used first; evicting a leaf can make its
parent a leaf, which is then a candidate in the same call. Recency is a monotonic counter
bumped by every ``match`` and ``insert`` along the path it touches; candidates sit in a
heap with lazy invalidation, so ``evict`` costs O(log n) per block.

Not thread-safe by design beyond a single lock around each call: the executor calls it
from its engine thread; ``stats`` may be read from elsewhere.
"""

from __future__ import annotations

import heapq
import threading
from collections import Counter
from collections.abc import Mapping, Sequence

import attrs

from lamina_hookspecs.registration import BuildContext
from lamina_hookspecs.types import PrefixMatch


def _optional_positive(instance: object, attribute: attrs.Attribute, value: int | None) -> None:  # type: ignore[type-arg]
    if value is not None and value < 1:
        raise ValueError(f"'{attribute.name}' must be >= 1 or unset, not {value}")


@attrs.frozen(kw_only=True)
class RadixOptions:
    """Stack-file options of ``radix``."""

    block_size: int = attrs.field(default=16, validator=attrs.validators.ge(1), metadata={
        "help": "token ids per cached block; must equal the executor's KV block size (block_size)"})
    max_blocks: int | None = attrs.field(default=None, validator=_optional_positive, metadata={
        "help": "most blocks the cache may hold; insert evicts least recently used blocks beyond it "
                "(unset: bounded only by the executor's evict calls)"})


@attrs.frozen
class Adoption:
    """What one :meth:`RadixCache.adopt` call did with the caller's block ids.

    ``adopted``: ids the cache took ownership of (the caller must no longer free them).
    ``evicted``: ids the cache dropped to stay within ``max_blocks``; they are the caller's
    again and must go back to its allocator.
    """

    adopted: tuple[int, ...] = ()
    evicted: tuple[int, ...] = ()


class _Node:
    __slots__ = ("key", "block_id", "parent", "children", "refs", "last_access", "uses", "stamp", "alive")

    def __init__(self, key: tuple[int, ...] | bytes, block_id: int, parent: _Node | None) -> None:
        self.key = key
        self.block_id = block_id
        self.parent = parent
        self.children: dict[tuple[int, ...], _Node] = {}
        self.refs = 0
        self.last_access = 0
        self.uses = 0  # matches and inserts that touched this node
        self.stamp = -1  # sequence number of this node's only valid heap entry
        self.alive = True


class RadixCache:
    """A radix tree of whole token blocks mapping prompt prefixes to KV block ids, per salt."""

    def __init__(self, block_size: int = 16, max_blocks: int | None = None) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, not {block_size}")
        if max_blocks is not None and max_blocks < 1:
            raise ValueError(f"max_blocks must be >= 1 or None, not {max_blocks}")
        self.block_size = block_size
        self.max_blocks = max_blocks
        self._roots: dict[bytes, _Node] = {}
        self._by_block: dict[int, _Node] = {}
        self._outstanding: Counter[tuple[int, ...]] = Counter()
        self._heap: list[tuple[tuple[int, ...], int, _Node]] = []
        self._seq = 0
        self._clock = 0
        self._pending: list[int] = []  # evicted by ``insert`` under max_blocks, not yet handed back
        self._lock = threading.Lock()
        self._hit_tokens = 0
        self._lookup_tokens = 0
        self._hit_requests = 0
        self._lookups = 0
        self._evicted = 0
        self._inserted = 0
        self._pinned = 0  # nodes with refs > 0 (matches only; insert's temporary pins are not counted)

    # -- the PrefixCache protocol -------------------------------------------------------

    def match(self, token_ids: Sequence[int], *, salt: bytes) -> PrefixMatch:
        """The longest cached whole-block prefix of ``token_ids`` under ``salt``, pinned.

        The whole matched prefix is returned, even when it covers every token; the
        executor decides how much of it to use (it may need to recompute the last token
        to get logits). The path's recency is refreshed. Release the match exactly once.
        """
        with self._lock:
            path = self._walk(token_ids, salt)
            self._lookups += 1
            self._lookup_tokens += len(token_ids)
            if not path:
                return PrefixMatch(num_tokens=0)
            self._clock += 1
            for node in path:
                if not node.refs:
                    self._pinned += 1
                node.refs += 1
                node.last_access = self._clock
                node.uses += 1
            block_ids = tuple(node.block_id for node in path)
            self._outstanding[block_ids] += 1
            self._hit_requests += 1
            self._hit_tokens += len(path) * self.block_size
            return PrefixMatch(num_tokens=len(path) * self.block_size, block_ids=block_ids)

    def insert(self, token_ids: Sequence[int], block_ids: Sequence[int], *, salt: bytes) -> None:
        """Record that ``block_ids[i]`` holds the K/V of block ``i`` of ``token_ids``.

        Only the first ``min(len(token_ids) // block_size, len(block_ids))`` blocks are
        considered. Where a node already exists the existing block id is kept and the
        caller keeps (and must free) its own. Use :meth:`owns` afterwards, or call
        :meth:`adopt` instead, to learn which ids the cache took. Under ``max_blocks``,
        blocks evicted to make room are handed back by the next :meth:`evict` call (or
        :meth:`drain_evicted`).

        :raises ValueError: a block id is repeated, or is already stored for a different
            block; nothing is changed then.
        """
        with self._lock:
            result = self._adopt(token_ids, block_ids, salt)
            self._pending.extend(result.evicted)

    def release(self, match: PrefixMatch) -> None:
        """Unpin the blocks of ``match``; an empty match is a no-op.

        :raises ValueError: ``match`` is not outstanding (never returned by :meth:`match`,
            or already released as many times as it was returned).
        """
        block_ids = tuple(match.block_ids)
        if not block_ids:
            return
        with self._lock:
            if self._outstanding[block_ids] <= 0:
                raise ValueError(f"release of a prefix match that is not outstanding: {block_ids}")
            self._outstanding[block_ids] -= 1
            if not self._outstanding[block_ids]:
                del self._outstanding[block_ids]
            for block_id in block_ids:
                node = self._by_block[block_id]
                node.refs -= 1
                if not node.refs:
                    self._pinned -= 1
                    self._offer(node)

    def evict(self, num_blocks: int) -> list[int]:
        """Free up to ``num_blocks`` unpinned leaf blocks, least recently used first.

        The returned ids are the caller's again (return them to the allocator). Ids that
        ``insert`` evicted under ``max_blocks`` and that were not yet handed back come first.
        """
        with self._lock:
            out = self._pending[:max(num_blocks, 0)]
            del self._pending[:len(out)]
            out.extend(self._evict_lru(num_blocks - len(out)))
            return out

    def stats(self) -> Mapping[str, float]:
        """Counters for metrics (floats).

        ``hit_tokens``/``lookup_tokens`` (prompt tokens served from cache / looked up),
        ``hit_requests``/``lookups``, ``hit_rate`` (hit_tokens / lookup_tokens),
        ``cached_blocks``, ``pinned_blocks`` (blocks held by at least one outstanding match),
        ``inserted_blocks`` and ``evicted_blocks`` (cumulative).
        """
        with self._lock:
            return {
                "hit_tokens": float(self._hit_tokens),
                "lookup_tokens": float(self._lookup_tokens),
                "hit_requests": float(self._hit_requests),
                "lookups": float(self._lookups),
                "hit_rate": self._hit_tokens / self._lookup_tokens if self._lookup_tokens else 0.0,
                "cached_blocks": float(len(self._by_block)),
                "pinned_blocks": float(self._pinned),
                "inserted_blocks": float(self._inserted),
                "evicted_blocks": float(self._evicted),
            }

    # -- extras beyond the protocol ----------------------------------------------------

    def adopt(self, token_ids: Sequence[int], block_ids: Sequence[int], *, salt: bytes) -> Adoption:
        """:meth:`insert`, reporting which ids the cache took and which it evicted.

        ``adopted`` are now the cache's; ``evicted`` (only under ``max_blocks``) are the
        caller's to free. Every other id in ``block_ids`` is unchanged: still the caller's
        if it was, still the cache's if it came from a match.
        """
        with self._lock:
            return self._adopt(token_ids, block_ids, salt)

    def owns(self, block_id: int) -> bool:
        """Whether ``block_id`` is currently stored by the cache (and so not the caller's to free)."""
        return block_id in self._by_block

    def drain_evicted(self) -> list[int]:
        """Ids that ``insert`` evicted under ``max_blocks`` and not yet handed back; now the caller's."""
        with self._lock:
            out, self._pending = self._pending, []
            return out

    def __len__(self) -> int:
        """Blocks currently stored."""
        return len(self._by_block)

    # -- internals ---------------------------------------------------------------------

    def _keys(self, token_ids: Sequence[int], limit: int | None = None) -> list[tuple[int, ...]]:
        size = self.block_size
        count = len(token_ids) // size
        if limit is not None:
            count = min(count, limit)
        return [tuple(token_ids[i * size:(i + 1) * size]) for i in range(count)]

    def _walk(self, token_ids: Sequence[int], salt: bytes) -> list[_Node]:
        node = self._roots.get(bytes(salt))
        path: list[_Node] = []
        if node is None:
            return path
        size = self.block_size
        for i in range(len(token_ids) // size):
            child = node.children.get(tuple(token_ids[i * size:(i + 1) * size]))
            if child is None:
                break
            path.append(child)
            node = child
        return path

    def _adopt(self, token_ids: Sequence[int], block_ids: Sequence[int], salt: bytes) -> Adoption:
        keys = self._keys(token_ids, len(block_ids))
        ids = [int(b) for b in block_ids[:len(keys)]]
        if len(set(ids)) != len(ids):
            raise ValueError(f"block ids repeat within one insert: {ids}")
        # Validate before changing anything: an id the cache stores must sit at this very node.
        salt = bytes(salt)
        node = self._roots.get(salt)
        for i, key in enumerate(keys):
            child = node.children.get(key) if node is not None else None
            if child is None:
                for later in ids[i:]:
                    if later in self._by_block:
                        raise ValueError(f"block id {later} is already cached for a different block")
                break
            if ids[i] != child.block_id and ids[i] in self._by_block:
                raise ValueError(f"block id {ids[i]} is already cached for a different block")
            node = child
        if not keys:
            return Adoption()
        root = self._roots.get(salt)
        if root is None:
            root = self._roots[salt] = _Node(salt, -1, None)  # a root's key is its salt
        self._clock += 1
        node = root
        path: list[_Node] = []
        adopted: list[int] = []
        for key, block_id in zip(keys, ids):
            child = node.children.get(key)
            if child is None:
                child = _Node(key, block_id, node)
                node.children[key] = child
                self._by_block[block_id] = child
                adopted.append(block_id)
            child.last_access = self._clock
            child.uses += 1
            path.append(child)
            node = child
        self._inserted += len(adopted)
        evicted: list[int] = []
        if self.max_blocks is not None and len(self._by_block) > self.max_blocks:
            for n in path:  # keep the path just inserted out of its own eviction
                n.refs += 1
            evicted = self._evict_lru(len(self._by_block) - self.max_blocks)
            for n in path:
                n.refs -= 1
            # Still over (everything else pinned): give back the newest blocks of this path.
            while len(self._by_block) > self.max_blocks and adopted and path[-1].block_id == adopted[-1]:
                last = path.pop()
                adopted.pop()
                self._inserted -= 1
                self._unlink(last)
        if path:
            self._offer(path[-1])
        elif not root.children:
            del self._roots[salt]
        return Adoption(adopted=tuple(adopted), evicted=tuple(evicted))

    def _priority(self, node: _Node) -> tuple[int, ...]:
        """Eviction order among unpinned leaves, smallest first: least recently used."""
        return (node.last_access,)

    @staticmethod
    def _evictable(node: _Node) -> bool:
        return node.alive and node.refs == 0 and not node.children

    def _offer(self, node: _Node) -> None:
        """Put ``node`` on the eviction heap (invalidating its older entry) if it is evictable."""
        if not self._evictable(node):
            return
        self._seq += 1
        node.stamp = self._seq
        heapq.heappush(self._heap, (self._priority(node), self._seq, node))
        if len(self._heap) > 2 * len(self._by_block) + 64:
            self._compact()

    def _compact(self) -> None:
        self._heap = [entry for entry in self._heap if entry[2].stamp == entry[1] and self._evictable(entry[2])]
        heapq.heapify(self._heap)

    def _unlink(self, node: _Node) -> None:
        parent = node.parent
        assert parent is not None
        del parent.children[node.key]  # type: ignore[arg-type]  # only roots have bytes keys
        del self._by_block[node.block_id]
        node.alive = False
        node.parent = None

    def _evict_lru(self, num_blocks: int) -> list[int]:
        out: list[int] = []
        heap = self._heap
        while len(out) < num_blocks and heap:
            priority, seq, node = heapq.heappop(heap)
            if node.stamp != seq or priority != self._priority(node) or not self._evictable(node):
                continue  # stale entry
            parent = node.parent
            assert parent is not None
            self._unlink(node)
            out.append(node.block_id)
            if parent.parent is not None:
                self._offer(parent)
            elif not parent.children:
                del self._roots[parent.key]  # type: ignore[arg-type]
        self._evicted += len(out)
        return out


def build_radix(options: RadixOptions, context: BuildContext) -> RadixCache:
    """A radix tree over whole token blocks, per-tenant (salt), LRU leaf eviction."""
    return RadixCache(block_size=options.block_size, max_blocks=options.max_blocks)
