"""The GGUF tokenizer on a tiny byte-level BPE vocabulary: encoding, chat template, streaming decode."""

import pytest

from lamina_jax.chat_template import ChatTemplateError
from lamina_jax.testing import tokenizer_metadata
from lamina_jax.tokenizer import Tokenizer, IncrementalDetokenizer

TOKENIZER = Tokenizer.from_gguf(tokenizer_metadata())
TEXTS = [
    "Hello wörld, naïve café, Ångström",
    "emoji 😀🎉👍🏽 and ❤️ ok",
    "日本語のテキスト 中文 한국어",
    " the  spaces   kept\n\n\tthen  the end  ",
    "12345 numbers 3.14159",
]


@pytest.mark.parametrize("text", TEXTS)
def test_encode_decode_round_trip(text: str) -> None:
    assert TOKENIZER.decode(TOKENIZER.encode(text)) == text


def test_control_tokens_encode_to_one_id() -> None:
    a, b = TOKENIZER.encode("a"), TOKENIZER.encode("b")
    assert TOKENIZER.encode("<|im_start|>") == [1]
    assert TOKENIZER.encode("a<|im_end|>b") == [*a, 2, *b]
    assert TOKENIZER.decode([1, *a, 2], skip_special_tokens=True) == "a"


def test_digits_are_split_one_by_one() -> None:
    digit = TOKENIZER.backend.token_to_id
    assert TOKENIZER.encode("12") == [digit("1"), digit("2")]  # even though the merge "1 2" exists
    assert TOKENIZER.encode(" the") == [digit("Ġthe")]


def test_bos_follows_the_add_bos_flag() -> None:
    with_bos = Tokenizer.from_gguf(tokenizer_metadata(add_bos=True))
    assert with_bos.encode("hi")[0] == 1
    assert with_bos.encode("hi", add_special_tokens=False) == TOKENIZER.encode("hi")
    assert TOKENIZER.encode("hi")[0] != 1


@pytest.mark.parametrize("text", TEXTS)
def test_incremental_detokenizer_matches_full_decode(text: str) -> None:
    ids = TOKENIZER.encode(text)
    detokenizer = IncrementalDetokenizer(TOKENIZER)
    pieces = [detokenizer.add(token_id) for token_id in ids]
    assert "".join(pieces) == TOKENIZER.decode(ids) == text
    assert not any("\ufffd" in piece for piece in pieces)
    if len(text.encode()) > len(text):  # multi-byte characters split over byte tokens are held back
        assert "" in pieces


def test_incremental_detokenizer_after_prompt_skipping_special_tokens() -> None:
    prompt = TOKENIZER.encode("<|im_start|>assistant\n")
    detokenizer = IncrementalDetokenizer(TOKENIZER, prompt, skip_special_tokens=True)
    pieces = [detokenizer.add(token_id) for token_id in TOKENIZER.encode(" Voilà 😀<|im_end|>")]
    assert "".join(pieces) == " Voilà 😀"


def test_chat_template_renders_chatml() -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    rendered = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    assert TOKENIZER.render_chat(messages) == rendered + "<|im_start|>assistant\n"
    assert TOKENIZER.render_chat(messages, add_generation_prompt=False) == rendered
    ids = TOKENIZER.encode_chat(messages)
    assert ids[0] == 1 and ids.count(1) == 3 and ids.count(2) == 2


def test_chat_template_can_raise_exception() -> None:
    metadata = tokenizer_metadata() | {"tokenizer.chat_template": "{{ raise_exception('no system role') }}"}
    with pytest.raises(ChatTemplateError, match="no system role"):
        Tokenizer.from_gguf(metadata).render_chat([])


def test_unsupported_pre_tokenizer_is_refused() -> None:
    with pytest.raises(NotImplementedError, match="'chatglm-bpe': supported are .*llama-bpe"):
        Tokenizer.from_gguf(tokenizer_metadata() | {"tokenizer.ggml.pre": "chatglm-bpe"})


def test_flush_releases_a_trailing_partial_character() -> None:
    ids = TOKENIZER.encode("ok 😀")[:-1]  # the emoji's last byte is missing
    detokenizer = IncrementalDetokenizer(TOKENIZER)
    streamed = "".join(detokenizer.add(token_id) for token_id in ids)
    assert not streamed.endswith("\ufffd")
    assert streamed + detokenizer.flush() == TOKENIZER.decode(ids) and TOKENIZER.decode(ids).endswith("\ufffd")
    assert detokenizer.flush() == ""
