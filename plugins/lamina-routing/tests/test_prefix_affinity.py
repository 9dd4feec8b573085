from collections import Counter

import attrs
import pytest

from lamina.kernel.options import build_options, describe
from lamina.testing.contracts import RouterContract
from lamina_hookspecs.errors import ConfigError
from lamina_hookspecs.types import BackendState, ChatMessage, Request

from lamina_routing.hash_ring import HashRing
from lamina_routing.prefix_affinity import PrefixAffinity, PrefixAffinityOptions
from lamina_routing.prefix_key import prefix_key

OPTIONS = PrefixAffinityOptions()
NAMES = ["b0", "b1", "b2", "b3", "b4"]


def backends(names: list[str] = NAMES, **loads: int) -> list[BackendState]:
    return [BackendState(name=name, model="m", outstanding_requests=loads.get(name, 0)) for name in names]


def key(request: Request) -> int:
    return prefix_key(request, prefix_blocks=OPTIONS.prefix_blocks, block_tokens=OPTIONS.block_tokens)


def text(prompt: str, tenant: str = "t") -> Request:
    return Request(id="r", model="m", prompt=prompt, tenant=tenant)


def ids(token_ids: list[int], tenant: str = "t") -> Request:
    return Request(id="r", model="m", prompt_token_ids=token_ids, tenant=tenant)


def chat(*turns: tuple[str, str]) -> Request:
    return Request(id="r", model="m", messages=[ChatMessage(role=role, content=content) for role, content in turns])


class TestPrefixAffinity(RouterContract):
    registered_name = "prefix-affinity"


def test_options_validate_and_document_every_field() -> None:
    assert build_options(PrefixAffinityOptions, {}, "router") == PrefixAffinityOptions(
        virtual_nodes=100, prefix_blocks=4, block_tokens=16, load_factor=1.25)
    assert all(field["help"] for field in describe(PrefixAffinityOptions))
    with pytest.raises(ConfigError, match=r"^router.load_factor: must be >= 1.0"):
        build_options(PrefixAffinityOptions, {"load_factor": 0.5}, "router")
    with pytest.raises(ConfigError, match=r"^router.virtual_nodes: must be >= 1"):
        build_options(PrefixAffinityOptions, {"virtual_nodes": 0}, "router")


def test_key_covers_the_leading_whole_blocks_only() -> None:
    head = list(range(64))
    assert key(ids(head + [1, 2, 3])) == key(ids(head + [9]))  # past prefix_blocks * block_tokens
    assert key(ids(head[:40])) == key(ids(head[:32] + [7] * 8))  # a partial last block is left out
    assert key(ids(head[:32])) != key(ids(head[:48]))
    assert key(ids([1, 2, 3])) != key(ids([1, 2, 4]))  # short of one block: hashes what it has
    assert key(ids([1, 2, 3])) == key(ids([1, 2, 3]))


def test_key_covers_the_leading_bytes_of_text_and_chat() -> None:
    system = ("system", "You are a helpful assistant. " * 10)  # over 4 * 16 * 4 = 256 bytes
    assert key(text("x" * 256 + "tail one")) == key(text("x" * 256 + "tail two"))
    assert key(text("short one")) != key(text("short two"))
    assert key(chat(system, ("user", "hi"))) == key(chat(system, ("user", "bye")))
    shared = [("system", "Be brief."), ("user", "What is 2+2?"), ("assistant", "4. " + "Indeed. " * 30)]
    assert key(chat(*shared, ("user", "And 3+3?"))) == key(chat(*shared, ("user", "Why?")))
    assert key(chat(("system", "Be brief."), ("user", "a"))) != key(chat(("system", "Be brief."), ("user", "b")))
    assert key(text("same", tenant="t1")) != key(text("same", tenant="t2"))


def test_same_prefix_same_backend() -> None:
    router = PrefixAffinity(OPTIONS)
    head = list(range(100, 164))
    picks = {router.choose(ids(head + [i]), backends()).name for i in range(50)}
    assert len(picks) == 1


def test_distinct_prefixes_spread_over_backends() -> None:
    router = PrefixAffinity(OPTIONS)
    counts = Counter(router.choose(text(f"document {i}"), backends()).name for i in range(1000))
    assert set(counts) == set(NAMES)
    assert min(counts.values()) > 100  # 200 each on average


def test_tenants_with_the_same_prompt_spread() -> None:
    router = PrefixAffinity(OPTIONS)
    two = backends(["b0", "b1"])
    counts = Counter(router.choose(text("the same system prompt", tenant=f"tenant-{i}"), two).name
                     for i in range(100))
    assert min(counts["b0"], counts["b1"]) > 20


def test_spills_to_the_next_on_the_ring_when_home_is_over_the_bound() -> None:
    router = PrefixAffinity(OPTIONS)
    names = ["b0", "b1", "b2"]
    request = text("a hot prefix")
    home = router.choose(request, backends(names)).name
    successor = router.choose(request, backends([n for n in names if n != home])).name
    # 3 backends, home holding L requests: bound = ceil(1.25 * (L + 1) / 3)
    assert router.choose(request, backends(names, **{home: 2})).name == home  # bound 2: 2 <= 2
    assert router.choose(request, backends(names, **{home: 3})).name == successor  # bound 2: 3 > 2
    assert router.choose(request, backends(names, **{home: 5, successor: 1})).name == successor  # bound 3
    third = ({*names} - {home, successor}).pop()
    assert router.choose(request, backends(names, **{home: 10, successor: 10})).name == third  # bound 9


def test_removing_a_backend_only_moves_its_keys() -> None:
    router = PrefixAffinity(OPTIONS)
    requests = [text(f"conversation {i}") for i in range(1000)]
    before = [router.choose(r, backends()).name for r in requests]
    survivors = backends([n for n in NAMES if n != "b2"])
    after = [router.choose(r, survivors).name for r in requests]
    kept = [b == a for b, a in zip(before, after, strict=True) if b != "b2"]
    assert sum(kept) / len(kept) >= 0.9
    assert len({a for b, a in zip(before, after, strict=True) if b == "b2"}) > 1  # its keys spread


def test_an_unavailable_backend_is_skipped_as_if_removed_without_rebuilding_the_ring() -> None:
    router = PrefixAffinity(OPTIONS)
    requests = [text(f"conversation {i}") for i in range(200)]
    offered = backends()
    router.choose(requests[0], offered)
    ring = router._ring
    offered[2] = attrs.evolve(offered[2], healthy=False)
    skipped = [router.choose(r, offered).name for r in requests]
    assert router._ring is ring
    assert skipped == [router.choose(r, backends([n for n in NAMES if n != "b2"])).name for r in requests]


def test_ring_walk_meets_every_owner_once() -> None:
    ring = HashRing(("a", "b", "c", "d"), virtual_nodes=10)
    for point in (0, 2**63, 2**64 - 1, key(text("x"))):
        assert sorted(ring.walk(point)) == [0, 1, 2, 3]
