from lamina.testing.contracts import RouterContract
from lamina_hookspecs.types import BackendState, Request

from lamina_routing.round_robin import RoundRobin


class TestRoundRobin(RouterContract):
    registered_name = "round-robin"


def test_cycles_over_available_backends() -> None:
    router = RoundRobin()
    backends = [BackendState(name="a", model="m"), BackendState(name="b", model="m", healthy=False),
                BackendState(name="c", model="m")]
    request = Request(id="r", model="m", prompt="x")
    assert [router.choose(request, backends).name for _ in range(4)] == ["a", "c", "a", "c"]
