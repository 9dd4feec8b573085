"""Plugin discovery and registration.

Plugins are modules named by entry points in the group ``lamina``. This loader keeps a
:class:`PluginInfo` per plugin (distribution, version, what it registered, why it
failed) rather than reaching into pluggy's private state. Environment variables:

- ``LAMINA_PLUGINS``: comma-separated allow-list of entry-point names (all if unset);
- ``LAMINA_DISABLE_PLUGINS``: comma-separated block-list;
- ``LAMINA_TRACE_PLUGINS=1``: log every hook call and its result.

A plugin that fails to import or register is recorded as failed and logged as a
warning; a stack that needs one of its components fails to build (the registry's error
says which plugins failed). There is no global plugin manager: call :func:`load_plugins`.
"""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Iterable, Sequence
from typing import Any

import attrs
import pluggy
import structlog

from lamina_hookspecs import PROJECT_NAME, hookspecs
from lamina_hookspecs.errors import PluginError
from lamina_hookspecs.layers import LAYERS, Layer
from lamina.kernel.registry import Component, ComponentRegistry
from lamina.kernel.suggest import did_you_mean

log = structlog.get_logger(__name__)

ENTRY_POINT_GROUP = "lamina"
HOOK_NAMES = tuple(name for name in dir(hookspecs) if name.startswith("lamina_"))


@attrs.define(kw_only=True)
class PluginInfo:
    """What ``lamina plugins`` shows about one plugin."""

    name: str
    distribution: str | None = None
    version: str | None = None
    module: str | None = None
    registered: dict[str, list[str]] = attrs.field(factory=dict)
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return attrs.asdict(self)


@attrs.define(kw_only=True)
class PluginSet:
    """A plugin manager, the components its plugins registered, and a record per plugin."""

    pm: pluggy.PluginManager
    registry: ComponentRegistry
    infos: dict[str, PluginInfo]


def _env_list(name: str) -> set[str] | None:
    value = os.environ.get(name)
    return None if value is None else {part.strip() for part in value.split(",") if part.strip()}


def _make_manager() -> pluggy.PluginManager:
    pm = pluggy.PluginManager(PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    if os.environ.get("LAMINA_TRACE_PLUGINS") == "1":
        def before(hook_name: str, impls: Sequence[pluggy.HookImpl], kwargs: dict[str, Any]) -> None:
            log.info("hook_call", hook=hook_name, plugins=[i.plugin_name for i in impls])

        def after(outcome: pluggy.Result[Any], hook_name: str, impls: Sequence[pluggy.HookImpl],
                  kwargs: dict[str, Any]) -> None:
            log.info("hook_result", hook=hook_name, exception=repr(outcome.exception) if outcome.exception else None)

        pm.add_hookcall_monitoring(before, after)
    return pm


def _register_module(pm: pluggy.PluginManager, info: PluginInfo, plugin: object) -> None:
    try:
        pm.register(plugin, name=info.name)
    except pluggy.PluginValidationError as exc:
        info.error = f'plugin "{info.name}": {exc}'


def _discover(pm: pluggy.PluginManager, infos: dict[str, PluginInfo]) -> None:
    allow, block = _env_list("LAMINA_PLUGINS"), _env_list("LAMINA_DISABLE_PLUGINS") or set()
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if (allow is not None and ep.name not in allow) or ep.name in block:
            continue
        info = PluginInfo(
            name=ep.name,
            distribution=ep.dist.name if ep.dist else None,
            version=ep.dist.version if ep.dist else None,
            module=ep.value,
        )
        infos[ep.name] = info
        try:
            module = ep.load()
        except Exception as exc:  # any import-time failure of third-party code
            info.error = f'Error importing plugin "{ep.name}": {type(exc).__name__}: {exc}'
            continue
        _register_module(pm, info, module)


def _check_unknown_hooks(pm: pluggy.PluginManager, infos: dict[str, PluginInfo]) -> None:
    """pluggy's ``check_pending``, reworded per plugin with a suggestion; the offending
    plugin is marked failed and unregistered instead of failing every plugin."""
    for name, info in infos.items():
        plugin = pm.get_plugin(name)
        if plugin is None:
            continue
        unknown = [c.name for c in pm.get_hookcallers(plugin) or [] if not c.has_spec()]
        if unknown:
            hints = "; ".join(f"'{u}' is not a Lamina hook;{did_you_mean(u, HOOK_NAMES)}" for u in unknown)
            info.error = f'plugin "{name}": {hints}'
            pm.unregister(plugin)
    pm.check_pending()


def _collect_registrations(pm: pluggy.PluginManager, registry: ComponentRegistry,
                           infos: dict[str, PluginInfo]) -> None:
    """Call each plugin's registration hooks one plugin at a time, so every name is
    attributed to the plugin that registered it."""
    for layer in LAYERS:
        for impl in getattr(pm.hook, layer.hook).get_hookimpls():
            info = infos[impl.plugin_name]
            if info.error:
                continue
            try:
                impl.function(register=_Registrar(layer, info, registry))
            except PluginError as exc:
                info.error = str(exc)
            except Exception as exc:  # a plugin's registration code failed
                info.error = f'plugin "{info.name}" failed in {layer.hook}: {type(exc).__name__}: {exc}'
    for info in infos.values():
        if info.error:
            registry.failed_plugins[info.name] = info.error
            log.warning("plugin_failed", plugin=info.name, error=info.error)


@attrs.define
class _Registrar:
    """The ``register`` callback handed to one plugin for one layer."""

    layer: Layer
    info: PluginInfo
    registry: ComponentRegistry

    def __call__(self, name: str, factory: Any, *, options: type | None = None, summary: str = "") -> None:
        if not callable(factory):
            raise PluginError(f'plugin "{self.info.name}": factory for {self.layer.noun} {name!r} is not callable')
        if options is not None and not attrs.has(options):
            raise PluginError(f'plugin "{self.info.name}": options for {self.layer.noun} {name!r} must be an attrs class')
        if not summary:
            summary = ((factory.__doc__ or "").strip().splitlines() or [""])[0]
        conflict = self.registry.add(Component(
            layer=self.layer, name=name, factory=factory, options=options, summary=summary, plugin=self.info.name,
        ))
        if conflict:
            raise PluginError(conflict)
        self.info.registered.setdefault(self.layer.key, []).append(name)


def load_plugins(*, entry_points: bool = True, extra: Iterable[tuple[str, object]] = ()) -> PluginSet:
    """Build a fresh plugin manager: installed plugins (unless ``entry_points=False``)
    plus ``extra`` ``(name, plugin)`` pairs, then collect their registrations."""
    pm = _make_manager()
    infos: dict[str, PluginInfo] = {}
    if entry_points:
        _discover(pm, infos)
    for name, plugin in extra:
        infos[name] = PluginInfo(name=name, module=getattr(plugin, "__name__", type(plugin).__name__))
        _register_module(pm, infos[name], plugin)
    _check_unknown_hooks(pm, infos)
    registry = ComponentRegistry()
    _collect_registrations(pm, registry, infos)
    return PluginSet(pm=pm, registry=registry, infos=infos)
