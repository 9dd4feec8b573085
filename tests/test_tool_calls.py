"""Tool calling through the official client, on the echo executor: it answers with the last message, so
a message written as a call is a reply that calls a tool, parsed by the default parser (``hermes``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import openai
import pytest

STACK = {"executor": {"use": "echo"}}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CALL = '<tool_call> {"name": "get_weather", "arguments": {"city": "Paris"}} </tool_call>'


@pytest.fixture
def client(live: Callable[..., Any]) -> openai.OpenAI:
    return openai.OpenAI(base_url=live(STACK).url + "/v1", api_key="unused", max_retries=0)


def _ask(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def test_a_reply_that_calls_a_tool_is_a_tool_call(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model="echo", messages=_ask("Looking. " + CALL), tools=[WEATHER])
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Looking."
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Paris"})


def test_streamed_calls_assemble_in_the_clients_helper(client: openai.OpenAI) -> None:
    with client.chat.completions.stream(model="echo", messages=_ask(f"{CALL} {CALL}"), tools=[WEATHER]) as stream:
        final = stream.get_final_completion().choices[0]
    assert final.finish_reason == "tool_calls" and not final.message.content
    assert [json.loads(c.function.arguments) for c in final.message.tool_calls] == [{"city": "Paris"}] * 2
    assert len({c.id for c in final.message.tool_calls}) == 2
    chunks = list(client.chat.completions.create(model="echo", messages=_ask(CALL), tools=[WEATHER], stream=True))
    deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or ()]
    assert deltas[0].index == 0 and deltas[0].function.name == "get_weather" and deltas[0].id


def test_text_that_calls_nothing_is_content(client: openai.OpenAI) -> None:
    for text in ("It is sunny in <b>Paris</b>.", '<tool_call> {"name": "not_offered", "arguments": {}} </tool_call>'):
        reply = client.chat.completions.create(model="echo", messages=_ask(text), tools=[WEATHER])
        assert (reply.choices[0].message.content, reply.choices[0].finish_reason) == (text, "stop")
        assert not reply.choices[0].message.tool_calls
    none = client.chat.completions.create(model="echo", messages=_ask(CALL), tools=[WEATHER], tool_choice="none")
    assert none.choices[0].message.content == CALL and not none.choices[0].message.tool_calls


def test_history_with_calls_and_their_results_is_accepted(client: openai.OpenAI) -> None:
    messages = [*_ask("Weather in Paris?"),
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    reply = client.chat.completions.create(model="echo", messages=messages, tools=[WEATHER])
    assert reply.choices[0].message.content == "sunny"


@pytest.mark.parametrize(("extra", "param"), [
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format"),
    ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools[0].function.name"),
    ({"messages": [{"role": "tool", "content": "42"}]}, "messages[0].tool_call_id"),
])
def test_bad_tool_fields_are_a_400_naming_the_field(client: openai.OpenAI, extra: dict[str, Any], param: str) -> None:
    body = {"model": "echo", "messages": _ask("hi"), "tools": [WEATHER], **extra}
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(**body)
    assert refused.value.body["param"] == param


@pytest.mark.parametrize("name", ["hermes", "llama3-json", "json"])
def test_every_parsers_grammar_holds_its_own_calls_and_nothing_else(name: str) -> None:
    """The grammar a required call follows (compiled by the jax executor's llguidance) takes what the
    parser writes for a call of an offered tool, its arguments valid, and refuses anything else."""
    from lamina.kernel.plugins import load_plugins
    from lamina_hookspecs.layers import TOOL_PARSER
    from lamina_hookspecs.types import Tool, ToolCall
    from lamina_jax.structured_output import Grammars
    from lamina_jax.testing import tokenizer_metadata
    from lamina_jax.tokenizer import Tokenizer

    parser = load_plugins().registry.get((TOOL_PARSER,), name, "tool_parser").factory(None, None)
    tools = [Tool(name="get_weather", parameters=json.dumps(WEATHER["function"]["parameters"])),
             Tool(name="add", parameters='{"type": "object", "properties": {"a": {"type": "integer"}}}')]
    tokenizer = Tokenizer.from_gguf(tokenizer_metadata())
    grammars = Grammars(tokenizer, tokenizer.backend.get_vocab_size())

    def holds(text: str, parallel: bool = True) -> bool:
        matcher = grammars.matcher(parser.constraint(tools, parallel=parallel))
        return matcher.try_consume_tokens(ids := tokenizer.encode(text, add_special_tokens=False)) == len(ids) \
            and matcher.is_accepting()

    one = parser.render([ToolCall(id="c", name="get_weather", arguments='{"city": "Paris"}')])
    assert holds(one) and holds(one, parallel=False)
    assert holds(parser.render([ToolCall(id="c", name="add", arguments='{"a": 2}')]))
    for wrong in ('{"city": 3}', '{}', '{"a": 2}'):
        assert not holds(parser.render([ToolCall(id="c", name="get_weather", arguments=wrong)])), wrong
    assert not holds(parser.render([ToolCall(id="c", name="other", arguments="{}")]))
    assert not holds("It is sunny.")


def test_a_template_without_tools_gets_the_instructions_and_the_calls_as_text() -> None:
    """The parser's instructions become the system turn, and earlier calls are written as the parser
    writes them, for a chat template that takes no tools; one that takes tools gets them as they are."""
    from lamina.kernel.plugins import load_plugins
    from lamina.server.openai_api import parse_chat
    from lamina.kernel.tool_calls import prepare
    from lamina.kernel.stack import Stack
    from lamina.kernel.stack_config import StackConfig
    from lamina_jax.chat_template import ChatTemplate

    plugins = load_plugins()
    parser = Stack(StackConfig.from_dict(STACK, plugins.registry), plugins).tool_parser
    history = [*_ask("Weather in Paris?"),
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                                     "arguments": '{"city": "Paris"}'}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    request = prepare(parser, parse_chat({"model": "echo", "messages": history, "tools": [WEATHER]}, "r", "t"))
    chatml = ChatTemplate("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}", {})
    assert not chatml.takes_tools
    text = chatml.render(request.template_messages(template_takes_tools=False))
    assert text.startswith("<|system|>" + parser.instructions(request.tools))
    assert '<|assistant|><tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    with_tools = ChatTemplate("{{ tools | tojson }}{% for m in messages %}{{ m.get('tool_calls', []) | tojson }}"
                              "{% endfor %}", {})
    assert with_tools.takes_tools
    text = with_tools.render(request.template_messages(template_takes_tools=True),
                             tools=[t.to_openai() for t in request.tools])
    assert text.startswith(json.dumps([WEATHER], ensure_ascii=False)) and '"arguments": {"city": "Paris"}' in text


@pytest.mark.parametrize("name", ["hermes", "llama3-json", "json"])
def test_a_required_call_sampled_from_a_random_model_is_always_a_valid_call(
        live: Callable[..., Any], tmp_path: Any, name: str) -> None:
    """The tiny random model at temperature 1, with each parser: under ``required`` every reply is
    calls of the offered tools whose arguments hold against their schemas (the grammar decides)."""
    import jsonschema
    from lamina_jax.testing import write_tiny_gguf

    model = write_tiny_gguf(tmp_path / "tiny-llama.gguf", seed=3)
    template = "{% if tools %}{% endif %}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    server = live({"executor": {"use": "jax", "model": str(model), "kv_cache_mb": 1, "weights_dtype": "float32",
                                "chat_template": template},  # it takes tools: the prompt fits the tiny model
                   "tool_parser": {"use": name}})
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    small = {"type": "function", "function": {"name": "pick", "parameters": {
        "type": "object", "required": ["n", "ok"], "properties": {
            "n": {"type": "integer", "minimum": 0, "maximum": 9}, "ok": {"type": "boolean"}}}}}
    weather = dict(WEATHER, function={**WEATHER["function"], "parameters": {
        **WEATHER["function"]["parameters"], "properties": {"city": {"type": "string", "maxLength": 8}}}})
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in (weather, small)}
    for seed in range(4):
        reply = client.chat.completions.create(model="tiny-llama", messages=_ask("go"), tools=[weather, small],
                                               tool_choice="required", parallel_tool_calls=False, temperature=1.0,
                                               seed=seed, max_tokens=200)
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls", choice.message.content
        (call,) = choice.message.tool_calls
        jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])
