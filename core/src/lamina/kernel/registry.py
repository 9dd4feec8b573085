"""Named components per layer, each attributed to the plugin that registered it."""

from __future__ import annotations

from collections.abc import Iterator

import attrs

from lamina_hookspecs.errors import ConfigError
from lamina_hookspecs.layers import ADMISSION, LAYERS, Layer
from lamina_hookspecs.registration import Factory
from lamina.kernel.suggest import did_you_mean


@attrs.frozen(kw_only=True)
class Component:
    """One registered implementation of a layer."""

    layer: Layer
    name: str
    factory: Factory
    options: type | None
    summary: str
    plugin: str


class ComponentRegistry:
    """What every loaded plugin registered, by layer and name.

    A name registered by two plugins is kept as a conflict: selecting it is a
    ``ConfigError`` naming both plugins, never a silent pick of one.
    """

    def __init__(self) -> None:
        self._by_layer: dict[str, dict[str, Component]] = {layer.key: {} for layer in LAYERS}
        self._conflicts: dict[tuple[str, str], list[str]] = {}
        self.failed_plugins: dict[str, str] = {}

    def add(self, component: Component) -> str | None:
        """Add a component; return a conflict message instead when its name is taken."""
        namespace = ADMISSION if component.layer in ADMISSION else (component.layer,)
        for layer in namespace:
            taken = self._by_layer[layer.key].get(component.name)
            if taken is not None:
                plugins = [taken.plugin, component.plugin]
                self._conflicts[(layer.key, component.name)] = plugins
                return (
                    f"{component.layer.noun} '{component.name}' is registered by both "
                    f"plugin '{taken.plugin}' and plugin '{component.plugin}'"
                )
        self._by_layer[component.layer.key][component.name] = component
        return None

    def names(self, layer: Layer) -> list[str]:
        """Sorted component names in a layer (conflicted names excluded)."""
        return sorted(n for n in self._by_layer[layer.key] if (layer.key, n) not in self._conflicts)

    def __iter__(self) -> Iterator[Component]:
        for layer in LAYERS:
            yield from self._by_layer[layer.key].values()

    def get(self, layers: tuple[Layer, ...], name: str, path: str) -> Component:
        """The component ``name`` from the first of ``layers`` that has it, or a
        ``ConfigError`` at ``path`` listing what is installed."""
        for layer in layers:
            if (layer.key, name) in self._conflicts:
                a, b = self._conflicts[(layer.key, name)]
                raise ConfigError(
                    path, f"{layer.noun} '{name}' is registered by both plugin '{a}' and plugin '{b}'; "
                    "disable one with LAMINA_DISABLE_PLUGINS"
                )
            found = self._by_layer[layer.key].get(name)
            if found is not None:
                return found
        installed = sorted({n for layer in layers for n in self.names(layer)})
        noun = layers[0].noun if len(layers) == 1 else "admission component"
        message = f"no {noun} named '{name}';{did_you_mean(name, installed)} installed: " + (
            ", ".join(installed) or "none"
        )
        if self.failed_plugins:
            failed = "; ".join(f"{p}: {e}" for p, e in sorted(self.failed_plugins.items()))
            message += f" (plugins that failed to load: {failed})"
        raise ConfigError(path, message)
