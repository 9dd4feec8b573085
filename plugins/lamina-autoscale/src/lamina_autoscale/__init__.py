"""Lamina autoscalers (layer 5). Registered through the ``lamina`` entry point ``autoscale``."""

from __future__ import annotations

from lamina_hookspecs import hookimpl
from lamina_hookspecs.registration import Register
from lamina_autoscale.adaptive_batching import AdaptiveOptions, build_adaptive
from lamina_autoscale.batching import FixedOptions, build_fixed
from lamina_autoscale.static import StaticOptions, build_static


@hookimpl
def lamina_register_autoscalers(register: Register) -> None:
    register("static", build_static, options=StaticOptions)


@hookimpl
def lamina_register_batching_policies(register: Register) -> None:
    register("fixed", build_fixed, options=FixedOptions)
    register("adaptive", build_adaptive, options=AdaptiveOptions)
