from lamina.testing.contracts import RouterContract
from lamina_hookspecs.types import BackendState, Request

from lamina_routing.least_outstanding import LeastOutstandingTokens

REQUEST = Request(id="r", model="m", prompt="x")


class TestLeastOutstandingTokens(RouterContract):
    registered_name = "least-outstanding-tokens"


def test_picks_the_fewest_outstanding_tokens_then_requests() -> None:
    backends = [BackendState(name="a", model="m", outstanding_tokens=900, outstanding_requests=1),
                BackendState(name="b", model="m", outstanding_tokens=100, outstanding_requests=9),
                BackendState(name="c", model="m", outstanding_tokens=100, outstanding_requests=3),
                BackendState(name="d", model="m", outstanding_tokens=0, healthy=False)]
    assert LeastOutstandingTokens().choose(REQUEST, backends).name == "c"


def test_rotates_among_ties() -> None:
    backends = [BackendState(name="a", model="m", outstanding_tokens=10),
                BackendState(name="b", model="m", outstanding_tokens=50),
                BackendState(name="c", model="m", outstanding_tokens=10),
                BackendState(name="d", model="m", outstanding_tokens=10, draining=True)]
    router = LeastOutstandingTokens()
    assert [router.choose(REQUEST, backends).name for _ in range(4)] == ["a", "c", "a", "c"]
