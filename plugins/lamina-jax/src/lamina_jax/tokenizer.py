"""The tokenizer of a GGUF file: byte-level BPE, chat template, and incremental detokenization.

Only ``tokenizer.ggml.model = "gpt2"`` (byte-level BPE) is supported. The pre-tokenizer follows
``tokenizer.ggml.pre`` as llama.cpp does: ``gpt2`` splits with the GPT-2 regex; ``smollm`` (and the
StarCoder family it derives from) first splits every digit on its own, as Hugging Face's
``Digits(individual_digits=True)`` before ``ByteLevel``.
"""

from collections.abc import Mapping, Sequence
from typing import Any

import jinja2
import jinja2.sandbox
import tokenizers
from tokenizers import decoders, models, pre_tokenizers

_CONTROL, _USER_DEFINED = 3, 4
_GPT2_PRE = frozenset({"gpt2"})
_DIGIT_SPLIT_PRE = frozenset({"smollm", "starcoder", "refact", "codeshell"})


def _pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in _GPT2_PRE:
        return byte_level
    if pre in _DIGIT_SPLIT_PRE:
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    raise NotImplementedError(f"unsupported tokenizer.ggml.pre {pre!r}")


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


class GGUFTokenizer:
    """Encode text and chat messages to token ids and decode them back.

    :param backend: the Hugging Face ``tokenizers`` tokenizer doing the work.
    :param bos_id: id prepended by `encode` when ``add_bos``.
    :param eos_id: end-of-sequence id.
    :param chat_template: Jinja2 chat template, or ``None`` if the model has none.
    """

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        bos_id: int | None,
        eos_id: int,
        add_bos: bool,
        chat_template: str | None,
    ) -> None:
        self.backend = backend
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.add_bos = add_bos
        self._template = None
        if chat_template is not None:
            env = jinja2.sandbox.ImmutableSandboxedEnvironment(
                trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
            )
            env.globals["raise_exception"] = _raise_exception
            self._template = env.from_string(chat_template)

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any]) -> "GGUFTokenizer":
        """Build from GGUF ``tokenizer.*`` metadata (as returned by ``read_metadata``)."""
        kind = metadata["tokenizer.ggml.model"]
        if kind != "gpt2":
            raise NotImplementedError(f"unsupported tokenizer.ggml.model {kind!r}: only 'gpt2' (byte-level BPE)")
        tokens: list[str] = list(metadata["tokenizer.ggml.tokens"])
        merges = [tuple(merge.split(" ", 1)) for merge in metadata["tokenizer.ggml.merges"]]
        token_types: Sequence[int] = metadata.get("tokenizer.ggml.token_type", [])
        backend = tokenizers.Tokenizer(
            models.BPE(vocab={token: i for i, token in enumerate(tokens)}, merges=merges, fuse_unk=False)
        )
        backend.pre_tokenizer = _pre_tokenizer(metadata.get("tokenizer.ggml.pre", "gpt2"))
        backend.decoder = decoders.ByteLevel()
        backend.add_special_tokens(
            [
                tokenizers.AddedToken(tokens[i], special=True, normalized=False)
                for i, token_type in enumerate(token_types)
                if token_type == _CONTROL
            ]
        )
        backend.add_tokens(
            [
                tokenizers.AddedToken(tokens[i], special=False, normalized=False)
                for i, token_type in enumerate(token_types)
                if token_type == _USER_DEFINED
            ]
        )
        bos_id = metadata.get("tokenizer.ggml.bos_token_id")
        return cls(
            backend,
            bos_id=None if bos_id is None else int(bos_id),
            eos_id=int(metadata["tokenizer.ggml.eos_token_id"]),
            add_bos=bool(metadata.get("tokenizer.ggml.add_bos_token", False)) and bos_id is not None,
            chat_template=metadata.get("tokenizer.chat_template"),
        )

    def encode(self, text: str, *, add_bos: bool | None = None) -> list[int]:
        """Token ids of ``text``; control tokens written in the text (``<|im_start|>``) become one id each.

        :param add_bos: prepend the BOS id; ``None`` follows the file's ``add_bos_token``.
        """
        ids = self.backend.encode(text, add_special_tokens=False).ids
        if (self.add_bos if add_bos is None else add_bos) and self.bos_id is not None:
            ids = [self.bos_id, *ids]
        return ids

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def render_chat(self, messages: Sequence[Mapping[str, str]], *, add_generation_prompt: bool = True) -> str:
        """Render ``messages`` (``{"role": …, "content": …}``) through the model's chat template."""
        if self._template is None:
            raise ValueError("this model has no chat template")
        special = self.backend.id_to_token
        return self._template.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=special(self.bos_id) if self.bos_id is not None else "",
            eos_token=special(self.eos_id),
        )

    def encode_chat(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        """Token ids of the rendered chat ready for generation; BOS only where the template writes it."""
        return self.encode(self.render_chat(messages), add_bos=False)


class IncrementalDetokenizer:
    """Turn generated token ids, one at a time, into newly completed text.

    As vLLM's detokenizer does, each step decodes a short window of recent ids twice — without and with
    the new token — and emits the difference. Text is held back while it ends in U+FFFD (a multi-byte
    character split across tokens), so no broken character is emitted, and because the window starts
    a few tokens back, decoders that drop a leading space see their context and spaces are kept.
    """

    def __init__(
        self, tokenizer: GGUFTokenizer, prompt_ids: Sequence[int] = (), *, skip_special_tokens: bool = False
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
