"""The ``openai-schema`` validator: OpenAI request bodies checked by a compiled JSON Schema.

The rules are data, not code: the draft-07 JSON Schemas in
:mod:`lamina_admission.openai_schemas`, which third parties can read, publish and extend.
They are compiled once, when the stack is built, into a Rust validator (``jsonschema-rs``).
A valid body costs one ``is_valid`` call: ~0.8 µs for a 0.85 KB chat body (~2.2 µs with
the orjson parse), against ~140 µs for the pure-Python ``jsonschema`` with the same schema.
Only an invalid body pays for collecting the errors and wording one of them (~8 µs).

Why not the alternatives measured for the issue: ``msgspec`` typed decoding (~3 µs with
the JSON parse) would make the rules Python structs, code rather than a published schema,
and would replace the HTTP layer's orjson parse; ``fastjsonschema`` (~17 µs) is slower,
generates Python source and runs it through ``exec``, and only knows draft-07 (it ignores
newer keywords such as ``prefixItems`` silently, so an extended schema could pass bodies
it should refuse).

Errors read ``<path>: <rule>``, with the path in ``messages[0].role`` style (dots for keys,
``[i]`` for indices) and the same path as the error's ``param``::

    messages[0].role: must be one of system, user, assistant, tool, developer
    temperature: must be <= 2
    model: required
    foo: unrecognized request argument

When a body breaks several rules, the one reported is the first in a fixed order that does
not depend on the order of the body's keys: unrecognized arguments, then wrong values, then
missing fields, each group by field path (``messages[0].role`` before ``temperature``).
A subschema's ``errorMessage`` string, if it has one, replaces the generic wording of its
rules.

Endpoints other than ``chat`` and ``completion`` are accepted: this validator has no
schema for them, and another validator may.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import attrs
import jsonschema_rs
from lamina_hookspecs.errors import InvalidRequestError
from lamina_hookspecs.registration import BuildContext

from lamina_admission.openai_schemas import chat_schema, completion_schema


def _positive(instance: object, attribute: attrs.Attribute, value: int | None) -> None:  # type: ignore[type-arg]
    if value is None and attribute.default is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        unset = " or unset" if attribute.default is None else ""
        raise ValueError(f"'{attribute.name}' must be an integer >= 1{unset}, not {value!r}")


@attrs.frozen(kw_only=True)
class SchemaValidatorOptions:
    """Stack-file options of ``openai-schema``: limits baked into the compiled schemas."""

    max_messages: int = attrs.field(default=1024, validator=_positive, metadata={
        "help": "most messages in one chat request"})
    max_prompt_chars: int = attrs.field(default=1_000_000, validator=_positive, metadata={
        "help": "most characters in one prompt string, chat message content or text part"})
    max_tokens_limit: int | None = attrs.field(default=None, validator=_positive, metadata={
        "help": "largest max_tokens / max_completion_tokens a request may ask for (unset: no bound; "
                "the context length still applies)"})


class SchemaValidator:
    """Checks request bodies against one compiled JSON Schema per endpoint.

    :param schemas: endpoint (``chat``, ``completion``) → draft-07 JSON Schema. Kept as
        :attr:`schemas` for reading (benchmarks, docs); changing that dict afterwards does not
        change what was compiled.
    """

    def __init__(self, schemas: Mapping[str, Mapping[str, Any]]) -> None:
        self.schemas: dict[str, Mapping[str, Any]] = dict(schemas)
        self._validators = {endpoint: jsonschema_rs.Draft7Validator(schema)
                            for endpoint, schema in self.schemas.items()}
        self._is_valid = {endpoint: validator.is_valid for endpoint, validator in self._validators.items()}

    @classmethod
    def from_options(cls, options: SchemaValidatorOptions) -> SchemaValidator:
        """The OpenAI chat and completion schemas with ``options``' limits."""
        limits = {"max_prompt_chars": options.max_prompt_chars, "max_tokens_limit": options.max_tokens_limit}
        return cls({"chat": chat_schema(max_messages=options.max_messages, **limits),
                    "completion": completion_schema(**limits)})

    def validate(self, endpoint: str, body: Mapping[str, Any]) -> None:
        """Raise :class:`InvalidRequestError` for the first rule ``body`` breaks; ``None`` if it breaks none."""
        is_valid = self._is_valid.get(endpoint)
        if is_valid is None:
            return
        if not isinstance(body, dict) and isinstance(body, Mapping):
            body = dict(body)  # the compiled validator reads dicts, not other mappings
        if is_valid(body):
            return
        errors = self._validators[endpoint].iter_errors(body)
        raise _describe(min(errors, key=_order), self.schemas[endpoint])


def _order(error: jsonschema_rs.ValidationError) -> tuple[bool, bool, tuple[str | int, ...]]:
    """Unrecognized arguments first, then wrong values, then missing fields; each by path.

    Paths are compared element by element and diverge inside one container, whose keys are
    all strings or all indices, so strings are never compared with integers.
    """
    name = error.kind.name
    return name != "additionalProperties", name == "required", _param_parts(error)


def _param_parts(error: jsonschema_rs.ValidationError) -> tuple[str | int, ...]:
    kind = error.kind.as_dict()
    path = tuple(error.instance_path)
    if error.kind.name == "required":
        return (*path, kind["property"])
    if error.kind.name == "additionalProperties":
        return (*path, min(kind["unexpected"]))
    return path


def _path(parts: tuple[str | int, ...]) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _describe(error: jsonschema_rs.ValidationError, schema: Mapping[str, Any]) -> InvalidRequestError:
    parts = _param_parts(error)
    subschema = _subschema(schema, error.schema_path[:-1])
    rule = subschema.get("errorMessage") if isinstance(subschema, Mapping) else None
    if not isinstance(rule, str):
        rule = _rule(error, subschema)
    if not parts:
        return InvalidRequestError(f"request body: {rule}")
    param = _path(parts)
    return InvalidRequestError(f"{param}: {rule}", param=param)


def _subschema(schema: Any, path: list[str | int]) -> Any:
    """The schema object holding the failed keyword, or ``None`` where the path leaves the
    document (a ``$ref`` into another resource)."""
    for step in path:
        try:
            schema = schema[step]
        except (KeyError, IndexError, TypeError):
            return None
    return schema


_TYPES = {"string": "a string", "integer": "an integer", "number": "a number", "boolean": "a boolean",
          "array": "an array", "object": "an object", "null": "null"}


def _render(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


def _either(words: list[str], last: str = "or") -> str:
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} {last} {words[-1]}"


def _plural(n: Any, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word[:-1]}ies" if word.endswith("y") else f"{n} {word}s"


def _types(error: jsonschema_rs.ValidationError, subschema: Any) -> list[str]:
    declared = subschema.get("type") if isinstance(subschema, Mapping) else None
    names = [declared] if isinstance(declared, str) else declared or error.kind.as_dict()["types"]
    return [_TYPES.get(name, name) for name in names]


def _rule(error: jsonschema_rs.ValidationError, subschema: Any) -> str:
    """The broken rule in plain words; the library's own message for rare keywords."""
    name, kind = error.kind.name, error.kind.as_dict()
    limit = kind.get("limit")
    if name == "required":
        return "required"
    if name == "additionalProperties":
        return "unrecognized request argument"
    if name == "enum":
        # null means "not given" in these bodies: it need not be offered as a value.
        options = [_render(o) for o in kind["options"] if o is not None] or ["null"]
        return f"must be {options[0]}" if len(options) == 1 else f"must be one of {', '.join(options)}"
    if name == "const":
        return f"must be {_render(kind['expected_value'])}"
    if name == "type":
        return f"must be {_either(_types(error, subschema))}"
    comparisons = {"minimum": ">=", "maximum": "<=", "exclusiveMinimum": ">", "exclusiveMaximum": "<"}
    if name in comparisons:
        return f"must be {comparisons[name]} {_render(limit)}"
    if name == "minLength":
        return "must not be empty" if limit == 1 else f"must have at least {_plural(limit, 'character')}"
    if name == "maxLength":
        return f"must have at most {_plural(limit, 'character')}"
    if name in ("minItems", "maxItems"):
        return f"must have at {'least' if name == 'minItems' else 'most'} {_plural(limit, 'item')}"
    if name in ("minProperties", "maxProperties"):
        return f"must have at {'least' if name == 'minProperties' else 'most'} {_plural(limit, 'property')}"
    if name in ("anyOf", "oneOf"):
        if not all(kind["context"]):  # a oneOf that more than one branch matched
            return "must match exactly one of the allowed forms, not several"
        return _alternatives(kind["context"], error.instance_path)
    if name == "multipleOf":
        return f"must be a multiple of {_render(kind['multiple_of'])}"
    if name == "pattern":
        return f"must match {kind['pattern']}"
    if name == "uniqueItems":
        return "must not repeat items"
    return str(error.message)


def _alternatives(branches: list[list[jsonschema_rs.ValidationError]], path: list[str | int]) -> str:
    """``must be a string or an integer`` when every branch failed only on its type."""
    types: list[str] = []
    for branch in branches:
        if any(e.kind.name != "type" or e.instance_path != path for e in branch):
            return "must match one of the allowed forms"
        types += [t for e in branch for t in _types(e, None) if t not in types]
    return f"must be {_either(types)}"


def build_schema_validator(options: SchemaValidatorOptions, context: BuildContext) -> SchemaValidator:
    """OpenAI chat and completion bodies checked by a compiled draft-07 JSON Schema (jsonschema-rs)."""
    return SchemaValidator.from_options(options)
