"""Lamina routers (layer 1). Registered through the ``lamina`` entry point ``routing``."""

from __future__ import annotations

from lamina_hookspecs import hookimpl
from lamina_hookspecs.registration import Register
from lamina_routing.round_robin import build_round_robin


@hookimpl
def lamina_register_routers(register: Register) -> None:
    register("round-robin", build_round_robin)
