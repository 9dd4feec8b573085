"""The openai-schema validator: compiled draft-07 schemas, errors naming field and rule, agreement with
the hand-written parser and with the reference jsonschema package."""

import copy
import json
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lamina_hookspecs.types import ROLE_ALIASES, ROLES, TOOL_CHOICE_RULE, TOOL_NAME_RULE
from lamina.server import openai_api
from lamina.testing.contracts import ValidatorContract
from lamina_admission.schema_validator import (
    SchemaValidator,
    SchemaValidatorOptions,
    build_schema_validator,
)
from lamina_hookspecs.errors import InvalidRequestError
from lamina_hookspecs.protocols import Validator

try:  # the reference implementation; the tox env of this plugin alone may lack it
    import jsonschema
except ImportError:  # pragma: no cover
    jsonschema = None

VALIDATOR = SchemaValidator.from_options(SchemaValidatorOptions())
REFERENCE = {endpoint: jsonschema.Draft7Validator(schema) for endpoint, schema in VALIDATOR.schemas.items()} \
    if jsonschema is not None else {}
PARSERS = {"chat": openai_api.parse_chat, "completion": openai_api.parse_completion}

M = [{"role": "user", "content": "hi"}]
CHAT = {"model": "m", "messages": M}
COMPLETION = {"model": "m", "prompt": "hi"}


def accepts(endpoint: str, body: Any, validator: SchemaValidator = VALIDATOR) -> bool:
    try:
        validator.validate(endpoint, body)
    except InvalidRequestError:
        return False
    return True


def parser_accepts(endpoint: str, body: Any) -> bool:
    try:
        PARSERS[endpoint](body, "id", "default")
    except InvalidRequestError:
        return False
    return True


# -- shape, options, registration ------------------------------------------------------

def test_is_a_validator() -> None:
    validator = build_schema_validator(SchemaValidatorOptions(), None)  # type: ignore[arg-type]
    assert isinstance(validator, Validator)
    assert set(validator.schemas) == {"chat", "completion"}
    assert len(build_schema_validator.__doc__.strip().splitlines()) == 1  # type: ignore[union-attr]


def test_options_are_checked_and_documented() -> None:
    from lamina.kernel.options import build_options, describe
    from lamina_hookspecs.errors import ConfigError

    options = SchemaValidatorOptions()
    assert (options.max_messages, options.max_prompt_chars, options.max_tokens_limit) == (1024, 1_000_000, None)
    assert all(o["help"] for o in describe(SchemaValidatorOptions))
    for bad in ({"max_messages": 0}, {"max_prompt_chars": 0}, {"max_tokens_limit": 0}, {"max_prompt_chars": 1e6},
                {"max_messages": True}, {"max_messages": None}):
        with pytest.raises(ConfigError):
            build_options(SchemaValidatorOptions, bad, "admission")


def test_the_plugin_registers_openai_schema() -> None:
    import lamina_admission

    seen = {}
    lamina_admission.lamina_register_validators(lambda name, factory, **kw: seen.update({name: (factory, kw)}))
    assert seen == {"openai-schema": (build_schema_validator, {"options": SchemaValidatorOptions})}


def test_options_are_baked_into_the_schemas() -> None:
    tight = SchemaValidator.from_options(
        SchemaValidatorOptions(max_messages=2, max_prompt_chars=5, max_tokens_limit=100))
    three = [{"role": "user", "content": "a"}] * 3
    cases = [
        ("chat", {**CHAT, "messages": three}, "messages: must have at most 2 items"),
        ("chat", {**CHAT, "messages": [{"role": "user", "content": "abcdef"}]},
         "messages[0].content: must have at most 5 characters"),
        ("chat", {**CHAT, "messages": [{"role": "user", "content": [{"type": "text", "text": "abcdef"}]}]},
         "messages[0].content[0].text: must have at most 5 characters"),
        ("chat", {**CHAT, "max_tokens": 101}, "max_tokens: must be <= 100"),
        ("chat", {**CHAT, "max_completion_tokens": 101}, "max_completion_tokens: must be <= 100"),
        ("completion", {**COMPLETION, "prompt": "abcdef"}, "prompt: must have at most 5 characters"),
        ("completion", {**COMPLETION, "prompt": ["abcdef"]}, "prompt[0]: must have at most 5 characters"),
        ("completion", {**COMPLETION, "max_tokens": 101}, "max_tokens: must be <= 100"),
    ]
    for endpoint, body, message in cases:
        with pytest.raises(InvalidRequestError) as info:
            tight.validate(endpoint, body)
        assert str(info.value) == message
        assert accepts(endpoint, body)  # the defaults allow it
    assert accepts("chat", {**CHAT, "messages": three[:2], "max_tokens": 100}, tight)
    assert accepts("completion", {**COMPLETION, "prompt": "abcde"}, tight)


def test_unknown_endpoints_are_left_to_other_validators() -> None:
    assert VALIDATOR.validate("embeddings", {"anything": 1}) is None


def test_schemas_are_published_data() -> None:
    for endpoint, schema in VALIDATOR.schemas.items():
        assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
        assert json.loads(json.dumps(schema)) == schema, endpoint
    # The field sets and roles are the parser's.
    assert set(VALIDATOR.schemas["chat"]["properties"]) == openai_api.CHAT_FIELDS
    assert set(VALIDATOR.schemas["completion"]["properties"]) == openai_api.COMPLETION_FIELDS


def test_other_schemas_can_be_compiled() -> None:
    schema = copy.deepcopy(VALIDATOR.schemas["chat"])
    schema["properties"]["model"] = {"enum": ["small", "large"]}
    custom = SchemaValidator({"chat": schema})
    assert accepts("chat", {**CHAT, "model": "small"}, custom)
    with pytest.raises(InvalidRequestError, match=r"^model: must be one of small, large$"):
        custom.validate("chat", CHAT)
    assert accepts("completion", {"no": "schema"}, custom)

TOOL = {"type": "function", "function": {"name": "get_weather", "description": "The weather now.",
                                         "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}

# -- what passes ---------------------------------------------------------------------------

VALID = [
    ("chat", CHAT),
    ("chat", {"model": "m", "messages": [
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "hi", "name": "bob"},
        {"role": "assistant", "content": "hello"}, {"role": "tool", "content": "42", "tool_call_id": "c1"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "user", "content": []}, {"role": "user", "content": ""}]}),
    ("chat", {**CHAT, "max_tokens": 5, "max_completion_tokens": 7, "temperature": 0, "top_p": 1, "top_k": -1,
              "seed": -3, "stop": "\n", "n": 1, "stream": True, "stream_options": {"include_usage": True},
              "user": "u", "presence_penalty": 0, "frequency_penalty": 0.0, "logit_bias": {},
              "ignore_eos": False, "stop_token_ids": [2, 3], "logprobs": True, "top_logprobs": 20,
              "parallel_tool_calls": False, "tools": [], "tool_choice": "none",
              "response_format": {"type": "text"}}),
    ("chat", {**CHAT, "temperature": 2, "top_p": 1e-9, "stop": ["a", "b", "c", "d", "e", "f"], "stream_options": {},
              "logprobs": False, "top_logprobs": 0}),
    ("chat", {**CHAT, **dict.fromkeys(openai_api.CHAT_FIELDS - {"model", "messages"})}),  # null: not given
    ("chat", {**CHAT, "messages": [{"role": "developer", "content": "be brief"}], "parallel_tool_calls": True}),
    ("chat", {**CHAT, "tools": [TOOL, {"type": "function", "function": {"name": "b-2", "description": None}}],
              "tool_choice": {"type": "function", "function": {"name": "get_weather"}}, "messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]},
        {"role": "assistant", "tool_calls": [
            {"id": "c2", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]},
        {"role": "tool", "content": "sunny", "tool_call_id": "c1"}]}),
    ("chat", {**CHAT, "tools": [TOOL], "tool_choice": "required"}),
    ("chat", {**CHAT, "stop": []}),
    ("completion", COMPLETION),
    ("completion", {**COMPLETION, "prompt": [1, 0, 2]}),
    ("completion", {**COMPLETION, "prompt": ["one prompt in a batch of one"]}),
    ("completion", {**COMPLETION, "prompt": [[5, 6]]}),
    ("completion", {**COMPLETION, "max_tokens": 1, "logprobs": 5, "echo": False, "best_of": 1, "suffix": None,
                    "stream": False, "ignore_eos": True, "seed": 2**62, "stop_token_ids": []}),
    ("completion", {**COMPLETION, **dict.fromkeys(openai_api.COMPLETION_FIELDS - {"model", "prompt"})}),
]


@pytest.mark.parametrize(("endpoint", "body"), VALID)
def test_valid_bodies_pass(endpoint: str, body: dict[str, Any]) -> None:
    assert VALIDATOR.validate(endpoint, orjson.loads(orjson.dumps(body))) is None
    assert parser_accepts(endpoint, body)


def _sent_by_openai_client() -> list[tuple[str, dict[str, Any]]]:
    httpx = pytest.importorskip("httpx")
    openai = pytest.importorskip("openai")
    sent: list[tuple[str, dict[str, Any]]] = []

    def handler(request: Any) -> Any:
        endpoint = "chat" if request.url.path.endswith("/chat/completions") else "completion"
        sent.append((endpoint, orjson.loads(request.content)))
        return httpx.Response(200, json={"id": "x", "object": "x", "created": 0, "model": "m", "choices": []})

    with httpx.Client(transport=httpx.MockTransport(handler)) as http:
        client = openai.OpenAI(api_key="k", base_url="http://lamina.test/v1", http_client=http, max_retries=0)
        messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "hi", "name": "bob"},
                    {"role": "assistant", "content": "hello"},
                    {"role": "user", "content": [{"type": "text", "text": "again"}]}]
        client.chat.completions.create(model="m", messages=messages)
        client.chat.completions.create(
            model="m", messages=messages, max_tokens=5, max_completion_tokens=5, temperature=0.5, top_p=0.9,
            seed=1, stop=["x", "y"], n=1, user="u", logprobs=True, top_logprobs=2, presence_penalty=0,
            frequency_penalty=0, stream=False)
        client.chat.completions.create(model="m", messages=messages, stream=True,
                                       stream_options={"include_usage": True}).close()
        client.chat.completions.create(model="m", messages=messages, stop="\n", extra_body={"top_k": 40})
        client.completions.create(model="m", prompt="hi")
        client.completions.create(model="m", prompt=[1, 2, 3], max_tokens=5, temperature=0, seed=7, stop="\n",
                                  n=1, user="u", logprobs=2, echo=False, best_of=1, suffix=None)
        client.completions.create(model="m", prompt=["hi"], stream=True,
                                  stream_options={"include_usage": False}).close()
    assert len(sent) == 7
    return sent


def test_what_the_openai_client_sends_passes() -> None:
    for endpoint, body in _sent_by_openai_client():
        assert VALIDATOR.validate(endpoint, body) is None, body
        assert parser_accepts(endpoint, body), body


# -- what fails, and how it is worded ------------------------------------------------------

INVALID = [
    ("chat", {"messages": M}, "model", "required"),
    ("chat", {**CHAT, "model": ""}, "model", "must not be empty"),
    ("chat", {**CHAT, "model": 3}, "model", "must be a string"),
    ("chat", {"model": "m"}, "messages", "required"),
    ("chat", {**CHAT, "messages": []}, "messages", "must have at least 1 item"),
    ("chat", {**CHAT, "messages": "hi"}, "messages", "must be an array"),
    ("chat", {**CHAT, "messages": ["hi"]}, "messages[0]", "must be an object"),
    ("chat", {**CHAT, "messages": [{"role": "robot", "content": "x"}]},
     "messages[0].role", "must be one of system, user, assistant, tool, developer"),
    ("chat", {**CHAT, "messages": [*M, {"content": "x"}]}, "messages[1].role", "required"),
    ("chat", {**CHAT, "messages": [{"role": "user"}]}, "messages[0].content", "required"),
    ("chat", {**CHAT, "messages": [{"role": "user", "content": None}]},
     "messages[0].content", "must be a string or an array"),
    ("chat", {**CHAT, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
     "messages[0].content[0].type", "must be text"),
    ("chat", {**CHAT, "messages": [{"role": "user", "content": [{"type": "text"}]}]},
     "messages[0].content[0].text", "required"),
    ("chat", {**CHAT, "messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]},
     "messages[0].content[0].text", "must be a string"),
    ("chat", {**CHAT, "foo": 1}, "foo", "unrecognized request argument"),
    ("chat", {**CHAT, "zeta": 1, "alpha": 2}, "alpha", "unrecognized request argument"),
    ("chat", {**CHAT, "prompt": "x"}, "prompt", "unrecognized request argument"),
    ("chat", {**CHAT, "temperature": 3}, "temperature", "must be <= 2"),
    ("chat", {**CHAT, "temperature": -0.5}, "temperature", "must be >= 0"),
    ("chat", {**CHAT, "temperature": "hot"}, "temperature", "must be a number or null"),
    ("chat", {**CHAT, "top_p": 0}, "top_p", "must be > 0"),
    ("chat", {**CHAT, "top_p": 1.5}, "top_p", "must be <= 1"),
    ("chat", {**CHAT, "max_tokens": 0}, "max_tokens", "must be >= 1"),
    ("chat", {**CHAT, "max_tokens": 1.5}, "max_tokens", "must be an integer or null"),
    ("chat", {**CHAT, "max_completion_tokens": 0}, "max_completion_tokens", "must be >= 1"),
    ("chat", {**CHAT, "top_k": -2}, "top_k", "must be >= -1"),
    ("chat", {**CHAT, "seed": True}, "seed", "must be an integer or null"),
    ("chat", {**CHAT, "stop": ""}, "stop", "must not be empty"),
    ("chat", {**CHAT, "stop": ["a"] * 65}, "stop", "must have at most 64 items"),
    ("chat", {**CHAT, "stop": ["a", ""]}, "stop[1]", "must not be empty"),
    ("chat", {**CHAT, "stop": 1}, "stop", "must be a string, an array or null"),
    ("chat", {**CHAT, "stop_token_ids": [1, "2"]}, "stop_token_ids[1]", "must be an integer"),
    ("chat", {**CHAT, "stop_token_ids": 1}, "stop_token_ids", "must be an array or null"),
    ("chat", {**CHAT, "stream": 1}, "stream", "must be a boolean or null"),
    ("chat", {**CHAT, "ignore_eos": 1}, "ignore_eos", "must be a boolean or null"),
    ("chat", {**CHAT, "stream_options": {"include_usage": "yes"}}, "stream_options.include_usage",
     "must be a boolean"),
    ("chat", {**CHAT, "stream_options": {"include_obfuscation": True}}, "stream_options.include_obfuscation",
     "unrecognized request argument"),
    ("chat", {**CHAT, "stream_options": True}, "stream_options", "must be an object or null"),
    ("chat", {**CHAT, "user": 1}, "user", "must be a string or null"),
    ("chat", {**CHAT, "n": 129}, "n", "must be <= 128"),
    ("chat", {**CHAT, "n": 0}, "n", "must be >= 1"),
    ("chat", {**CHAT, "presence_penalty": 2.5}, "presence_penalty", "must be <= 2"),
    ("chat", {**CHAT, "frequency_penalty": -3}, "frequency_penalty", "must be >= -2"),
    ("chat", {**CHAT, "repetition_penalty": 0}, "repetition_penalty", "must be > 0"),
    ("chat", {**CHAT, "min_p": 1.5}, "min_p", "must be <= 1"),
    ("chat", {**CHAT, "min_tokens": -1}, "min_tokens", "must be >= 0"),
    ("chat", {**CHAT, "logit_bias": {"1": 500}}, "logit_bias[1]", "must be <= 100"),  # jsonschema-rs: a numeric key reads as an index
    ("chat", {**CHAT, "tools": [{"type": "function"}]}, "tools[0].function", "required"),
    ("chat", {**CHAT, "tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name",
     TOOL_NAME_RULE),
    ("chat", {**CHAT, "tool_choice": "sometimes"}, "tool_choice", TOOL_CHOICE_RULE),
    ("chat", {**CHAT, "messages": [{"role": "tool", "content": "42"}]}, "messages[0].tool_call_id", "required"),
    ("chat", {**CHAT, "messages": [{"role": "assistant", "content": None}]}, "messages[0].content",
     "must be a string or an array"),
    ("chat", {**CHAT, "messages": [{"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}]}]},
     "messages[0].tool_calls[0].function", "required"),
    ("chat", {**CHAT, "parallel_tool_calls": 0}, "parallel_tool_calls", "must be a boolean or null"),
    ("chat", {**CHAT, "response_format": {"type": "json_schema"}}, "response_format.json_schema", "required"),
    ("completion", {**COMPLETION, "structured_outputs": {"regex": ""}}, "structured_outputs.regex", "must not be empty"),
    ("chat", {**CHAT, "guided_choice": []}, "guided_choice", "must have at least 1 item"),
    ("chat", {**CHAT, "logprobs": 1}, "logprobs", "must be a boolean or null"),
    ("chat", {**CHAT, "top_logprobs": 2}, "top_logprobs", "must be 0 unless logprobs is true"),
    ("chat", {**CHAT, "logprobs": False, "top_logprobs": 2}, "top_logprobs", "must be 0 unless logprobs is true"),
    ("chat", {**CHAT, "logprobs": True, "top_logprobs": 21}, "top_logprobs", "must be <= 20"),
    ("completion", {"model": "m"}, "prompt", "required"),
    ("completion", {**COMPLETION, "prompt": ""}, "prompt", "must not be empty"),
    ("completion", {**COMPLETION, "prompt": []}, "prompt", "must have at least 1 item"),
    ("completion", {**COMPLETION, "prompt": None}, "prompt", "must be a string or an array"),
    ("completion", {**COMPLETION, "prompt": [-1]}, "prompt[0]", "must be >= 0"),
    ("completion", {**COMPLETION, "prompt": [1, True]}, "prompt[1]", "must be an integer, a string or an array"),
    ("completion", {**COMPLETION, "prompt": ["a", "b"]}, "prompt",
     "must be one prompt: a string, a list of token ids, or a list holding one of those"),
    ("completion", {**COMPLETION, "prompt": [[1], [2]]}, "prompt",
     "must be one prompt: a string, a list of token ids, or a list holding one of those"),
    ("completion", {**COMPLETION, "prompt": [""]}, "prompt[0]", "must not be empty"),
    ("completion", {**COMPLETION, "prompt": [[]]}, "prompt[0]", "must have at least 1 item"),
    ("completion", {**COMPLETION, "prompt": [["a"]]}, "prompt[0][0]", "must be an integer"),
    ("completion", {**COMPLETION, "logprobs": 6}, "logprobs", "must be <= 5"),
    ("completion", {**COMPLETION, "logprobs": True}, "logprobs", "must be an integer or null"),
    ("completion", {**COMPLETION, "echo": 1}, "echo", "must be a boolean or null"),
    ("completion", {**COMPLETION, "best_of": 129}, "best_of", "must be <= 128"),
    ("completion", {**COMPLETION, "suffix": "x"}, "suffix", "not supported"),
    ("completion", {**COMPLETION, "max_completion_tokens": 5}, "max_completion_tokens",
     "unrecognized request argument"),
]


@pytest.mark.parametrize(("endpoint", "body", "param", "rule"), INVALID)
def test_invalid_bodies_name_the_field_and_the_rule(endpoint: str, body: Any, param: str, rule: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        VALIDATOR.validate(endpoint, body)
    assert (str(info.value), info.value.param) == (f"{param}: {rule}", param)
    assert info.value.http_status == 400
    with pytest.raises(InvalidRequestError) as parsed:  # the parser refuses it too, naming the same field
        PARSERS[endpoint](body, "id", "default")
    assert parsed.value.param in (param, param.split(".")[0], param.split("[")[0], f"{param.split('.')[0]}.content")


def test_a_body_that_is_not_an_object() -> None:
    with pytest.raises(InvalidRequestError) as info:
        VALIDATOR.validate("chat", [CHAT])  # type: ignore[arg-type]
    assert (str(info.value), info.value.param) == ("request body: must be an object", None)


def test_other_mappings_are_read_like_dicts() -> None:
    from types import MappingProxyType

    assert VALIDATOR.validate("chat", MappingProxyType(CHAT)) is None


def test_the_first_error_does_not_depend_on_key_order() -> None:
    """Unrecognized arguments first, then wrong values, then missing fields; each by path."""
    wrong = {"temperature": 9, "messages": [{"role": "robot"}], "zz": 1, "top_k": -5}
    expected = ["zz: unrecognized request argument", "messages[0].role: must be one of system, user, assistant, tool, developer",
                "temperature: must be <= 2", "top_k: must be >= -1", "messages[0].content: required",
                "model: required"]
    for message in expected:
        for body in (wrong, dict(reversed(wrong.items()))):
            with pytest.raises(InvalidRequestError) as info:
                VALIDATOR.validate("chat", body)
            assert str(info.value) == message
        if message.startswith("zz"):
            del wrong["zz"]
        elif message.startswith("messages[0].role"):
            wrong["messages"] = [{"role": "user"}]
        elif message.startswith("temperature"):
            del wrong["temperature"]
        elif message.startswith("top_k"):
            del wrong["top_k"]
        elif message.startswith("messages[0].content"):
            wrong["messages"] = M
    assert not accepts("chat", wrong) and accepts("chat", {**wrong, "model": "m"})


def test_rare_keywords_are_worded_too() -> None:
    validator = SchemaValidator({"x": {"properties": {
        "any": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
        "one": {"oneOf": [{"type": "integer"}, {"type": "number"}]},
        "mixed": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "integer"}}]},
        "few": {"minProperties": 2}, "multiple": {"multipleOf": 3}, "unique": {"uniqueItems": True},
        "pattern": {"pattern": "^a"}, "chars": {"minLength": 3}, "one_item": {"maxItems": 1}}}})
    cases = {"any": (1.5, "must be a string or an integer"),
             "one": (1, "must match exactly one of the allowed forms, not several"),
             "mixed": ([1.5], "must match one of the allowed forms"),
             "few": ({"a": 1}, "must have at least 2 properties"), "multiple": (4, "must be a multiple of 3"),
             "unique": ([1, 1], "must not repeat items"), "pattern": ("b", "must match ^a"),
             "chars": ("ab", "must have at least 3 characters"), "one_item": ([1, 2], "must have at most 1 item")}
    for key, (value, rule) in cases.items():
        with pytest.raises(InvalidRequestError) as info:
            validator.validate("x", {key: value})
        assert str(info.value) == f"{key}: {rule}"


# -- agreement with the parser and with the reference implementation ---------------------------

def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _quirk(endpoint: str, body: Any) -> str | None:
    """The intentional differences from ``openai_api``'s parser, or ``None`` if ``body`` has none.

    * JSON Schema's ``integer`` admits integral floats (``5.0``); the parser refuses them.
      The schema lets them through and the parser still answers 400 (draft-07 cannot say it).
    * ``best_of`` must equal ``n``: the parser checks, the schema cannot compare two fields.
    * ``echo`` with ``logprobs`` the parser refuses (the prompt's logprobs are not returned yet).
    * Tools must have different names, and ``tool_choice`` must be ``required`` only with tools and
      name one of them: the parser checks, the schema cannot.
    * ``min_tokens`` above ``max_tokens`` (one field bounded by another, or by a completion's
      default `openai_api.COMPLETION_MAX_TOKENS`) the parser refuses; draft-07 cannot say it.
    * A JSON Schema given as text (``guided_json``, ``structured_outputs.json``) must parse to an
      object, and a request takes one structured-output constraint: the parser checks both, the
      schema cannot.
    """
    if not isinstance(body, dict):
        return None
    integer_fields = ["max_tokens", "max_completion_tokens", "top_k", "seed", "top_logprobs", "min_tokens", "n",
                      "best_of"]
    if endpoint == "completion":
        integer_fields.append("logprobs")

    def integral_float(value: Any) -> bool:
        if isinstance(value, list):
            return any(integral_float(v) for v in value)
        return isinstance(value, float) and value.is_integer()

    if any(isinstance(body.get(k), float) and body[k].is_integer() for k in integer_fields) \
            or integral_float(body.get("stop_token_ids")) or integral_float(body.get("prompt")):
        return "integral float"
    if body.get("best_of") is not None and body.get("best_of") != (body.get("n") or 1):
        return "best_of other than n"
    given = body.get("structured_outputs")
    given = given if isinstance(given, dict) else {}
    json_texts = [v for v in (body.get("guided_json"), given.get("json")) if isinstance(v, str)]
    if any(not isinstance(_loads(text), dict) for text in json_texts):
        return "JSON Schema text that is no object"
    response_format = body.get("response_format")
    constraints = sum(1 for v in [*given.values(), *(body.get(f"guided_{k}") for k in ("json", "regex", "choice",
                                                                                       "grammar"))]
                      if v is not None and v is not False)
    constraints += isinstance(response_format, dict) and response_format.get("type") in ("json_object", "json_schema")
    if constraints > 1:
        return "more than one structured output constraint"
    limit = body.get("max_completion_tokens") if endpoint == "chat" else None
    limit = body.get("max_tokens") if limit is None else limit
    if limit is None and endpoint == "completion":
        limit = openai_api.COMPLETION_MAX_TOKENS
    if isinstance(limit, int) and isinstance(body.get("min_tokens"), int) and body["min_tokens"] > limit:
        return "min_tokens above max_tokens"
    if endpoint == "completion" and body.get("echo") is True and body.get("logprobs") is not None:
        return "echo with logprobs"
    tools = body.get("tools") if isinstance(body.get("tools"), list) else []
    names = [t["function"].get("name") for t in tools if isinstance(t, dict) and isinstance(t.get("function"), dict)]
    choice = body.get("tool_choice")
    named = choice.get("function", {}).get("name") if isinstance(choice, dict) and isinstance(
        choice.get("function"), dict) else None
    if len(set(names)) < len(names) or (choice == "required" and not tools) or (named is not None
                                                                                and named not in names):
        return "tool names"
    return None


KNOWN_DIFFERENCES = [
    ("chat", {**CHAT, "max_tokens": 5.0}, False, True),
    ("completion", {**COMPLETION, "prompt": [1.0, 2.0]}, False, True),
    ("completion", {**COMPLETION, "best_of": 2}, False, True),
    ("chat", {**CHAT, "n": 2.0}, False, True),
    ("chat", {**CHAT, "max_tokens": 2, "min_tokens": 3}, False, True),
    ("completion", {**COMPLETION, "min_tokens": 17}, False, True),  # above the default max_tokens of 16
    ("completion", {**COMPLETION, "echo": True, "logprobs": 1}, False, True),
    ("chat", {**CHAT, "tools": [TOOL, TOOL]}, False, True),
    ("chat", {**CHAT, "tool_choice": "required"}, False, True),
    ("chat", {**CHAT, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, False, True),
]


@pytest.mark.parametrize(("endpoint", "body", "parser", "schema"), KNOWN_DIFFERENCES)
def test_known_differences_from_the_parser(endpoint: str, body: dict[str, Any], parser: bool, schema: bool) -> None:
    assert _quirk(endpoint, body) is not None
    assert (parser_accepts(endpoint, body), accepts(endpoint, body)) == (parser, schema)


def _assert_agree(endpoint: str, body: Any) -> None:
    body = orjson.loads(orjson.dumps(body))  # what the HTTP layer hands over
    ours = accepts(endpoint, body)
    if _quirk(endpoint, body) is None:
        assert ours == parser_accepts(endpoint, body), body
    if jsonschema is not None:
        assert ours == REFERENCE[endpoint].is_valid(body), body


@pytest.mark.parametrize(("endpoint", "body"), [(e, b) for e, b in VALID] + [(e, b) for e, b, *_ in INVALID]
                         + [(e, b) for e, b, *_ in KNOWN_DIFFERENCES])
def test_tables_agree_with_parser_and_reference(endpoint: str, body: Any) -> None:
    _assert_agree(endpoint, body)


@pytest.mark.skipif(jsonschema is None, reason="needs the reference jsonschema package")
def test_schemas_are_valid_draft_07() -> None:
    for schema in VALIDATOR.schemas.values():
        jsonschema.Draft7Validator.check_schema(schema)


_CHARS = st.characters(codec="utf-8")  # orjson refuses lone surrogates
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**63 - 1) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(_CHARS, max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(_CHARS, max_size=4), inner, max_size=3),
    max_leaves=6)
_TEXT = st.text(_CHARS, max_size=4)
_NONEMPTY = st.text(_CHARS, min_size=1, max_size=4)
_TOKEN_IDS = st.lists(st.integers(0, 2**31), min_size=1, max_size=3)


def _one(*values: Any) -> st.SearchStrategy[Any]:
    return st.sampled_from([*values, None])


_VALID_MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from([*ROLES, *ROLE_ALIASES]),
     "content": _TEXT | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": _TEXT}), max_size=2)},
    optional={"name": _TEXT}).map(lambda m: {**m, "tool_call_id": "c1"} if m["role"] == "tool" else m)
# Values the parser accepts, field by field.
_VALID = {
    "model": _NONEMPTY,
    "messages": st.lists(_VALID_MESSAGE, min_size=1, max_size=3),
    "prompt": _NONEMPTY | _TOKEN_IDS | st.lists(_NONEMPTY | _TOKEN_IDS, min_size=1, max_size=1),
    "max_tokens": st.none() | st.integers(1, 2**31), "max_completion_tokens": st.none() | st.integers(1, 2**31),
    "temperature": st.none() | st.floats(0, 2) | st.integers(0, 2),
    "top_p": st.none() | st.floats(0, 1, exclude_min=True) | st.just(1),
    "top_k": st.none() | st.integers(-1, 100), "seed": st.none() | st.integers(-2**63, 2**63 - 1),
    "stop": st.none() | _NONEMPTY | st.lists(_NONEMPTY, max_size=8),
    "n": st.none() | st.integers(1, 3), "best_of": _one(1), "echo": st.none() | st.booleans(), "suffix": _one(),
    "presence_penalty": st.none() | st.floats(-2, 2), "frequency_penalty": st.none() | st.integers(-2, 2),
    "repetition_penalty": st.none() | st.floats(0, 10, exclude_min=True), "min_p": st.none() | st.floats(0, 1),
    "min_tokens": st.none() | st.integers(0, 1),
    "logit_bias": st.none() | st.dictionaries(st.integers(0, 10**9 - 1).map(str), st.floats(-100, 100), max_size=3),
    "tools": _one([], [TOOL]), "tool_choice": _one("none", "auto"), "parallel_tool_calls": st.none() | st.booleans(),
    "response_format": st.none() | st.sampled_from([
        {"type": "text"}, {"type": "json_object"},
        {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}, "strict": True}}]),
    "structured_outputs": st.none() | st.sampled_from([{}, {"regex": "a+"}, {"choice": ["a", "b"]}, {"json_object": False},
                                                       {"json": {"type": "object"}}, {"grammar": None}]),
    "guided_json": st.none() | st.sampled_from([{"type": "string"}, '{"type": "integer"}']),
    "guided_regex": st.none() | _NONEMPTY, "guided_choice": st.none() | st.lists(_NONEMPTY, min_size=1, max_size=2),
    "guided_grammar": st.none() | _NONEMPTY,
    "stream": st.none() | st.booleans(), "ignore_eos": st.none() | st.booleans(),
    "stream_options": st.none() | st.fixed_dictionaries({}, optional={"include_usage": st.booleans()}),
    "user": st.none() | _TEXT, "stop_token_ids": st.none() | st.lists(st.integers(-5, 2**31), max_size=3),
    "top_logprobs": st.none() | st.integers(0, 20),  # > 0 only with logprobs = true
}
_VALID_LOGPROBS = {"chat": st.none() | st.booleans(), "completion": st.none() | st.integers(0, 5)}

# Values to break one field with: near misses first, any JSON after.
_NUMBER = st.sampled_from([None, True, False, 0, 1, 2, 5, 6, 20, 21, -1, -2, 0.0, -0.0, 0.5, 1.0, 1.5, 2.5, "1"]) \
    | st.integers(-3, 30) | st.floats(-1, 3)
_FLAG = st.sampled_from([None, True, False, 0, 1, "true"])
_PART = st.fixed_dictionaries({}, optional={"type": st.sampled_from(["text", "image_url", None]),
                                            "text": _TEXT | st.just(1), "cache_control": _JSON})
_MESSAGE = st.fixed_dictionaries({}, optional={
    "role": st.sampled_from([*ROLES, *ROLE_ALIASES, "robot", None]),
    "content": _TEXT | st.lists(_PART, max_size=2) | st.none(),
    "name": _TEXT, "tool_call_id": _TEXT}) | _JSON
_TOKENS = st.lists(st.integers(-1, 5) | st.sampled_from([True, 1.5, 2.0]), max_size=3)
_BREAK = {
    "model": st.sampled_from(["", None, 1]) | _JSON,
    "messages": st.lists(_MESSAGE, max_size=3) | _JSON,
    "prompt": _TEXT | _TOKENS | st.lists(_TEXT | _TOKENS, max_size=2) | _JSON,
    "stop": _TEXT | st.lists(_TEXT | st.just(1), max_size=5) | _JSON,
    "stop_token_ids": _TOKENS | _JSON,
    "stream_options": st.fixed_dictionaries({}, optional={"include_usage": _FLAG, "other": _FLAG}) | _JSON,
    "stream": _FLAG, "ignore_eos": _FLAG, "echo": _FLAG, "parallel_tool_calls": _FLAG,
    "logprobs": _FLAG | _NUMBER, "user": _TEXT | _JSON, "suffix": _TEXT | st.none(),
    "logit_bias": st.sampled_from([{}, {"1": 1}, [], None, {"a": 1}, {"-1": 1}, {"1": 101}, {"1": True},
                                   {"²": 1}, {"1234567890": 1}]),
    "tools": st.sampled_from([[], [{}], "none", None, False, [TOOL], [TOOL, TOOL], [{"type": "function", "function": {
        "name": "a b"}}], [{"type": "function", "function": {"name": "f", "parameters": []}}]]),
    "tool_choice": st.sampled_from(["none", "auto", None, [], "required", "x",
                                    {"type": "function", "function": {"name": "get_weather"}}, {"type": "function"}]),
    "response_format": st.sampled_from([{"type": "text"}, {"type": "json_object"}, None, "text", {"type": "json_schema"},
                                        {"type": "json_schema", "json_schema": {"schema": True}}, {"type": "other"}]),
    "structured_outputs": st.sampled_from([{"regex": ""}, {"foo": 1}, {"choice": []}, {"choice": [""]}, {"json": 1},
                                           {"json": "[1]"}, {"json": "{"}, {"json_object": 1}, "x", []]),
    "guided_json": st.sampled_from(["", "[]", "{}", 3, [], {}]),
    "guided_choice": st.sampled_from([[], [""], "a", [1]]),
}


@st.composite
def _bodies(draw: st.DrawFn, endpoint: str) -> Any:
    """A body the parser accepts, then (mostly) one field broken, added or removed."""
    if draw(st.integers(0, 19)) == 0:
        return draw(_JSON)
    fields = sorted(openai_api.CHAT_FIELDS if endpoint == "chat" else openai_api.COMPLETION_FIELDS)
    required = ["model", "messages" if endpoint == "chat" else "prompt"]
    valid = {**_VALID, "logprobs": _VALID_LOGPROBS[endpoint]}
    body = {key: draw(valid[key]) for key in required}
    body |= draw(st.fixed_dictionaries({}, optional={k: valid[k] for k in fields if k not in required}))
    for _ in range(draw(st.integers(0, 2))):
        key = draw(st.sampled_from([*fields, "bogus"]))
        if key in body and draw(st.booleans()):
            del body[key]
        else:
            body[key] = draw(_BREAK.get(key, _NUMBER | _JSON))
    return body


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), endpoint=st.sampled_from(["chat", "completion"]))
def test_generated_bodies_agree_with_parser_and_reference(data: st.DataObject, endpoint: str) -> None:
    _assert_agree(endpoint, data.draw(_bodies(endpoint)))


class TestOpenAISchemaContract(ValidatorContract):
    registered_name = "openai-schema"
