from lamina.testing.contracts import PrefixCacheContract

from lamina_prefix_cache.hot import HotPrefixCache

B = 4


def blocks(*starts: int) -> list[int]:
    return [t for s in starts for t in range(s, s + B)]


class TestHotPrefix(PrefixCacheContract):
    registered_name = "hot-prefix"


class TestHotPrefixEveryBlockHot(PrefixCacheContract):
    registered_name = "hot-prefix"
    options = {"min_uses": 1, "block_size": 3}


def test_recurring_prefix_outlives_newer_one_off_prompts() -> None:
    cache = HotPrefixCache(block_size=B, min_uses=3)
    cache.insert(blocks(0), [1], salt=b"")  # the shared system prompt: use 1
    for _ in range(2):
        cache.release(cache.match(blocks(0, 50), salt=b""))  # uses 2, 3: hot
    cache.insert(blocks(10), [2], salt=b"")  # one-off prompts, more recent
    cache.insert(blocks(20), [3], salt=b"")
    assert cache.stats()["hot_blocks"] == 1
    assert cache.evict(2) == [2, 3]  # cold ones first despite being newer
    assert cache.evict(1) == [1]  # a hot block still goes when nothing else is left


def test_hot_blocks_are_ordered_by_recency_among_themselves() -> None:
    cache = HotPrefixCache(block_size=B, min_uses=1)
    cache.insert(blocks(0), [1], salt=b"")
    cache.insert(blocks(10), [2], salt=b"")
    cache.release(cache.match(blocks(0), salt=b""))
    assert cache.evict(2) == [2, 1]
