"""A hypothesis state machine: ``RadixCache`` (and ``HotPrefixCache``) against a plain reference model, driven like an
engine that owns block ids, so ownership is checked too (every id is in exactly one place:
the allocator's free pool, the caller, the cache, or the cache's hand-back queue)."""

from __future__ import annotations

import attrs
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from lamina_hookspecs.types import PrefixMatch

from lamina_prefix_cache.hot import HotPrefixCache
from lamina_prefix_cache.radix import RadixCache

B = 2
SALTS = st.sampled_from([b"", b"a", b"b"])
KEYS = st.lists(st.integers(0, 2), max_size=5)  # a small alphabet of blocks: prefixes collide often


def tokens_of(keys: list[int], extra: int) -> list[int]:
    return [k for k in keys for _ in range(B)] + [9] * extra


@attrs.define
class MNode:
    block: int
    refs: int = 0
    last: int = 0
    uses: int = 0


class Model:
    """The reference: a flat dict of whole prefixes, brute force everywhere."""

    def __init__(self, max_blocks: int | None, min_uses: int | None) -> None:
        self.max_blocks = max_blocks
        self.min_uses = min_uses  # None: plain LRU (radix); else hot blocks go last (hot-prefix)
        self.nodes: dict[tuple[bytes, tuple[int, ...]], MNode] = {}
        self.clock = 0
        self.pending: list[int] = []

    def has_child(self, path: tuple[bytes, tuple[int, ...]]) -> bool:
        salt, keys = path
        return any(s == salt and len(k) == len(keys) + 1 and k[:-1] == keys for s, k in self.nodes)

    def walk(self, salt: bytes, keys: list[int]) -> list[tuple[bytes, tuple[int, ...]]]:
        out = []
        for i in range(len(keys)):
            p = (salt, tuple(keys[:i + 1]))
            if p not in self.nodes:
                break
            out.append(p)
        return out

    def match(self, salt: bytes, keys: list[int]) -> tuple[int, ...]:
        path = self.walk(salt, keys)
        if path:
            self.clock += 1
            for p in path:
                self.nodes[p].refs += 1
                self.nodes[p].last = self.clock
                self.nodes[p].uses += 1
        return tuple(self.nodes[p].block for p in path)

    def release(self, ids: tuple[int, ...]) -> None:
        by_block = {n.block: n for n in self.nodes.values()}
        for b in ids:
            by_block[b].refs -= 1

    def evict_lru(self, n: int) -> list[int]:
        out = []
        while len(out) < n:
            cands = [(self.order(node), p) for p, node in self.nodes.items() if node.refs == 0 and not self.has_child(p)]
            if not cands:
                break
            cands.sort()
            assert len(cands) == 1 or cands[0][0] != cands[1][0], "LRU tie: order would be ambiguous"
            out.append(self.nodes.pop(cands[0][1]).block)
        return out

    def order(self, node: MNode) -> tuple[int, int]:
        hot = self.min_uses is not None and node.uses >= self.min_uses
        return (int(hot), node.last)

    def evict(self, n: int) -> list[int]:
        out = self.pending[:max(n, 0)]
        del self.pending[:len(out)]
        return out + self.evict_lru(n - len(out))

    def adopt(self, salt: bytes, keys: list[int], ids: list[int]) -> tuple[list[int], list[int]]:
        keys = keys[:len(ids)]
        if not keys:
            return [], []
        self.clock += 1
        path, adopted = [], []
        for i in range(len(keys)):
            p = (salt, tuple(keys[:i + 1]))
            if p not in self.nodes:
                self.nodes[p] = MNode(ids[i])
                adopted.append(ids[i])
            self.nodes[p].last = self.clock
            self.nodes[p].uses += 1
            path.append(p)
        evicted: list[int] = []
        if self.max_blocks is not None and len(self.nodes) > self.max_blocks:
            for p in path:
                self.nodes[p].refs += 1
            evicted = self.evict_lru(len(self.nodes) - self.max_blocks)
            for p in path:
                self.nodes[p].refs -= 1
            while len(self.nodes) > self.max_blocks and adopted and self.nodes[path[-1]].block == adopted[-1]:
                del self.nodes[path.pop()]
                adopted.pop()
        return adopted, evicted


class RadixMachine(RuleBasedStateMachine):
    @initialize(max_blocks=st.one_of(st.none(), st.integers(1, 6)), min_uses=st.one_of(st.none(), st.integers(1, 3)))
    def setup(self, max_blocks: int | None, min_uses: int | None) -> None:
        if min_uses is None:
            self.cache = RadixCache(block_size=B, max_blocks=max_blocks)
        else:
            self.cache = HotPrefixCache(block_size=B, max_blocks=max_blocks, min_uses=min_uses)
        self.model = Model(max_blocks, min_uses)
        self.where: dict[int, str] = {}  # block id -> "free" | "cache" | "pending" (caller-held ids are transient)
        self.next_id = 0
        self.matches: list[PrefixMatch] = []

    def fresh(self) -> int:
        free = sorted(b for b, w in self.where.items() if w == "free")
        if free and self.next_id % 2:  # reuse freed ids half the time
            self.next_id += 1
            block = free[0]
        else:
            block = self.next_id = self.next_id + 1
        self.where[block] = "caller"
        return block

    def hand_back(self, ids: list[int], from_: tuple[str, ...]) -> None:
        assert len(set(ids)) == len(ids), f"an id handed back twice in one call: {ids}"
        for b in ids:
            assert self.where.get(b) in from_, f"block {b} handed back while {self.where.get(b)}"
            self.where[b] = "free"

    @rule(salt=SALTS, keys=KEYS, extra=st.integers(0, B - 1), reuse=st.booleans(), spare=st.integers(0, 1),
          report=st.booleans())
    def insert(self, salt: bytes, keys: list[int], extra: int, reuse: bool, spare: int, report: bool) -> None:
        path = self.model.walk(salt, keys) if reuse else []  # blocks the engine got from a match
        ids = [self.model.nodes[p].block for p in path]
        ids += [self.fresh() for _ in range(len(keys) - len(ids) + spare)]  # spare: a partial tail block
        tokens = tokens_of(keys, extra)
        adopted, evicted = self.model.adopt(salt, keys, ids)
        if report:
            result = self.cache.adopt(tokens, ids, salt=salt)
            assert list(result.adopted) == adopted and list(result.evicted) == evicted
            self.hand_back(evicted, ("cache",))
        else:
            self.cache.insert(tokens, ids, salt=salt)
            self.model.pending.extend(evicted)
            for b in evicted:
                assert self.where[b] == "cache"
                self.where[b] = "pending"
        for b in adopted:
            assert self.where[b] == "caller"
            self.where[b] = "cache"
        for b in ids:  # the engine's rule: free what the cache does not own
            assert self.cache.owns(b) == (self.where[b] == "cache")
            if self.where[b] == "caller":
                self.where[b] = "free"

    @rule(salt=SALTS, keys=KEYS, extra=st.integers(0, B - 1))
    def match(self, salt: bytes, keys: list[int], extra: int) -> None:
        expected = self.model.match(salt, keys)
        m = self.cache.match(tokens_of(keys, extra), salt=salt)
        assert m == PrefixMatch(num_tokens=len(expected) * B, block_ids=expected)
        for b in m.block_ids:
            assert self.where[b] == "cache"
        if m.block_ids:
            self.matches.append(m)

    @precondition(lambda self: self.matches)
    @rule(index=st.integers(0, 100))
    def release(self, index: int) -> None:
        m = self.matches.pop(index % len(self.matches))
        self.model.release(m.block_ids)
        self.cache.release(m)

    @rule(n=st.integers(0, 4))
    def evict(self, n: int) -> None:
        pinned = {b for m in self.matches for b in m.block_ids}
        expected = self.model.evict(n)
        got = self.cache.evict(n)
        assert got == expected
        assert len(got) <= n and not pinned & set(got)
        self.hand_back(got, ("cache", "pending"))

    @rule()
    def drain(self) -> None:
        got = self.cache.drain_evicted()
        assert got == self.model.pending
        self.model.pending = []
        self.hand_back(got, ("pending",))

    @invariant()
    def agrees_with_the_model(self) -> None:
        cache = self.cache
        by_block = cache._by_block
        assert {n.block for n in self.model.nodes.values()} == set(by_block)
        assert {b for b, w in self.where.items() if w == "cache"} == set(by_block)
        for node in self.model.nodes.values():
            real = by_block[node.block]
            assert real.refs == node.refs >= 0
        pinned = {b for m in self.matches for b in m.block_ids}
        assert cache.stats()["pinned_blocks"] == len(pinned)
        assert cache.stats()["cached_blocks"] == len(by_block)
        if cache.max_blocks is not None:
            assert len(by_block) <= cache.max_blocks
        # No empty roots linger, and every root's salt is its key.
        for salt, root in cache._roots.items():
            assert root.children and root.key == salt


RadixMachine.TestCase.settings = settings(
    max_examples=300, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow],
)
TestRadixMachine = RadixMachine.TestCase
