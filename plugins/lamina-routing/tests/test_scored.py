from collections import Counter
from typing import Any

import pytest

from lamina.kernel.options import build_options, describe
from lamina.testing.contracts import RouterContract
from lamina_hookspecs.errors import ConfigError, NoBackendError
from lamina_hookspecs.registration import BuildContext
from lamina_hookspecs.types import BackendState, Request

from lamina_routing.prefix_affinity import PrefixAffinity, PrefixAffinityOptions
from lamina_routing.scored import Scored, ScoredOptions, build_scored

REQUEST = Request(id="r", model="m", prompt="x")
# a: few outstanding tokens but a full KV cache; b: the reverse.
A = BackendState(name="a", model="m", outstanding_tokens=100, kv_blocks_used=90, kv_blocks_total=100, queue_depth=5)
B = BackendState(name="b", model="m", outstanding_tokens=1000, kv_blocks_used=10, kv_blocks_total=100, queue_depth=0)


def scored(**options: Any) -> Scored:
    return build_scored(build_options(ScoredOptions, options, "router"), BuildContext(stack_name="test"))


class TestScored(RouterContract):
    registered_name = "scored"


class TestScoredWithEverything(RouterContract):
    registered_name = "scored"
    options = {"weights": {"load": 1.0, "queue": 1.0, "kv": 0.5, "prefix": 2.0}, "picker": "p2c", "seed": 3,
               "filters": {"max_queue_depth": 5, "max_kv_usage": 0.5}}


def test_options_default_and_document_every_field() -> None:
    options = build_options(ScoredOptions, {}, "router")
    assert (options.weights, options.filters, options.picker, options.seed) == (
        {"load": 1.0, "kv": 0.5}, {}, "max", None)
    assert all(field["help"] for field in describe(ScoredOptions))


@pytest.mark.parametrize(("options", "message"), [
    ({"weights": {"lod": 1.0}}, r"^router.weights: unknown scorer 'lod' \(did you mean 'load'\?\); "
                                r"scorers: kv, load, prefix, queue$"),
    ({"weights": {"load": -1.0}}, r"^router.weights: weight of 'load' must be a finite number >= 0"),
    ({"picker": "best"}, r"^router.picker: unknown picker 'best'; pickers: max, p2c$"),
    ({"filters": {"max_queue": 4}}, r"^router.filters: unknown filter 'max_queue' "
                                    r"\(did you mean 'max_queue_depth'\?\)"),
    ({"filters": {"max_kv_usage": 1.5}}, r"^router.filters: limit of 'max_kv_usage' must be between 0 and 1"),
    ({"prefix": {"load_factor": 0.9}}, r"^router.prefix.load_factor: must be >= 1.0"),
])
def test_bad_options_are_config_errors_naming_the_option(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_options(ScoredOptions, options, "router")


@pytest.mark.parametrize(("weights", "expected"), [
    ({"load": 1.0}, "a"),
    ({"kv": 1.0}, "b"),
    ({"queue": 1.0}, "b"),
    ({"load": 1.0, "kv": 0.5}, "a"),  # a: 0.9 + 0.05, b: 0 + 0.45
    ({"load": 1.0, "kv": 2.0}, "b"),  # a: 0.9 + 0.2, b: 0 + 1.8
    ({"load": 0.0, "kv": 1.0}, "b"),
])
def test_weights_change_the_choice(weights: dict[str, float], expected: str) -> None:
    assert scored(weights=weights).choose(REQUEST, [A, B]).name == expected


def test_a_heavy_prefix_weight_follows_the_prefix_ring() -> None:
    backends = [BackendState(name=f"b{i}", model="m", outstanding_tokens=10 * i) for i in range(4)]
    router = scored(weights={"load": 1.0, "prefix": 2.0})
    affinity = PrefixAffinity(PrefixAffinityOptions())
    requests = [Request(id="r", model="m", prompt=f"chat {i}") for i in range(100)]
    assert [router.choose(r, backends).name for r in requests] == [affinity.choose(r, backends).name for r in requests]
    assert len({router.choose(r, backends).name for r in requests}) == 4
    assert {scored(weights={"load": 1.0}).choose(r, backends).name for r in requests} == {"b0"}


def test_max_picker_rotates_among_equal_scores() -> None:
    equal = [BackendState(name=f"b{i}", model="m") for i in range(3)]
    router = scored()
    assert [router.choose(REQUEST, equal).name for _ in range(6)] == ["b0", "b1", "b2", "b0", "b1", "b2"]


def test_p2c_picker_is_seeded_and_never_picks_the_worst_score() -> None:
    backends = [BackendState(name=n, model="m", outstanding_tokens=t) for n, t in [("x", 0), ("y", 500), ("z", 1000)]]
    first, second = scored(picker="p2c", seed=5), scored(picker="p2c", seed=5)
    picks = [first.choose(REQUEST, backends).name for _ in range(3000)]
    assert picks == [second.choose(REQUEST, backends).name for _ in range(3000)]
    counts = Counter(picks)
    assert counts["z"] == 0
    assert 0.62 < counts["x"] / 3000 < 0.72


def test_filters_drop_backends_but_never_all_of_them() -> None:
    router = scored(weights={"load": 1.0}, filters={"max_queue_depth": 2})
    assert router.choose(REQUEST, [A, B]).name == "b"  # a (the least loaded) has 5 waiting
    deep = [BackendState(name="c", model="m", queue_depth=9, outstanding_tokens=5), A]
    assert router.choose(REQUEST, deep).name == "c"  # every backend is over: the filter is skipped
    by_kv = scored(weights={"load": 1.0}, filters={"max_kv_usage": 0.5})
    assert by_kv.choose(REQUEST, [A, B]).name == "b"


def test_only_available_backends_of_the_requested_model() -> None:
    other = BackendState(name="other", model="n")
    down = BackendState(name="down", model="m", circuit_open=True)
    router = scored()
    assert router.choose(REQUEST, [other, down, B]).name == "b"
    with pytest.raises(NoBackendError, match="no available backend serves model 'm'") as info:
        router.choose(REQUEST, [other, down])
    assert info.value.code == "no_backend"
