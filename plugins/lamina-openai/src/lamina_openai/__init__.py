"""OpenAI wire formats. Registered through the ``lamina`` entry point ``openai``."""

from __future__ import annotations

from lamina_hookspecs import hookimpl
from lamina_hookspecs.registration import Register
from lamina_openai.codec import SseOptions, build_openai_sse


@hookimpl
def lamina_register_codecs(register: Register) -> None:
    register("openai-sse", build_openai_sse, options=SseOptions)
