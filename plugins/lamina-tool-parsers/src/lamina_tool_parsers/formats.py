"""Tool-call formats: how a model family is told about tools, the grammar of a call, the calls read back.

- ``hermes``: each call is ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, any text
  around the calls is content. Qwen2, Qwen2.5, Qwen3 and the Hermes models write calls this way;
  their chat templates render ``tools`` themselves. The instructions are Qwen2.5's template's.
- ``llama3-json``: the whole reply is one ``{"name": ..., "parameters": {...}}`` object (read after
  an optional ``<|python_tag|>``; several apart by ``;``), as Llama 3.1 to 3.3 answer with JSON tool
  calling.
- ``json``: the whole reply is a ``{"name": ..., "arguments": {...}}`` object or a list of them;
  a fallback for models with no format of their own.

A call naming a tool the request did not offer, or whose JSON does not parse, is content, not a
call: nothing the model wrote is dropped.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any

from lamina_hookspecs.types import StructuredOutput, Tool, ToolCall, ToolCallDelta

COMPACT_JSON = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
"""llguidance's JSON layout option (``x-guidance``): JSON as models write it, with no free
whitespace for a small model to wander in."""


def call_id() -> str:
    """A fresh tool-call id, shaped like OpenAI's."""
    return "call_" + uuid.uuid4().hex[:24]


def _closed(schema: Any) -> Any:
    """``schema`` with ``additionalProperties: false`` on every object that lists its properties and
    does not say (as OpenAI's strict mode asks): a call then holds only the arguments the tool names."""
    if isinstance(schema, list):
        return [_closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    closed = {k: _closed(v) if k in ("items", "anyOf", "oneOf", "allOf") else v for k, v in schema.items()}
    if isinstance(schema.get("properties"), dict):
        closed["properties"] = {k: _closed(v) for k, v in schema["properties"].items()}
        closed.setdefault("additionalProperties", False)
    return closed


def _call_schema(tool: Tool, key: str) -> dict[str, Any]:
    arguments = {"type": "object", **_closed(json.loads(tool.parameters))}  # arguments are an object
    return {"type": "object", "properties": {"name": {"const": tool.name}, key: arguments},
            "required": ["name", key], "additionalProperties": False}


def _any_call(tools: Sequence[Tool], key: str) -> dict[str, Any]:
    schemas = [_call_schema(tool, key) for tool in tools]
    return schemas[0] if len(schemas) == 1 else {"anyOf": schemas}


def _call_json(call: ToolCall, key: str) -> str:
    return json.dumps({"name": call.name, key: call.parsed_arguments()}, ensure_ascii=False)


def _tools_json(tools: Sequence[Tool]) -> str:
    return "\n".join(json.dumps(tool.to_openai(), ensure_ascii=False) for tool in tools)


class Calls:
    """The calls of one reply, numbered in order; a call is kept only when it names an offered tool."""

    def __init__(self, tools: Sequence[Tool], key: str) -> None:
        self.names = {tool.name for tool in tools}
        self.keys = (key,) if key == "arguments" else (key, "arguments")
        self.count = 0

    def read(self, value: Any) -> ToolCallDelta | None:
        """The call ``value`` (parsed JSON) makes, or ``None`` when it is not a call of an offered tool."""
        if not isinstance(value, dict) or value.get("name") not in self.names:
            return None
        arguments = next((value[k] for k in self.keys if k in value), {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                return None
        if not isinstance(arguments, dict) or set(value) - {"name", *self.keys}:
            return None
        delta = ToolCallDelta(index=self.count, id=call_id(), name=value["name"],
                              arguments=json.dumps(arguments, ensure_ascii=False))
        self.count += 1
        return delta


def _parse(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


class HermesStream:
    """Reads ``<tool_call>`` blocks out of a reply; text that may begin a tag is held back."""

    OPEN, CLOSE = "<tool_call>", "</tool_call>"

    def __init__(self, tools: Sequence[Tool]) -> None:
        self.calls = Calls(tools, "arguments")
        self.buffer = ""
        self.inside = False
        self.spaces = ""  # whitespace at the end of the content so far, held back
        self.fresh = False  # a call just ended

    def feed(self, text: str) -> tuple[str, Sequence[ToolCallDelta]]:
        self.buffer += text
        content, deltas = [], []
        while True:
            if self.inside:
                end = self.buffer.find(self.CLOSE)
                if end < 0:
                    break
                body, self.buffer, self.inside = self.buffer[:end], self.buffer[end + len(self.CLOSE):], False
                delta = self.calls.read(_parse(body))
                if delta is None:
                    content.append(self._content(self.OPEN + body + self.CLOSE))
                else:
                    deltas.append(delta)
                    self.spaces, self.fresh = "", True
                continue
            start = self.buffer.find(self.OPEN)
            if start >= 0:
                content.append(self._content(self.buffer[:start]))
                self.buffer, self.inside = self.buffer[start + len(self.OPEN):], True
                continue
            keep = _partial_suffix(self.buffer, self.OPEN)
            content.append(self._content(self.buffer[:len(self.buffer) - keep]))
            self.buffer = self.buffer[len(self.buffer) - keep:]
            break
        return "".join(content), deltas

    def close(self) -> tuple[str, Sequence[ToolCallDelta]]:
        rest = (self.OPEN if self.inside else "") + self.buffer
        self.buffer, self.inside = "", False
        text = self._content(rest)
        return text + ("" if self.calls.count else self.spaces), ()

    def _content(self, text: str) -> str:
        """``text`` as content; whitespace at its end is held until more content follows (the
        whitespace around calls is not content)."""
        text = self.spaces + text
        if self.calls.count and self.fresh:  # the content that follows a call starts at its first letter
            text = text.lstrip()
            self.fresh = not text
        body = text.rstrip()
        self.spaces = text[len(body):]
        return body


def _partial_suffix(text: str, tag: str) -> int:
    """The length of the longest end of ``text`` that begins ``tag``."""
    for size in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0


class HermesParser:
    """``<tool_call>`` blocks (Qwen, Hermes)."""

    def instructions(self, tools: Sequence[Tool]) -> str:
        return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
                f"{_tools_json(tools)}\n</tools>\n\n"
                "For each function call, return a json object with function name and arguments within "
                "<tool_call></tool_call> XML tags:\n<tool_call>\n"
                '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')

    def constraint(self, tools: Sequence[Tool], *, parallel: bool) -> StructuredOutput:
        schema = {**_any_call(tools, "arguments"), "x-guidance": COMPACT_JSON}
        start = 'start: call ("\\n" call)*' if parallel else "start: call"
        grammar = f'{start}\ncall: "<tool_call>\\n" body "\\n</tool_call>"\nbody: %json {json.dumps(schema)}'
        return StructuredOutput(kind="grammar", spec=grammar, param="tool_choice")

    def render(self, calls: Sequence[ToolCall]) -> str:
        return "\n".join(f'<tool_call>\n{_call_json(call, "arguments")}\n</tool_call>' for call in calls)

    def stream(self, tools: Sequence[Tool]) -> HermesStream:
        return HermesStream(tools)


class JsonStream:
    """A reply that is a call as a whole: once it starts like JSON it is held to the end, then read."""

    def __init__(self, tools: Sequence[Tool], key: str, prefix: str) -> None:
        self.calls = Calls(tools, key)
        self.prefix = prefix
        self.buffer = ""
        self.held: bool | None = None  # None until the reply's first visible text says which

    def feed(self, text: str) -> tuple[str, Sequence[ToolCallDelta]]:
        self.buffer += text
        if self.held is None:
            start = self.buffer.lstrip()
            if not start or (self.prefix and self.prefix.startswith(start)):
                return "", ()
            self.held = start.removeprefix(self.prefix).lstrip()[:1] in ("{", "[", "")
        if self.held:
            return "", ()
        text, self.buffer = self.buffer, ""
        return text, ()

    def close(self) -> tuple[str, Sequence[ToolCallDelta]]:
        text, self.buffer = self.buffer, ""
        values = _values(text.strip().removeprefix(self.prefix))
        deltas = [self.calls.read(v) for v in values]
        if not deltas or any(d is None for d in deltas):
            return text, ()
        return "", [d for d in deltas if d is not None]


def _values(text: str) -> list[Any]:
    """The calls of a JSON reply: a list of them, or objects one after another (apart by whitespace
    or ``;``, as Llama 3.2 writes several); ``[]`` when it is not that."""
    decoder, values, at = json.JSONDecoder(), [], 0
    while at < len(text):
        try:
            value, at = decoder.raw_decode(text, at)
        except ValueError:
            return []
        values += value if isinstance(value, list) and not values and at == len(text) else [value]
        while at < len(text) and (text[at].isspace() or text[at] == ";"):
            at += 1
    return values


class JsonParser:
    """A reply that is a JSON call (or a list of them), the arguments under ``key``."""

    def __init__(self, key: str = "arguments", prefix: str = "") -> None:
        self.key, self.prefix = key, prefix

    def instructions(self, tools: Sequence[Tool]) -> str:
        if self.key == "parameters":  # Llama 3.1's own words for JSON tool calling
            return ("Given the following functions, please respond with a JSON for a function call with its "
                    "proper arguments that best answers the given prompt.\n\n"
                    'Respond in the format {"name": function name, "parameters": dictionary of argument name '
                    "and its value}. Do not use variables.\n\n" + _tools_json(tools))
        return ("You can call these functions:\n" + _tools_json(tools) + "\n\nTo call one, reply with only a JSON "
                'object {"name": <function-name>, "arguments": <args-json-object>}, or a JSON list of them to '
                "call several; otherwise reply in plain text.")

    def constraint(self, tools: Sequence[Tool], *, parallel: bool) -> StructuredOutput:
        call = _any_call(tools, self.key)
        if parallel and self.key == "arguments":
            call = {"anyOf": [call, {"type": "array", "items": call, "minItems": 1}]}
        return StructuredOutput(kind="json", spec=json.dumps({**call, "x-guidance": COMPACT_JSON}),
                                param="tool_choice")

    def render(self, calls: Sequence[ToolCall]) -> str:
        if len(calls) == 1 or self.key != "arguments":
            return "; ".join(_call_json(call, self.key) for call in calls)
        return "[" + ", ".join(_call_json(call, self.key) for call in calls) + "]"

    def stream(self, tools: Sequence[Tool]) -> JsonStream:
        return JsonStream(tools, self.key, self.prefix)
