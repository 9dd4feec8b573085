"""Structured output on the tiny random model: every constrained output is what its constraint allows."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import numpy as np
import pytest
from lamina_hookspecs.errors import InvalidRequestError
from lamina_hookspecs.types import Request, SamplingParams, StructuredOutput, TokenChunk

from lamina_jax.executor import JaxExecutor
from lamina_jax.options import JaxOptions
from lamina_jax.structured_output import Grammars, advance, fill_mask, mask_words
from lamina_jax.testing import tokenizer_metadata
from lamina_jax.tokenizer import Tokenizer

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["ok", "color", "n"],
          "properties": {"ok": {"type": "boolean"}, "color": {"enum": ["red", "dark green"]},
                         "n": {"type": "integer", "minimum": 0, "maximum": 99}}}


def _schema_holds(text: str) -> bool:
    value = json.loads(text)
    return (set(value) == {"ok", "color", "n"} and isinstance(value["ok"], bool)
            and value["color"] in ("red", "dark green") and type(value["n"]) is int and 0 <= value["n"] <= 99)


CASES: list[tuple[StructuredOutput, object]] = [
    (StructuredOutput(kind="json", spec=json.dumps(SCHEMA)), _schema_holds),
    (StructuredOutput(kind="regex", spec=r"(yes|no)-[0-9]{2}"), re.compile(r"(yes|no)-[0-9]{2}").fullmatch),
    (StructuredOutput(kind="choice", choices=("alpha", "beta gamma", 'quote "q"')),
     lambda text: text in ("alpha", "beta gamma", 'quote "q"')),
    (StructuredOutput(kind="grammar", spec='root ::= ("x" | "yz") ("1" | "22") "."'),
     re.compile(r"(x|yz)(1|22)\.").fullmatch),
    (StructuredOutput(kind="grammar", spec='start: "(" NUM ")"\nNUM: /[0-9]{1,3}/'),
     re.compile(r"\([0-9]{1,3}\)").fullmatch),
]


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_gguf(tokenizer_metadata())


@pytest.fixture(scope="module")
def grammars(tokenizer: Tokenizer) -> Grammars:
    return Grammars(tokenizer, tokenizer.backend.get_vocab_size())


def _allowed(mask: np.ndarray, vocab: int) -> np.ndarray:
    return np.flatnonzero(np.unpackbits(mask.view(np.uint8), bitorder="little")[:vocab])


@pytest.mark.parametrize("structured", [case for case, _ in CASES], ids=lambda s: s.kind)
def test_a_mask_never_leaves_a_row_without_a_token_and_allows_the_end_once_complete(
        grammars: Grammars, tokenizer: Tokenizer, structured: StructuredOutput) -> None:
    """Walk 30 random paths through each grammar, taking any token its mask allows."""
    rng = np.random.default_rng(0)
    vocab = grammars.vocab_size
    masks = np.zeros((1, mask_words(vocab)), np.int32)
    ends = sorted(tokenizer.eos_ids)
    for _ in range(30):
        matcher = grammars.matcher(structured)
        for _ in range(200):
            fill_mask(matcher, masks, 0)
            allowed = _allowed(masks[0], vocab)
            assert len(allowed) > 0
            token = int(rng.choice(allowed))
            if token in ends:
                assert matcher.is_accepting()
                break
            if advance(matcher, token):
                fill_mask(matcher, masks, 0)
                assert list(_allowed(masks[0], vocab)) == ends, "a complete sentence allows only the end"
                break
        else:
            pytest.fail("no path ended within 200 tokens")


def test_constraints_that_do_not_compile_get_a_400_naming_their_field(grammars: Grammars) -> None:
    bad = [StructuredOutput(kind="regex", spec="[a-", param="guided_regex"),
           StructuredOutput(kind="json", spec='{"type": "no such type"}', param="response_format"),
           StructuredOutput(kind="json", spec='{"$ref": "#/$defs/missing"}', param="structured_outputs.json"),
           StructuredOutput(kind="grammar", spec="start: undefined_rule", param="guided_grammar")]
    for structured in bad:
        with pytest.raises(InvalidRequestError) as caught:
            grammars.matcher(structured)
        assert caught.value.param == structured.param and str(caught.value).startswith(f"{structured.param}: ")


async def _collect(executor: JaxExecutor, request: Request) -> list[TokenChunk]:
    return [chunk async for chunk in executor.generate(request)]


def test_constrained_requests_sampled_beside_free_ones_keep_to_their_constraints(tiny_gguf: Path) -> None:
    """Random sampling (temperature 1) under every kind of constraint, all in one batch with free
    requests; a seeded free request gets the same tokens as alone."""

    async def go() -> tuple[list[list[TokenChunk]], list[TokenChunk], list[TokenChunk], int]:
        executor = JaxExecutor(JaxOptions(model=str(tiny_gguf), kv_cache_mb=1, max_model_len=128,
                                          weights_dtype="float32", max_batch=16))
        await executor.start()
        model = executor.model.id

        def request(i: int, structured: StructuredOutput | None) -> Request:
            return Request(id=f"r{i}", model=model, prompt=f"item {i}:", sampling=SamplingParams(
                max_tokens=60, temperature=1.0, seed=i, structured=structured))

        free = request(99, None)
        alone = await _collect(executor, free)
        requests = [request(i, case) for i, (case, _) in enumerate(CASES * 3)]
        outputs = await asyncio.gather(*(_collect(executor, r) for r in [*requests, free]))
        await asyncio.sleep(0.05)  # the engine frees finished blocks at its next step boundary
        used = executor.state().kv_blocks_used
        await executor.stop()
        return outputs[:-1], outputs[-1], alone, used

    constrained, free, alone, used = asyncio.run(go())
    for chunks, (_, holds) in zip(constrained, CASES * 3, strict=True):
        text = "".join(c.text for c in chunks)
        assert chunks[-1].finish_reason == "stop" and holds(text), text
    assert [c.token_ids for c in free] == [c.token_ids for c in alone]
    assert used == 0
