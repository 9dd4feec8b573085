"""Stack files: every mistake is an error naming its dotted path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import pytest
from lamina.kernel.plugins import load_plugins
from lamina.kernel.stack_config import ComponentSpec, Split, StackConfig
from lamina_hookspecs import hookimpl
from lamina_hookspecs.errors import ConfigError


@attrs.frozen(kw_only=True)
class Knobs:
    depth: int = attrs.field(default=2, validator=attrs.validators.ge(1))
    ratio: float = 0.5
    mode: str = attrs.field(default="fast", validator=attrs.validators.in_(["fast", "slow"]))
    tags: tuple[str, ...] = ()
    label: str | None = None


class KnobRouter:
    @hookimpl
    def lamina_register_routers(self, register: Any) -> None:
        register("knobs", lambda options, context: options, options=Knobs)


@pytest.fixture
def registry() -> Any:
    return load_plugins(extra=[("knobs", KnobRouter())]).registry


def load(registry: Any, **sections: Any) -> StackConfig:
    base: dict[str, Any] = {"executor": {"use": "echo"}}
    return StackConfig.from_dict({**base, **sections}, registry)


@pytest.mark.parametrize(("sections", "message"), [
    ({"router": {"use": "round-robbin"}},
     "router.use: no router named 'round-robbin'; did you mean 'round-robin'? installed: knobs, "
     "least-outstanding-tokens, p2c, prefix-affinity, round-robin, scored, shortest-queue"),
    ({"router": {"use": "knobs", "depht": 3}}, "router.depht: unknown option; did you mean 'depth'?"),
    ({"router": {"use": "knobs", "depth": "3"}}, "router.depth: must be an integer; got '3'"),
    ({"router": {"use": "knobs", "depth": 0}}, "router.depth: must be >= 1: 0"),
    ({"router": {"use": "knobs", "ratio": True}}, "router.ratio: must be a number"),
    ({"router": {"use": "knobs", "mode": "medium"}}, "router.mode: "),
    ({"router": {"use": "knobs", "tags": ["a", 2]}}, "router.tags[1]: must be a string; got 2"),
    ({"router": {"use": "round-robin", "extra": 1}}, "router.extra: unknown option; options: none"),
    ({"router": {}}, "router.use: missing"),
    ({"routr": {"use": "round-robin"}}, "routr: unknown section; did you mean 'router'?"),
    ({"server": {"port": 70000}}, "server.port: must be <= 65535: 70000"),
    ({"admission": [{"use": "nope"}]}, "admission[0].use: no admission component named 'nope'"),
    ({"ab": {"autoscaler": {}}}, "ab.autoscaler: unknown splittable layer"),
    ({"ab": {"router": {"arms": [{"name": "a", "use": "round-robin"}]}}}, "ab.router.arms: must list at least two"),
    ({"ab": {"router": {"arms": [{"name": "a", "use": "round-robin"}, {"name": "a", "use": "knobs"}]}}},
     "ab.router.arms[1].name: arm name 'a' is used twice"),
    ({"ab": {"router": {"arms": [{"name": "a", "use": "round-robin", "weight": -1}, {"name": "b", "use": "knobs"}]}}},
     "ab.router.arms[0].weight: must be a positive number"),
    ({"ab": {"router": {"sticky_by": "ip", "arms": []}}}, "ab.router.sticky_by: must be one of tenant, user, request"),
    ({"ab": {"router": {"arms": [{"name": "a", "use": "round-robin"}, {"name": "b", "use": "knobs", "depth": 0}]}}},
     "ab.router.arms[1].depth: must be >= 1: 0"),
    ({"router": {"use": "knobs"}, "ab": {"router": {"arms": []}}}, "ab.router: [router] and [ab.router] are both"),
])
def test_errors_name_the_path(registry: Any, sections: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load(registry, **sections)
    assert str(info.value).startswith(message), str(info.value)


def test_options_are_built_and_typed(registry: Any) -> None:
    config = load(registry, router={"use": "knobs", "depth": 4, "ratio": 1, "tags": ["x"], "label": "l"})
    spec = config.layers["router"]
    assert isinstance(spec, ComponentSpec)
    assert spec.options == Knobs(depth=4, ratio=1.0, tags=("x",), label="l")


def test_defaults_fill_missing_layers_and_optional_layers_stay_empty(registry: Any) -> None:
    config = load(registry)
    assert config.layers["router"].name == "round-robin"  # type: ignore[union-attr]
    assert config.layers["prefix_cache"] is None and config.layers["batching"] is None
    assert config.server.host == "127.0.0.1"


def test_ab_split_is_parsed(registry: Any) -> None:
    config = load(registry, ab={"router": {"sticky_by": "user", "arms": [
        {"name": "control", "use": "round-robin", "weight": 95},
        {"name": "treatment", "use": "knobs", "weight": 5, "depth": 7}]}})
    split = config.layers["router"]
    assert isinstance(split, Split) and split.sticky_by == "user"
    assert [(a.name, a.weight, a.spec.name) for a in split.arms] == [("control", 95.0, "round-robin"),
                                                                     ("treatment", 5.0, "knobs")]
    assert split.arms[1].spec.options.depth == 7


def test_from_toml_reports_syntax_errors_and_missing_files(registry: Any, tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[router\nuse = 1\n")
    with pytest.raises(ConfigError, match="is not valid TOML"):
        StackConfig.from_toml(bad, registry)
    with pytest.raises(ConfigError, match="cannot read stack file"):
        StackConfig.from_toml(tmp_path / "missing.toml", registry)
