"""Tool-call formats of model families. Registered through the ``lamina`` entry point ``tool-parsers``."""

from __future__ import annotations

from lamina_hookspecs import hookimpl
from lamina_hookspecs.registration import BuildContext, Register
from lamina_tool_parsers.formats import HermesParser, JsonParser


def build_hermes(options: None, context: BuildContext) -> HermesParser:
    """<tool_call> blocks, as Qwen2/2.5/3 and the Hermes models write calls (core's default)."""
    return HermesParser()


def build_llama3_json(options: None, context: BuildContext) -> JsonParser:
    """A reply that is one {"name", "parameters"} object, as Llama 3.1-3.3 call tools."""
    return JsonParser(key="parameters", prefix="<|python_tag|>")


def build_json(options: None, context: BuildContext) -> JsonParser:
    """A reply that is a {"name", "arguments"} object or a list of them: for models with no format of their own."""
    return JsonParser()


@hookimpl
def lamina_register_tool_parsers(register: Register) -> None:
    register("hermes", build_hermes)
    register("llama3-json", build_llama3_json)
    register("json", build_json)
