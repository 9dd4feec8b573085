"""The ``echo`` executor plugin. Registered through the ``lamina`` entry point ``echo``."""

from __future__ import annotations

from lamina_hookspecs import hookimpl
from lamina_hookspecs.registration import Register
from lamina_echo.executor import EchoOptions, build_echo


@hookimpl
def lamina_register_executors(register: Register) -> None:
    register("echo", build_echo, options=EchoOptions)
