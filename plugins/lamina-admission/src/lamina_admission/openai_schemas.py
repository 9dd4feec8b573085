"""The JSON Schemas (draft-07) of the two OpenAI request bodies Lamina serves.

``chat_schema()`` is the body of ``POST /v1/chat/completions`` and ``completion_schema()``
the body of ``POST /v1/completions``. They describe exactly what
``lamina.server.openai_api.parse_chat``/``parse_completion`` accept: the same field sets
(unknown fields are refused, ``additionalProperties: false``: the HTTP server removes them
before admission unless the stack sets ``server.strict_fields``), types and ranges, and the
fields OpenAI defines that Lamina does not support (``suffix``). ``null`` is accepted wherever the parser treats it as "not given".

The schemas are plain data: dump them with ``json.dumps`` to publish them, or extend a
copy (a further ``enum``, a tighter ``maximum``) and hand it to
:class:`~lamina_admission.schema_validator.SchemaValidator`. Only draft-07 keywords are
used, so any draft-07 validator reads them the same way; ``errorMessage`` (the ajv-errors
convention) is an annotation that validators ignore and the Lamina validator uses as the
rule's wording.

Where draft-07 cannot say what the parser says, the schema is more lenient and the parser
still refuses the body: JSON Schema's ``integer`` admits ``5.0``, which the parser rejects
for integer fields, and ``best_of`` must equal ``n``, which draft-07 cannot compare.
"""

from __future__ import annotations

from typing import Any

from lamina_hookspecs.types import (MAX_CHOICES, MAX_LOGIT_BIAS, MAX_STOPS, MAX_TOP_LOGPROBS, ROLE_ALIASES, ROLES, STRUCTURED_KINDS,
                                    TOOL_CHOICE_RULE, TOOL_NAME_PATTERN, TOOL_NAME_RULE)

DRAFT_07 = "http://json-schema.org/draft-07/schema#"
MAX_COMPLETION_LOGPROBS = 5


def _nullable(*types: str) -> dict[str, Any]:
    return {"type": [*types, "null"]}


def _max_tokens(max_tokens_limit: int | None) -> dict[str, Any]:
    schema = {**_nullable("integer"), "minimum": 1}
    if max_tokens_limit is not None:
        schema["maximum"] = max_tokens_limit
    return schema


def _structured() -> dict[str, Any]:
    """The structured-output fields (``_structured`` in ``openai_api.py``). The schema cannot say that
    a JSON Schema given as text must parse to an object, nor that at most one constraint is given."""
    constraint = {
        "json": {**_nullable("object", "string"), "description": "a JSON Schema, or its JSON text"},
        "json_object": _nullable("boolean"),
        "regex": {**_nullable("string"), "minLength": 1},
        "choice": {**_nullable("array"), "minItems": 1, "items": {"type": "string", "minLength": 1}},
        "grammar": {**_nullable("string"), "minLength": 1, "description": "Lark with a start rule, or GBNF"},
    }
    json_schema = {"type": "object", "required": ["schema"], "properties": {"schema": {"type": "object"}}}
    return {
        "response_format": {
            **_nullable("object"), "required": ["type"],
            "properties": {"type": {"enum": ["text", "json_object", "json_schema"]}},
            "if": {"properties": {"type": {"const": "json_schema"}}},
            "then": {"required": ["json_schema"], "properties": {"json_schema": json_schema}},
        },
        "structured_outputs": {**_nullable("object"), "propertyNames": {"enum": list(STRUCTURED_KINDS)},
                               "properties": constraint},
        **{f"guided_{kind}": constraint[kind] for kind in ("json", "regex", "choice", "grammar")},
    }


def _common(max_tokens_limit: int | None) -> dict[str, Any]:
    """The properties both endpoints share (``_COMMON`` in ``openai_api.py``)."""
    return {
        "model": {"type": "string", "minLength": 1, "description": "the id of a model from GET /v1/models"},
        "max_tokens": _max_tokens(max_tokens_limit),
        "temperature": {**_nullable("number"), "minimum": 0, "maximum": 2},
        "top_p": {**_nullable("number"), "exclusiveMinimum": 0, "maximum": 1},
        "top_k": {**_nullable("integer"), "minimum": -1, "description": "0 or -1: no top-k cut"},
        "seed": _nullable("integer"),
        "stop": {
            **_nullable("string", "array"), "minLength": 1, "maxItems": MAX_STOPS,
            "items": {"type": "string", "minLength": 1},
            "description": f"a non-empty string or a list of at most {MAX_STOPS} of them",
        },
        "n": {**_nullable("integer"), "minimum": 1, "maximum": MAX_CHOICES, "description": "the number of choices"},
        "stream": _nullable("boolean"),
        "stream_options": {
            **_nullable("object"), "additionalProperties": False,
            "properties": {"include_usage": {"type": "boolean"}},
        },
        "user": _nullable("string"),
        "presence_penalty": {**_nullable("number"), "minimum": -2, "maximum": 2},
        "frequency_penalty": {**_nullable("number"), "minimum": -2, "maximum": 2},
        "repetition_penalty": {**_nullable("number"), "exclusiveMinimum": 0, "maximum": 10},
        "logit_bias": {**_nullable("object"), "maxProperties": MAX_LOGIT_BIAS, "propertyNames": {"pattern": "^[0-9]{1,9}$"},
                       "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100}},
        "min_p": {**_nullable("number"), "minimum": 0, "maximum": 1},
        "min_tokens": {**_nullable("integer"), "minimum": 0},
        "ignore_eos": _nullable("boolean"),
        "stop_token_ids": {**_nullable("array"), "items": {"type": "integer"}},
        **_structured(),
    }


def _body(title: str, properties: dict[str, Any], required: list[str], **extra: Any) -> dict[str, Any]:
    return {"$schema": DRAFT_07, "title": title, "type": "object", "required": required,
            "properties": properties, "additionalProperties": False, **extra}


def chat_schema(*, max_messages: int = 1024, max_prompt_chars: int = 1_000_000,
                max_tokens_limit: int | None = None) -> dict[str, Any]:
    """The body of ``POST /v1/chat/completions``.

    :param max_messages: most messages in ``messages``.
    :param max_prompt_chars: most characters in one message content string or text part.
    :param max_tokens_limit: upper bound of ``max_tokens``/``max_completion_tokens`` (``None``: none).
    """
    text_part = {
        "type": "object", "required": ["type", "text"],
        "properties": {"type": {"const": "text"}, "text": {"type": "string", "maxLength": max_prompt_chars}},
    }
    # Keys the parser ignores (name, ...) are allowed: the openai client sends them.
    call = {"type": "object", "required": ["id", "function"], "properties": {
        "id": {"type": "string"},
        "function": {"type": "object", "required": ["name", "arguments"],
                     "properties": {"name": {"type": "string"}, "arguments": {"type": "string"}}}}}
    message = {
        "type": "object", "required": ["role"],
        "properties": {
            "role": {"enum": [*ROLES, *ROLE_ALIASES]},
            "content": {"type": ["string", "array", "null"], "maxLength": max_prompt_chars, "items": text_part},
            "tool_calls": {**_nullable("array"), "items": call},
            "tool_call_id": _nullable("string"),
        },
        "allOf": [
            {"if": {"properties": {"role": {"const": "tool"}}},
             "then": {"required": ["tool_call_id"], "properties": {"tool_call_id": {"type": "string"}}}},
            # content may be null or absent only in an assistant turn that calls tools
            {"if": {"not": {"required": ["role", "tool_calls"], "properties": {
                "role": {"const": "assistant"}, "tool_calls": {"type": "array", "minItems": 1}}}},
             "then": {"required": ["content"], "properties": {"content": {"type": ["string", "array"]}}}},
        ],
    }
    function = {"type": "object", "required": ["name"], "properties": {
        "name": {"type": "string", "pattern": TOOL_NAME_PATTERN, "errorMessage": TOOL_NAME_RULE},
        "description": _nullable("string"),
        "parameters": _nullable("object"),
    }}
    tool = {"type": "object", "required": ["type", "function"],
            "properties": {"type": {"const": "function"}, "function": function}}
    named = {"type": "object", "required": ["type", "function"], "properties": {
        "type": {"const": "function"},
        "function": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}}}}
    properties = {
        **_common(max_tokens_limit),
        "messages": {"type": "array", "minItems": 1, "maxItems": max_messages, "items": message},
        "max_completion_tokens": _max_tokens(max_tokens_limit),
        "logprobs": _nullable("boolean"),
        "top_logprobs": {**_nullable("integer"), "minimum": 0, "maximum": MAX_TOP_LOGPROBS},
        "parallel_tool_calls": _nullable("boolean"),
        "tools": {**_nullable("array"), "items": tool},
        "tool_choice": {"anyOf": [{"enum": ["none", "auto", "required", None]}, named],
                        "errorMessage": TOOL_CHOICE_RULE},
    }
    # top_logprobs > 0 needs logprobs = true.
    logprobs_off = {"not": {"required": ["logprobs"], "properties": {"logprobs": {"const": True}}}}
    top_logprobs_zero = {"properties": {"top_logprobs": {
        "enum": [0, None], "errorMessage": "must be 0 unless logprobs is true"}}}
    return _body("POST /v1/chat/completions request body", properties, ["model", "messages"],
                 **{"if": logprobs_off, "then": top_logprobs_zero})


def completion_schema(*, max_prompt_chars: int = 1_000_000, max_tokens_limit: int | None = None) -> dict[str, Any]:
    """The body of ``POST /v1/completions``.

    :param max_prompt_chars: most characters in a prompt string.
    :param max_tokens_limit: upper bound of ``max_tokens`` (``None``: none).
    """
    token_id = {"type": "integer", "minimum": 0}
    # One prompt per request: a string, a list of token ids, or a batch of one of those.
    # Keywords apply by type, so one schema covers all four shapes with precise errors.
    prompt = {
        "type": ["string", "array"], "minLength": 1, "maxLength": max_prompt_chars, "minItems": 1,
        "items": {
            "type": ["integer", "string", "array"], "minimum": 0,
            "minLength": 1, "maxLength": max_prompt_chars,
            "minItems": 1, "items": token_id,
        },
        "if": {"contains": {"type": ["string", "array"]}},
        "then": {"maxItems": 1, "errorMessage": "must be one prompt: a string, a list of token ids, "
                                                "or a list holding one of those"},
    }
    properties = {
        **_common(max_tokens_limit),
        "prompt": prompt,
        "logprobs": {**_nullable("integer"), "minimum": 0, "maximum": MAX_COMPLETION_LOGPROBS},
        "echo": _nullable("boolean"),
        "best_of": {**_nullable("integer"), "minimum": 1, "maximum": MAX_CHOICES,
                    "description": "only equal to n: every choice generated is returned"},
        "suffix": {"type": "null", "errorMessage": "not supported", "description": "suffix is not supported"},
    }
    return _body("POST /v1/completions request body", properties, ["model", "prompt"])
