"""Build a component's attrs options object from a stack-file table, with path-named errors.

Each key is checked against ``attrs.fields_dict(cls)`` before anything is built; values
are checked against the field's annotation (bool, int, float, str, Literal, unions with
None, tuple/list, dict, nested attrs classes) and its attrs validators. Every error is a
``ConfigError`` whose path is the dotted stack-file key (``executor.kv_dtype``).
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from typing import Any

import attrs

from lamina_hookspecs.errors import ConfigError
from lamina.kernel.suggest import did_you_mean


def check_keys(data: Mapping[str, Any], allowed: typing.Iterable[str], path: str, what: str = "option") -> None:
    """Raise at the first key of ``data`` not in ``allowed``, suggesting the closest."""
    allowed = sorted(allowed)
    for key in data:
        if key not in allowed:
            listing = ", ".join(allowed) if allowed else "none"
            raise ConfigError(_join(path, key), f"unknown {what};{did_you_mean(key, allowed)} {what}s: {listing}")


def build_options(cls: type | None, data: Mapping[str, Any], path: str) -> Any:
    """An instance of ``cls`` from ``data`` (``None`` when ``cls`` is ``None`` and ``data`` is empty)."""
    if cls is None:
        check_keys(data, (), path)
        return None
    fields = attrs.fields_dict(attrs.resolve_types(cls))
    check_keys(data, fields, path)
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        field = fields[name]
        field_path = _join(path, name)
        kwargs[name] = _coerce(field.type, value, field_path)
        if field.validator is not None:
            try:
                field.validator(None, field, kwargs[name])
            except (ValueError, TypeError) as exc:
                raise ConfigError(field_path, _strip_field_name(str(exc), name)) from None
    for name, field in fields.items():
        if field.init and field.default is attrs.NOTHING and name not in kwargs:
            raise ConfigError(_join(path, name), "missing: this option is required")
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as exc:
        raise ConfigError(path, str(exc)) from None


def describe(cls: type | None) -> list[dict[str, Any]]:
    """Each option's name, type, default and help text (``metadata={"help": ...}``)."""
    if cls is None:
        return []
    out = []
    for field in attrs.fields(attrs.resolve_types(cls)):
        default = field.default
        if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
            default = default.factory()  # type: ignore[union-attr]
        out.append({
            "name": field.name,
            "type": _type_name(field.type),
            "default": None if default is attrs.NOTHING else default,
            "required": default is attrs.NOTHING,
            "help": field.metadata.get("help", ""),
        })
    return out


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def _strip_field_name(message: str, name: str) -> str:
    """attrs validator messages start with the field name, which the path already shows."""
    prefix = f"'{name}' "
    return message[len(prefix):] if message.startswith(prefix) else message


def _type_name(tp: Any) -> str:
    if isinstance(tp, type):
        return tp.__name__
    return str(tp).replace("typing.", "")


def _coerce(tp: Any, value: Any, path: str) -> Any:  # noqa: C901 - one branch per kind of annotation
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return value
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(path, f"must be one of {', '.join(repr(a) for a in args)}; got {value!r}")
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _coerce(arg, value, path)
            except ConfigError as exc:
                errors.append(exc.problem)
        raise ConfigError(path, " or ".join(errors))
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(path, f"must be an array; got {type(value).__name__} {value!r}")
        if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
            items = [_coerce(args[0], v, _join(path, i)) for i, v in enumerate(value)]
        elif origin is tuple and args:
            if len(args) != len(value):
                raise ConfigError(path, f"must have {len(args)} items; got {len(value)}")
            items = [_coerce(a, v, _join(path, i)) for i, (a, v) in enumerate(zip(args, value, strict=True))]
        else:
            items = [_coerce(args[0] if args else Any, v, _join(path, i)) for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict or tp is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(path, f"must be a table; got {type(value).__name__} {value!r}")
        value_type = args[1] if args else Any
        return {str(k): _coerce(value_type, v, _join(path, str(k))) for k, v in value.items()}
    if isinstance(tp, type) and attrs.has(tp):
        if not isinstance(value, Mapping):
            raise ConfigError(path, f"must be a table; got {type(value).__name__} {value!r}")
        return build_options(tp, value, path)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(path, f"must be true or false; got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(path, f"must be an integer; got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(path, f"must be a number; got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(path, f"must be a string; got {value!r}")
        return value
    raise ConfigError(path, f"option type {_type_name(tp)} is not supported in stack files")
