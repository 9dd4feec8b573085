"""The model's tokenizer: text and chat messages to token ids and back, and streaming detokenization.

A `Tokenizer` wraps a Hugging Face ``tokenizers`` tokenizer, built from a GGUF file's vocabulary
(`gguf_vocab`) or read from a Hugging Face directory's ``tokenizer.json`` as it is, with the
model's BOS and end-of-generation ids and its chat template (`chat_template`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import tokenizers
from tokenizers import processors

from lamina_jax import gguf_vocab
from lamina_jax.chat_template import ChatTemplate


class Tokenizer:
    """Encode text and chat messages to token ids and decode them back.

    :param backend: the Hugging Face ``tokenizers`` tokenizer doing the work; its post-processor
        adds BOS (and EOS) where the model's default encoding does.
    :param bos_id: the beginning-of-sequence id, if the model has one.
    :param eos_ids: every id that ends a generation; ``eos_id`` is the first-named.
    :param chat_template: the model's Jinja chat template, or ``None`` if it has none.
    :param special_tokens: the text of special tokens the template may name (``bos_token`` and
        ``eos_token`` default to those of ``bos_id`` and ``eos_id``).
    """

    def __init__(self, backend: tokenizers.Tokenizer, *, bos_id: int | None, eos_id: int,
                 eos_ids: Iterable[int] = (), chat_template: str | None,
                 special_tokens: Mapping[str, str] | None = None) -> None:
        self.backend = backend
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.eos_ids = frozenset({eos_id, *eos_ids})
        self._special = {"bos_token": self.token(bos_id), "eos_token": self.token(eos_id), **(special_tokens or {})}
        self.chat_template: ChatTemplate | None = None
        if chat_template is not None:
            self.set_chat_template(chat_template)

    def set_chat_template(self, source: str) -> None:
        """Render chats with the Jinja template ``source`` (replacing the model's)."""
        self.chat_template = ChatTemplate(source, self._special)

    def token(self, token_id: int | None) -> str:
        """The text of one token id (``""`` for ``None``)."""
        return "" if token_id is None else self.backend.id_to_token(token_id) or ""

    @classmethod
    def from_gguf(cls, metadata: Mapping[str, Any]) -> Tokenizer:
        """Build from GGUF ``tokenizer.*`` metadata (as ``weights.gguf.read_metadata`` returns it)."""
        backend = gguf_vocab.build(metadata)
        bos_id = metadata.get("tokenizer.ggml.bos_token_id")
        bos_id = None if bos_id is None else int(bos_id)
        eos_id = int(metadata["tokenizer.ggml.eos_token_id"])
        add_bos = bool(metadata.get("tokenizer.ggml.add_bos_token", False)) and bos_id is not None
        bos = [(backend.id_to_token(bos_id), bos_id)] if add_bos else []
        eos = [(backend.id_to_token(eos_id), eos_id)] if metadata.get("tokenizer.ggml.add_eos_token") else []
        if bos or eos:
            single = " ".join([*(text for text, _ in bos), "$A", *(text for text, _ in eos)])
            backend.post_processor = processors.TemplateProcessing(single=single, special_tokens=bos + eos)
        return cls(backend, bos_id=bos_id, eos_id=eos_id, eos_ids=gguf_vocab.end_ids(metadata),
                   chat_template=metadata.get("tokenizer.chat_template"))

    @classmethod
    def from_hf(cls, directory: Path) -> Tokenizer:
        """Read a Hugging Face model directory's ``tokenizer.json``, ``tokenizer_config.json`` (special
        tokens, chat template), ``chat_template.jinja`` (where newer transformers save the template)
        and ``generation_config.json`` (the end-of-generation ids)."""
        backend = tokenizers.Tokenizer.from_file(str(directory / "tokenizer.json"))
        config = _json(directory / "tokenizer_config.json")
        special = {key: _content(value) for key, value in config.items()
                   if key.endswith("_token") and _content(value) is not None}

        def token_id(key: str) -> int | None:
            return None if key not in special else backend.token_to_id(special[key])

        ends = _json(directory / "generation_config.json").get("eos_token_id")
        ends = [ends] if isinstance(ends, int) else list(ends or [])
        eos_id = token_id("eos_token")
        if eos_id is None and not ends:
            raise ValueError(f"{directory}: neither tokenizer_config.json's eos_token nor generation_config.json's "
                             "eos_token_id names an end-of-sequence token")
        template_file = directory / "chat_template.jinja"
        template = template_file.read_text() if template_file.is_file() else _template(config.get("chat_template"))
        return cls(backend, bos_id=token_id("bos_token"), eos_id=ends[0] if eos_id is None else eos_id, eos_ids=ends,
                   chat_template=template, special_tokens=special)

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; special tokens written in the text (``<|im_start|>``) become one id each.

        :param add_special_tokens: add BOS (and EOS) where the model's default encoding does.
        """
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def render_chat(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True,
                    tools: Sequence[Mapping[str, Any]] | None = None) -> str:
        """Render ``messages`` (``{"role": …, "content": …}``) through the model's chat template."""
        if self.chat_template is None:
            raise ValueError("this model has no chat template")
        return self.chat_template.render(messages, add_generation_prompt=add_generation_prompt, tools=tools)

    def encode_chat(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None,
                    *, add_generation_prompt: bool = True) -> list[int]:
        """Token ids of the rendered chat (ready for generation unless ``add_generation_prompt`` is false);
        BOS only where the template writes it."""
        return self.encode(self.render_chat(messages, add_generation_prompt=add_generation_prompt, tools=tools),
                           add_special_tokens=False)


def _json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def _content(value: object) -> str | None:
    """A special token as ``tokenizer_config.json`` writes it: text, or ``{"content": text, …}``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _template(value: object) -> str | None:
    """The chat template of ``tokenizer_config.json``: text, or a list of named ones ("default" first)."""
    if isinstance(value, list):
        named = {entry["name"]: entry["template"] for entry in value}
        return named.get("default", next(iter(named.values()), None))
    return value if isinstance(value, str) else None


class IncrementalDetokenizer:
    """Turn generated token ids, one at a time, into newly completed text.

    As vLLM's detokenizer does, each step decodes a short window of recent ids twice — without and with
    the new token — and emits the difference. Text is held back while it ends in U+FFFD (a multi-byte
    character split across tokens), so no broken character is emitted, and because the window starts
    a few tokens back, decoders that drop a leading space see their context and spaces are kept.
    """

    def __init__(
        self, tokenizer: Tokenizer, prompt_ids: Sequence[int] = (), *, skip_special_tokens: bool = False
    ) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._ids = list(prompt_ids)
        self._read_offset = len(self._ids)
        self._prefix_offset = max(self._read_offset - 5, 0)

    def _decode(self, start: int, end: int) -> str:
        ids = self._ids[start:end]
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip_special_tokens)

    def add(self, token_id: int) -> str:
        """Append one token id; return the text it completes (possibly empty)."""
        self._ids.append(token_id)
        prefix_text = self._decode(self._prefix_offset, self._read_offset)
        text = self._decode(self._prefix_offset, len(self._ids))
        if len(text) <= len(prefix_text) or text.endswith("\ufffd"):
            return ""
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        return text[len(prefix_text) :]

    def flush(self) -> str:
        """The text held back at the end of the stream (an incomplete character decodes as U+FFFD),
        so that all the text emitted is the decode of all the ids."""
        prefix_text = self._decode(self._prefix_offset, self._read_offset)
        text = self._decode(self._prefix_offset, len(self._ids))
        self._prefix_offset = self._read_offset = len(self._ids)
        return text[len(prefix_text):] if len(text) > len(prefix_text) else ""
