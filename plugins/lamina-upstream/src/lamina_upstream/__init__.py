"""The ``openai-upstream`` executor plugin. Registered through the ``lamina`` entry point ``upstream``."""

from __future__ import annotations

from lamina_hookspecs import hookimpl
from lamina_hookspecs.registration import Register
from lamina_upstream.executor import build_upstream
from lamina_upstream.options import UpstreamOptions


@hookimpl
def lamina_register_executors(register: Register) -> None:
    register("openai-upstream", build_upstream, options=UpstreamOptions)
