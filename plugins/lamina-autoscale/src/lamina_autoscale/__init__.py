"""Lamina autoscalers (layer 5). Registered through the ``lamina`` entry point ``autoscale``."""

from __future__ import annotations

from lamina_hookspecs import hookimpl
from lamina_hookspecs.registration import Register
from lamina_autoscale.static import StaticOptions, build_static


@hookimpl
def lamina_register_autoscalers(register: Register) -> None:
    register("static", build_static, options=StaticOptions)
