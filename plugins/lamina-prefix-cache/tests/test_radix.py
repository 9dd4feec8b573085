import pytest

from lamina.testing.contracts import PrefixCacheContract
from lamina_hookspecs.errors import ConfigError
from lamina_hookspecs.types import PrefixMatch

from lamina_prefix_cache.radix import Adoption, RadixCache, RadixOptions, build_radix

B = 4  # block size used by the unit tests


def blocks(*starts: int) -> list[int]:
    """Token ids made of whole blocks, block ``i`` being ``range(starts[i], starts[i] + B)``."""
    return [t for s in starts for t in range(s, s + B)]


class TestRadix(PrefixCacheContract):
    registered_name = "radix"


class TestRadixSmallBlocksCapped(PrefixCacheContract):
    registered_name = "radix"
    options = {"block_size": 2, "max_blocks": 8}


def test_options_are_checked_and_documented() -> None:
    from lamina.kernel.options import build_options, describe

    assert RadixOptions().block_size == 16 and RadixOptions().max_blocks is None
    assert all(o["help"] for o in describe(RadixOptions))
    with pytest.raises(ConfigError):
        build_options(RadixOptions, {"block_size": 0}, "prefix_cache")
    with pytest.raises(ConfigError):
        build_options(RadixOptions, {"max_blocks": 0}, "prefix_cache")
    cache = build_radix(build_options(RadixOptions, {"block_size": 8, "max_blocks": 3}, "prefix_cache"), None)  # type: ignore[arg-type]
    assert (cache.block_size, cache.max_blocks) == (8, 3)


def test_longest_whole_block_prefix() -> None:
    cache = RadixCache(block_size=B)
    cache.insert(blocks(0, 10, 20), [1, 2, 3], salt=b"")
    cache.insert(blocks(0, 10, 30, 40), [1, 2, 4, 5], salt=b"")
    m = cache.match(blocks(0, 10, 30, 99), salt=b"")
    assert m == PrefixMatch(num_tokens=3 * B, block_ids=(1, 2, 4))
    full = cache.match(blocks(0, 10, 20), salt=b"")
    assert full == PrefixMatch(num_tokens=3 * B, block_ids=(1, 2, 3))  # the whole prompt may hit
    assert cache.match(blocks(99), salt=b"").num_tokens == 0
    assert cache.match(blocks(10), salt=b"").num_tokens == 0  # prefixes only, never a middle
    cache.release(m)
    cache.release(full)


def test_partial_blocks_are_never_cached_nor_matched() -> None:
    cache = RadixCache(block_size=B)
    tokens = blocks(0, 10) + [7, 7]  # two whole blocks and a partial one
    adoption = cache.adopt(tokens, [1, 2, 3], salt=b"")
    assert adoption == Adoption(adopted=(1, 2))
    assert not cache.owns(3) and len(cache) == 2  # the tail block stays the caller's
    m = cache.match(tokens + [8], salt=b"")
    assert m.num_tokens == 2 * B and m.block_ids == (1, 2)
    cache.release(m)
    m = cache.match(blocks(0)[:B - 1], salt=b"")  # shorter than one block
    assert m == PrefixMatch(num_tokens=0)
    cache.release(m)  # releasing an empty match is a no-op
    # Fewer block ids than whole blocks: only those are stored.
    cache.insert(blocks(50, 60, 70), [9], salt=b"")
    assert cache.match(blocks(50, 60, 70), salt=b"").block_ids == (9,)


def test_salt_isolates_tenants() -> None:
    cache = RadixCache(block_size=B)
    cache.insert(blocks(0, 10), [1, 2], salt=b"alice")
    assert cache.match(blocks(0, 10), salt=b"bob") == PrefixMatch(num_tokens=0)
    assert cache.match(blocks(0, 10), salt=b"") == PrefixMatch(num_tokens=0)
    # The same tokens under another salt are a separate entry with its own blocks.
    assert cache.adopt(blocks(0, 10), [3, 4], salt=b"bob").adopted == (3, 4)
    assert cache.match(blocks(0, 10), salt=b"alice").block_ids == (1, 2)
    assert cache.match(blocks(0, 10), salt=b"bob").block_ids == (3, 4)
    # A lookup under one salt does not touch the other's recency.
    cache2 = RadixCache(block_size=B)
    cache2.insert(blocks(0), [1], salt=b"a")
    cache2.insert(blocks(0), [2], salt=b"b")
    cache2.release(cache2.match(blocks(0), salt=b"z"))
    assert cache2.evict(1) == [1]


def test_pinned_blocks_are_never_evicted() -> None:
    cache = RadixCache(block_size=B)
    cache.insert(blocks(0, 10, 20), [1, 2, 3], salt=b"")
    cache.insert(blocks(5), [4], salt=b"")
    m = cache.match(blocks(0, 10), salt=b"")
    assert m.block_ids == (1, 2)
    # 3 is an unpinned leaf, then 4; 2 and 1 are pinned.
    assert sorted(cache.evict(10)) == [3, 4]
    assert cache.evict(10) == []
    m2 = cache.match(blocks(0), salt=b"")
    cache.release(m)
    assert cache.evict(10) == [2]  # 1 is still pinned by m2
    cache.release(m2)
    assert cache.evict(10) == [1]
    assert len(cache) == 0 and cache.stats()["pinned_blocks"] == 0


def test_release_must_match_an_outstanding_match() -> None:
    cache = RadixCache(block_size=B)
    cache.insert(blocks(0), [1], salt=b"")
    m = cache.match(blocks(0), salt=b"")
    cache.release(m)
    with pytest.raises(ValueError):
        cache.release(m)
    with pytest.raises(ValueError):
        cache.release(PrefixMatch(num_tokens=B, block_ids=(42,)))
    assert cache.evict(1) == [1]


def test_evicts_least_recently_used_first() -> None:
    cache = RadixCache(block_size=B)
    cache.insert(blocks(0), [1], salt=b"")
    cache.insert(blocks(10), [2], salt=b"")
    cache.insert(blocks(20), [3], salt=b"")
    cache.insert(blocks(10), [2], salt=b"")  # re-inserting touches too: order now 1, 3, 2
    cache.release(cache.match(blocks(0), salt=b""))  # a hit touches: order now 3, 2, 1
    assert cache.evict(1) == [3]
    assert cache.evict(1) == [2]
    assert cache.evict(5) == [1]


def test_evicting_a_leaf_exposes_its_parent() -> None:
    cache = RadixCache(block_size=B)
    cache.insert(blocks(0, 10, 20), [1, 2, 3], salt=b"")
    cache.insert(blocks(50), [9], salt=b"")  # more recent than the chain
    assert cache.evict(1) == [3]
    # 2 is a leaf now and older than 9: it goes before 9, then 1.
    assert cache.evict(2) == [2, 1]
    assert cache.evict(2) == [9]
    m = cache.match(blocks(0, 10, 20), salt=b"")
    assert m == PrefixMatch(num_tokens=0)


def test_parents_are_kept_while_a_child_lives() -> None:
    cache = RadixCache(block_size=B)
    cache.insert(blocks(0, 10), [1, 2], salt=b"")
    cache.insert(blocks(0, 20), [1, 3], salt=b"")
    assert sorted(cache.evict(2)) == [2, 3]
    assert cache.evict(1) == [1]


def test_insert_of_existing_prefix_keeps_old_blocks_and_reports_it() -> None:
    cache = RadixCache(block_size=B)
    assert cache.adopt(blocks(0, 10), [1, 2], salt=b"").adopted == (1, 2)
    # Another sequence computed the same prefix into blocks 7, 8 and went one block further.
    result = cache.adopt(blocks(0, 10, 20), [7, 8, 9], salt=b"")
    assert result == Adoption(adopted=(9,))
    assert cache.owns(1) and cache.owns(2) and cache.owns(9)
    assert not cache.owns(7) and not cache.owns(8)  # the caller frees its duplicates
    assert cache.match(blocks(0, 10, 20), salt=b"").block_ids == (1, 2, 9)
    # Inserting blocks that came from a match again: nothing new is taken, all stay the cache's.
    cache.insert(blocks(0, 10, 20), [1, 2, 9], salt=b"")
    assert all(cache.owns(b) for b in (1, 2, 9)) and len(cache) == 3
    # The engine rule: after insert, free what the cache does not own.
    seq_blocks = [1, 2, 9, 11]  # 11: a partially filled tail block
    cache.insert(blocks(0, 10, 20) + [1], seq_blocks, salt=b"")
    assert [b for b in seq_blocks if not cache.owns(b)] == [11]


def test_insert_rejects_ids_cached_elsewhere_and_changes_nothing() -> None:
    cache = RadixCache(block_size=B)
    cache.insert(blocks(0, 10), [1, 2], salt=b"")
    before = dict(cache.stats())
    with pytest.raises(ValueError):
        cache.insert(blocks(30, 40), [5, 2], salt=b"")
    with pytest.raises(ValueError):
        cache.insert(blocks(0, 40), [1, 1], salt=b"")  # repeated id
    with pytest.raises(ValueError):
        cache.insert(blocks(0, 40), [2, 6], salt=b"")  # the cache's 2 is not block (0,)
    with pytest.raises(ValueError):
        cache.insert(blocks(0), [1], salt=b"other")  # ids are global, salts are not
    assert dict(cache.stats()) == before and not cache.owns(5) and not cache.owns(6)


def test_max_blocks_evicts_lru_on_insert() -> None:
    cache = RadixCache(block_size=B, max_blocks=3)
    cache.insert(blocks(0, 10), [1, 2], salt=b"")
    cache.insert(blocks(20), [3], salt=b"")
    result = cache.adopt(blocks(30, 40), [4, 5], salt=b"")
    assert result.adopted == (4, 5)
    assert result.evicted == (2, 1)  # the older chain, leaf first
    assert len(cache) == 3
    # Through the protocol's insert, the evicted ids come back from the next evict call.
    cache.insert(blocks(50), [6], salt=b"")
    assert len(cache) == 3
    assert cache.evict(0) == []
    assert cache.evict(1) == [3]
    assert cache.drain_evicted() == []


def test_max_blocks_with_everything_pinned_gives_the_new_blocks_back() -> None:
    cache = RadixCache(block_size=B, max_blocks=2)
    cache.insert(blocks(0, 10), [1, 2], salt=b"")
    m = cache.match(blocks(0, 10), salt=b"")
    result = cache.adopt(blocks(0, 10, 20, 30), [1, 2, 3, 4], salt=b"")
    assert result == Adoption()
    assert not cache.owns(3) and not cache.owns(4) and len(cache) == 2
    cache.release(m)
    # Room can be made once unpinned; the path being inserted is not evicted for itself.
    result = cache.adopt(blocks(50, 60), [5, 6], salt=b"")
    assert result.adopted == (5, 6) and result.evicted == (2, 1)
    cache.insert(blocks(70, 80, 90), [7, 8, 9], salt=b"")
    assert cache.drain_evicted() == [6, 5] and len(cache) == 2
    assert cache.match(blocks(70, 80, 90), salt=b"").block_ids == (7, 8)


def test_stats_count_lookups_hits_and_blocks() -> None:
    cache = RadixCache(block_size=B)
    cache.insert(blocks(0, 10), [1, 2], salt=b"")
    cache.insert(blocks(0, 10), [7, 8], salt=b"")  # nothing new
    m = cache.match(blocks(0, 10) + [1, 2], salt=b"")
    cache.match(blocks(50), salt=b"")
    stats = cache.stats()
    assert all(isinstance(v, float) for v in stats.values())
    assert stats["lookups"] == 2 and stats["hit_requests"] == 1
    assert stats["lookup_tokens"] == 3 * B + 2 and stats["hit_tokens"] == 2 * B
    assert stats["hit_rate"] == pytest.approx(2 * B / (3 * B + 2))
    assert stats["cached_blocks"] == 2 and stats["inserted_blocks"] == 2
    assert stats["pinned_blocks"] == 2 and stats["evicted_blocks"] == 0
    cache.release(m)
    cache.evict(1)
    stats = cache.stats()
    assert stats["evicted_blocks"] == 1 and stats["cached_blocks"] == 1 and stats["pinned_blocks"] == 0
