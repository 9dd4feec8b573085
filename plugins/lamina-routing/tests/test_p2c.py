from collections import Counter

from lamina.testing.contracts import RouterContract
from lamina_hookspecs.types import BackendState, Request

from lamina_routing.p2c import PowerOfTwoChoices

REQUEST = Request(id="r", model="m", prompt="x")
BACKENDS = [BackendState(name="idle", model="m", outstanding_tokens=0),
            BackendState(name="busy", model="m", outstanding_tokens=1_000),
            BackendState(name="swamped", model="m", outstanding_tokens=100_000)]


class TestP2C(RouterContract):
    registered_name = "p2c"


class TestP2CSeeded(RouterContract):
    registered_name = "p2c"
    options = {"seed": 7}


def test_is_deterministic_with_a_seed() -> None:
    first, second = PowerOfTwoChoices(seed=42), PowerOfTwoChoices(seed=42)
    equal = [BackendState(name=f"b{i}", model="m") for i in range(5)]
    picks = [first.choose(REQUEST, equal).name for _ in range(200)]
    assert picks == [second.choose(REQUEST, equal).name for _ in range(200)]
    assert len(set(picks)) == 5


def test_never_picks_the_worst_and_favours_the_best() -> None:
    router = PowerOfTwoChoices(seed=1)
    counts = Counter(router.choose(REQUEST, BACKENDS).name for _ in range(3000))
    # Any pair holding the swamped backend holds a less loaded one; the idle one is in 2 of 3 pairs.
    assert counts["swamped"] == 0
    assert 0.62 < counts["idle"] / 3000 < 0.72
    assert 0.28 < counts["busy"] / 3000 < 0.38


def test_breaks_token_ties_by_queue_depth() -> None:
    backends = [BackendState(name="a", model="m", queue_depth=4), BackendState(name="b", model="m", queue_depth=1)]
    router = PowerOfTwoChoices(seed=3)
    assert {router.choose(REQUEST, backends).name for _ in range(20)} == {"b"}


def test_one_available_backend_is_taken() -> None:
    backends = [BackendState(name="a", model="m", healthy=False), BackendState(name="b", model="m")]
    assert PowerOfTwoChoices(seed=0).choose(REQUEST, backends).name == "b"
