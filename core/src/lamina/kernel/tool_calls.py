"""Tool calling around one chat request, with the stack's tool parser.

Before the executor: the request gets the parser's instructions and its history's calls written
in the parser's format (both for a chat template that takes no tools) and, when a call is required (``tool_choice`` ``required`` or a named function), the grammar
of a call as its structured-output constraint, so the call is valid JSON for the tool's schema.
After it: the reply's text goes through the parser, which takes the calls out of the content;
a reply that called a tool and then stopped finishes with ``tool_calls``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import attrs

from lamina_hookspecs.errors import InvalidRequestError
from lamina_hookspecs.protocols import ToolCallStream, ToolParser
from lamina_hookspecs.types import Request, TokenChunk


def prepare(parser: ToolParser | None, request: Request) -> Request:
    """``request`` with the parser's instructions and, for a required call, its grammar (without
    tools, or with ``tool_choice`` ``none``, which leaves the tools out, neither); the history's
    calls written as the parser writes them."""
    if parser is not None and request.messages and any(m.tool_calls for m in request.messages):
        request = attrs.evolve(request, messages=[attrs.evolve(m, calls_text=parser.render(m.tool_calls))
                                                  if m.tool_calls else m for m in request.messages])
    choice = request.tool_choice
    if not request.tools or choice.mode == "none":
        return attrs.evolve(request, tools=()) if request.tools else request
    if parser is None:
        raise InvalidRequestError("tools: this stack has no tool parser (install lamina-tool-parsers, or set "
                                  "[tool_parser])", param="tools")
    tools = tuple(t for t in request.tools if choice.mode != "function" or t.name == choice.name)
    sampling = request.sampling
    if choice.forced:
        if sampling.structured is not None:
            raise InvalidRequestError(f"{sampling.structured.param}: a required tool call already fixes the "
                                      "reply's shape; drop it or set tool_choice to auto",
                                      param=sampling.structured.param)
        parallel = request.parallel_tool_calls and choice.mode == "required"
        sampling = attrs.evolve(sampling, structured=parser.constraint(tools, parallel=parallel))
    return attrs.evolve(request, tools=tools, tool_prompt=parser.instructions(tools), sampling=sampling)


def reader(parser: ToolParser | None, request: Request) -> ToolCallStream | None:
    """A fresh reader of ``request``'s reply, or ``None`` when it may call no tool."""
    return None if parser is None or not request.tools else parser.stream(request.tools)


async def read_calls(chunks: AsyncIterator[TokenChunk], calls: ToolCallStream) -> AsyncIterator[TokenChunk]:
    """``chunks`` with the calls taken out of their text into ``tool_calls``."""
    called = False
    async for chunk in chunks:
        text, deltas = calls.feed(chunk.text)
        finish = chunk.finish_reason
        if finish is not None:
            rest, more = calls.close()
            text, deltas = text + rest, [*deltas, *more]
        called = called or bool(deltas)
        if finish == "stop" and called:
            finish = "tool_calls"
        yield attrs.evolve(chunk, text=text, tool_calls=tuple(deltas), finish_reason=finish)
