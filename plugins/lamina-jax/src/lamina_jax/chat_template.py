"""Chat templates rendered as Hugging Face's ``apply_chat_template`` renders them.

Templates are written for transformers' Jinja environment, so this one is the same: a sandbox with
``trim_blocks`` and ``lstrip_blocks``, the loop-controls extension, a ``tojson`` filter that keeps
non-ASCII text, and the globals ``raise_exception`` and ``strftime_now``. The variables are the
messages, ``tools``, ``documents``, ``add_generation_prompt`` and the special tokens (``bos_token``,
``eos_token``, …). A template that raises, on purpose or not, is the request's fault here: it
fails with `ChatTemplateError`, which the executor answers with HTTP 400.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping, Sequence
from typing import Any

import jinja2
import jinja2.meta
import jinja2.sandbox


class ChatTemplateError(ValueError):
    """The chat template could not render these messages; the message says why."""


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _strftime_now(format_: str) -> str:
    return datetime.datetime.now().strftime(format_)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class ChatTemplate:
    """A compiled chat template with the special tokens it may name.

    :param source: the Jinja source.
    :param special_tokens: ``bos_token``, ``eos_token`` and the like, as text.

    ``takes_tools`` says whether the template reads ``tools`` (renders the tools it is given).
    """

    def __init__(self, source: str, special_tokens: Mapping[str, str]) -> None:
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        try:
            self._template = env.from_string(source)
            self.takes_tools = "tools" in jinja2.meta.find_undeclared_variables(env.parse(source))
        except jinja2.TemplateSyntaxError as error:
            raise ValueError(f"the chat template does not parse: {error.message} (line {error.lineno})") from error
        self.special_tokens = dict(special_tokens)

    def render(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True,
               tools: Sequence[Mapping[str, Any]] | None = None,
               documents: Sequence[Mapping[str, Any]] | None = None) -> str:
        """The prompt text of ``messages``; `ChatTemplateError` when the template raises."""
        try:
            return self._template.render(messages=list(messages), tools=tools, documents=documents,
                                         add_generation_prompt=add_generation_prompt, **self.special_tokens)
        except (jinja2.TemplateError, TypeError, ValueError, KeyError, IndexError) as error:
            raise ChatTemplateError(f"the chat template refused these messages: {error}") from error
