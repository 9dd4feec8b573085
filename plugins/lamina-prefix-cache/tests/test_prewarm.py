"""The ``recurring`` pre-warm policy: the kit's contract plus what it finds and forgets."""

from __future__ import annotations

import random

from lamina.testing.contracts import PrewarmPolicyContract
from lamina_prefix_cache.prewarm import RecurringOptions, RecurringPrefixes

SYSTEM = list(range(100, 180))  # 80 tokens: 5 blocks of 16


class TestRecurring(PrewarmPolicyContract):
    registered_name = "recurring"


class TestRecurringSmallBudget(PrewarmPolicyContract):
    registered_name = "recurring"
    options = {"block_size": 8, "min_uses": 1.5, "max_tokens": 64, "max_nodes": 64}


def _policy(**options: float) -> RecurringPrefixes:
    return RecurringPrefixes(RecurringOptions(**options))  # type: ignore[arg-type]


def test_wants_a_shared_system_prompt_up_to_where_prompts_diverge() -> None:
    policy, rng = _policy(), random.Random(0)
    for i in range(2):
        policy.observe(SYSTEM + [rng.randrange(1000, 2000) for _ in range(40)], salt=b"t", now=float(i))
    assert policy.wanted(2.0) == [], "seen twice: not yet recurring (min_uses 2.5)"
    policy.observe(SYSTEM + [rng.randrange(1000, 2000) for _ in range(40)], salt=b"t", now=2.0)
    (prefix,) = policy.wanted(2.0)
    assert prefix.token_ids == tuple(SYSTEM) and prefix.salt == b"t" and prefix.uses > 2.9


def test_two_templates_most_used_first_within_the_budget() -> None:
    policy = _policy(max_tokens=100)
    other = list(range(500, 596))  # 96 tokens
    for i in range(5):
        policy.observe(SYSTEM + [9000 + i] * 16, salt=b"t", now=0.0)
    for i in range(4):
        policy.observe(other + [8000 + i] * 16, salt=b"u", now=0.0)
    assert [w.token_ids for w in policy.wanted(0.0)] == [tuple(SYSTEM)], "96 more tokens exceed max_tokens"
    policy = _policy(max_tokens=200)
    for i in range(5):
        policy.observe(SYSTEM + [9000 + i] * 16, salt=b"t", now=0.0)
    for i in range(4):
        policy.observe(other + [8000 + i] * 16, salt=b"u", now=0.0)
    assert [(w.salt, len(w.token_ids)) for w in policy.wanted(0.0)] == [(b"t", 80), (b"u", 96)]


def test_a_pattern_that_stops_recurring_fades_out() -> None:
    policy = _policy(half_life_s=10.0)
    for i in range(4):
        policy.observe(SYSTEM + [9000 + i] * 16, salt=b"t", now=0.0)
    assert policy.wanted(2.0)
    assert policy.wanted(30.0) == [], "4 uses halved three times is below 2.5"


def test_short_prefixes_are_not_worth_keeping() -> None:
    policy = _policy(min_tokens=96)
    for i in range(5):
        policy.observe(SYSTEM + [9000 + i] * 16, salt=b"t", now=0.0)
    assert policy.wanted(0.0) == []


def test_memory_is_bounded_and_keeps_what_recurs() -> None:
    policy, rng = _policy(max_nodes=200), random.Random(1)
    for i in range(500):
        if i % 5 == 0:
            policy.observe(SYSTEM + [rng.randrange(1000, 2000) for _ in range(16)], salt=b"t", now=float(i))
        policy.observe([rng.randrange(50000) for _ in range(160)], salt=b"x", now=float(i))
        assert policy._nodes <= 200
    assert [w.token_ids for w in policy.wanted(500.0)] == [tuple(SYSTEM)]
