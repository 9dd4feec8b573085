from lamina.testing.contracts import AutoscalerContract
from lamina_hookspecs.types import BackendState

from lamina_autoscale.static import Static, StaticOptions


class TestStaticContract(AutoscalerContract):
    registered_name = "static"
    options = {"replicas": 3}


def test_answers_the_configured_count_under_any_load() -> None:
    scaler = Static(StaticOptions(replicas=3))
    busy = [BackendState(name="a", model="m", queue_depth=500)]
    assert scaler.decide(busy, 0.0).replicas == scaler.decide([], 1.0).replicas == 3
