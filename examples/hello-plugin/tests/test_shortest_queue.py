"""The conformance kit, run against this plugin: one class, one line."""

from lamina.testing.contracts import RouterContract
from lamina_hookspecs.types import BackendState, Request

from lamina_hello import ShortestQueue, ShortestQueueOptions


class TestShortestQueue(RouterContract):
    registered_name = "shortest-queue"


def test_prefers_the_shortest_queue() -> None:
    router = ShortestQueue(ShortestQueueOptions())
    backends = [
        BackendState(name="a", model="m", queue_depth=3),
        BackendState(name="b", model="m", queue_depth=1, outstanding_requests=1),
        BackendState(name="c", model="m", queue_depth=0, outstanding_requests=5),
    ]
    request = Request(id="r", model="m", prompt="hi")
    assert router.choose(request, backends).name == "b"
    waiting_only = ShortestQueue(ShortestQueueOptions(count_running=False))
    assert waiting_only.choose(request, backends).name == "c"
