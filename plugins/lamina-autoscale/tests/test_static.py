from lamina.testing.contracts import AutoscalerContract
from lamina_hookspecs.types import BackendState, PoolSnapshot

from lamina_autoscale.static import Static, StaticOptions


class TestStaticContract(AutoscalerContract):
    registered_name = "static"
    options = {"replicas": 3}


def test_answers_the_configured_count_under_any_load() -> None:
    scaler = Static(StaticOptions(replicas=3))
    busy = PoolSnapshot(now=0.0, backends=(BackendState(name="a", model="m", queue_depth=500),), arrival_rate=99)
    assert scaler.decide(busy).replicas == scaler.decide(PoolSnapshot(now=1.0)).replicas == 3
