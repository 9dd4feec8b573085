"""Every router, on any backends: never an unavailable backend while an available one exists."""

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lamina.kernel.options import build_options
from lamina_hookspecs.errors import NoBackendError
from lamina_hookspecs.registration import BuildContext
from lamina_hookspecs.types import BackendState, ChatMessage, Request

from lamina_routing.least_outstanding import build_least_outstanding_tokens
from lamina_routing.p2c import P2COptions, build_p2c
from lamina_routing.prefix_affinity import PrefixAffinityOptions, build_prefix_affinity
from lamina_routing.round_robin import build_round_robin
from lamina_routing.scored import ScoredOptions, build_scored

CONTEXT = BuildContext(stack_name="test")
EVERY_SCORER = {"load": 1.0, "queue": 0.5, "kv": 0.5, "prefix": 2.0}
ROUTERS: dict[str, Callable[[], Any]] = {
    "round-robin": lambda: build_round_robin(None, CONTEXT),
    "least-outstanding-tokens": lambda: build_least_outstanding_tokens(None, CONTEXT),
    "p2c": lambda: build_p2c(P2COptions(seed=0), CONTEXT),
    "prefix-affinity": lambda: build_prefix_affinity(PrefixAffinityOptions(virtual_nodes=8), CONTEXT),
    "scored-max": lambda: build_scored(build_options(ScoredOptions, {
        "weights": EVERY_SCORER, "filters": {"max_queue_depth": 3, "max_kv_usage": 0.5}}, "router"), CONTEXT),
    "scored-p2c": lambda: build_scored(build_options(ScoredOptions, {
        "weights": EVERY_SCORER, "picker": "p2c", "seed": 0}, "router"), CONTEXT),
}

small = st.integers(min_value=0, max_value=50)
backend_lists = st.lists(st.builds(
    BackendState, name=st.sampled_from([f"b{i}" for i in range(8)]), model=st.just("m"), healthy=st.booleans(),
    draining=st.booleans(), circuit_open=st.booleans(), outstanding_requests=small,
    outstanding_tokens=st.integers(min_value=0, max_value=100_000), queue_depth=small, kv_blocks_used=small,
    kv_blocks_total=st.sampled_from([0, 50]),
), max_size=8, unique_by=lambda b: b.name)
text = st.text(max_size=300)
requests = st.builds(
    Request, id=st.just("r"), model=st.just("m"), tenant=st.sampled_from(["default", "t1", "t2"]),
    prompt=text,
) | st.builds(
    Request, id=st.just("r"), model=st.just("m"),
    prompt_token_ids=st.lists(st.integers(min_value=0, max_value=200_000), max_size=100),
) | st.builds(
    Request, id=st.just("r"), model=st.just("m"),
    messages=st.lists(st.builds(ChatMessage, role=st.sampled_from(["system", "user", "assistant"]), content=text),
                      max_size=4),
)


@pytest.mark.parametrize("name", ROUTERS)
@settings(max_examples=150, deadline=None)
@given(calls=st.lists(st.tuples(requests, backend_lists), min_size=1, max_size=5))
def test_never_chooses_an_unavailable_backend(name: str, calls: list[tuple[Request, list[BackendState]]]) -> None:
    router = ROUTERS[name]()
    for request, backends in calls:
        if any(b.available for b in backends):
            chosen = router.choose(request, backends)
            assert any(chosen is b for b in backends) and chosen.available
        else:
            with pytest.raises(NoBackendError):
                router.choose(request, backends)
