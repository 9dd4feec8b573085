"""Plugin discovery, attribution, and how broken plugins are reported."""

from __future__ import annotations

import importlib.metadata
from typing import Any

import pytest
from lamina.kernel import plugins as plugins_module
from lamina.kernel.plugins import load_plugins
from lamina_hookspecs import hookimpl
from lamina_hookspecs.errors import ConfigError
from lamina_hookspecs.layers import ROUTER


class TwoRouters:
    @hookimpl
    def lamina_register_routers(self, register: Any) -> None:
        register("alpha", lambda o, c: None, summary="first")
        register("beta", lambda o, c: None)


class AlsoAlpha:
    @hookimpl
    def lamina_register_routers(self, register: Any) -> None:
        register("alpha", lambda o, c: None)


class Misspelled:
    @hookimpl
    def lamina_register_router(self, register: Any) -> None:  # missing "s"
        register("gamma", lambda o, c: None)


class Exploding:
    @hookimpl
    def lamina_register_routers(self, register: Any) -> None:
        raise RuntimeError("boom")


def test_installed_plugins_are_found_through_entry_points() -> None:
    plugins = load_plugins()
    assert plugins.infos["routing"].registered == {
        "router": ["round-robin", "least-outstanding-tokens", "p2c", "prefix-affinity", "scored"]}
    assert plugins.infos["routing"].distribution == "lamina-routing"
    assert plugins.infos["hello"].version == "0.1.0"
    assert plugins.registry.get((ROUTER,), "round-robin", "router.use").plugin == "routing"


def test_names_are_attributed_to_their_plugin() -> None:
    plugins = load_plugins(entry_points=False, extra=[("two", TwoRouters())])
    assert plugins.infos["two"].registered == {"router": ["alpha", "beta"]}
    assert plugins.registry.get((ROUTER,), "alpha", "router.use").summary == "first"


def test_a_name_registered_twice_names_both_plugins() -> None:
    plugins = load_plugins(entry_points=False, extra=[("two", TwoRouters()), ("also", AlsoAlpha())])
    assert "registered by both plugin 'two' and plugin 'also'" in plugins.infos["also"].error
    with pytest.raises(ConfigError, match="registered by both plugin 'two' and plugin 'also'"):
        plugins.registry.get((ROUTER,), "alpha", "router.use")
    assert plugins.registry.get((ROUTER,), "beta", "router.use").plugin == "two"


def test_unknown_hook_gets_a_suggestion_and_only_fails_its_plugin() -> None:
    plugins = load_plugins(entry_points=False, extra=[("typo", Misspelled()), ("two", TwoRouters())])
    assert "did you mean 'lamina_register_routers'?" in plugins.infos["typo"].error
    assert plugins.infos["two"].error is None


def test_a_plugin_failing_in_registration_is_recorded_and_named_when_used() -> None:
    plugins = load_plugins(entry_points=False, extra=[("bad", Exploding())])
    assert "RuntimeError: boom" in plugins.infos["bad"].error
    with pytest.raises(ConfigError, match="plugins that failed to load: bad"):
        plugins.registry.get((ROUTER,), "whatever", "router.use")


def test_import_errors_are_wrapped_with_the_plugin_name(monkeypatch: pytest.MonkeyPatch) -> None:
    broken = importlib.metadata.EntryPoint(name="broken", value="no_such_module_xyz", group="lamina")
    monkeypatch.setattr(plugins_module.importlib.metadata, "entry_points", lambda group: [broken])
    plugins = load_plugins()
    assert plugins.infos["broken"].error.startswith('Error importing plugin "broken": ModuleNotFoundError')


@pytest.mark.parametrize(("env", "value", "present", "absent"), [
    ("LAMINA_PLUGINS", "routing,echo", {"routing", "echo"}, {"hello"}),
    ("LAMINA_DISABLE_PLUGINS", "hello", {"routing"}, {"hello"}),
])
def test_allow_and_block_lists(monkeypatch: pytest.MonkeyPatch, env: str, value: str, present: set[str],
                               absent: set[str]) -> None:
    monkeypatch.setenv(env, value)
    names = set(load_plugins().infos)
    assert present <= names and not absent & names


def test_hook_tracing_logs_calls(monkeypatch: pytest.MonkeyPatch, lamina_logs: list[dict[str, Any]]) -> None:
    monkeypatch.setenv("LAMINA_TRACE_PLUGINS", "1")
    plugins = load_plugins(entry_points=False, extra=[("two", TwoRouters())])
    plugins.pm.hook.lamina_request_received(ctx=None)
    assert any(e["event"] == "hook_call" and e["hook"] == "lamina_request_received" for e in lamina_logs)


def test_no_global_plugin_manager() -> None:
    assert load_plugins().pm is not load_plugins().pm


class EveryLayer:
    """One registration per registration hook."""

    @hookimpl
    def lamina_register_routers(self, register: Any) -> None:
        register("r", lambda o, c: None)

    @hookimpl
    def lamina_register_codecs(self, register: Any) -> None:
        register("c", lambda o, c: None)

    @hookimpl
    def lamina_register_executors(self, register: Any) -> None:
        register("e", lambda o, c: None)

    @hookimpl
    def lamina_register_prefix_caches(self, register: Any) -> None:
        register("p", lambda o, c: None)

    @hookimpl
    def lamina_register_autoscalers(self, register: Any) -> None:
        register("a", lambda o, c: None)

    @hookimpl
    def lamina_register_rate_limiters(self, register: Any) -> None:
        register("shared", lambda o, c: None)

    @hookimpl
    def lamina_register_authenticators(self, register: Any) -> None:
        register("au", lambda o, c: None)

    @hookimpl
    def lamina_register_validators(self, register: Any) -> None:
        register("v", lambda o, c: None)

    @hookimpl
    def lamina_register_breakers(self, register: Any) -> None:
        register("k", lambda o, c: None)

    @hookimpl
    def lamina_register_batching_policies(self, register: Any) -> None:
        register("b", lambda o, c: None)

    @hookimpl
    def lamina_register_prewarm_policies(self, register: Any) -> None:
        register("w", lambda o, c: None)

    @hookimpl
    def lamina_register_tool_parsers(self, register: Any) -> None:
        register("t", lambda o, c: None)


class BreakerNamedLikeALimiter:
    @hookimpl
    def lamina_register_breakers(self, register: Any) -> None:
        register("shared", lambda o, c: None)


def test_every_registration_hook_is_collected() -> None:
    info = load_plugins(entry_points=False, extra=[("every", EveryLayer())]).infos["every"]
    assert info.registered == {
        "router": ["r"], "codec": ["c"], "executor": ["e"], "prefix_cache": ["p"], "autoscaler": ["a"],
        "rate_limiter": ["shared"], "authenticator": ["au"], "validator": ["v"], "breaker": ["k"], "batching": ["b"],
        "prewarm": ["w"], "tool_parser": ["t"],
    }
    assert info.error is None


def test_admission_components_share_one_namespace() -> None:
    infos = load_plugins(entry_points=False, extra=[("every", EveryLayer()), ("dup", BreakerNamedLikeALimiter())]).infos
    assert "breaker 'shared' is registered by both plugin 'every' and plugin 'dup'" in infos["dup"].error


def test_register_rejects_bad_arguments() -> None:
    class Bad:
        @hookimpl
        def lamina_register_routers(self, register: Any) -> None:
            register("x", lambda o, c: None, options=dict)

    info = load_plugins(entry_points=False, extra=[("bad", Bad())]).infos["bad"]
    assert "options for router 'x' must be an attrs class" in info.error
