"""Every supported architecture, from a Hugging Face directory and from a GGUF file, against
transformers' outputs for the same weights (``data/models``, made by ``make_models.py`` there).

Mistral's GGUF carries no sliding window (llama.cpp's converter drops it, and llama.cpp attends
to every position), so that file is checked against llama.cpp's own greedy tokens on it, and its
Hugging Face directory, which has the window, against transformers'.
"""

from __future__ import annotations

import asyncio
import functools
import json
import shutil
from pathlib import Path
from typing import Any

import attrs
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from lamina_hookspecs.errors import InvalidRequestError
from lamina_hookspecs.types import ChatMessage, Request, SamplingParams, Tool

from lamina_jax.executor import JaxExecutor
from lamina_jax.model.llama import LlamaParams, forward
from lamina_jax.options import JaxOptions
from lamina_jax import weight_formats
from lamina_jax.testing import cpu_kernels_absent, device_counts
from lamina_jax.tokenizer import IncrementalDetokenizer, Tokenizer
from lamina_jax.weights.model_files import ModelFileError, ModelFiles, open_model

MODELS = Path(__file__).parent / "data" / "models"
FAMILIES = ("llama", "llama3", "mistral", "qwen2", "qwen3")
FORMATS = ("hf", "gguf")
TOKENIZER_OF = {"spm": "llama", "bpe-llama3": "llama3", "bpe-qwen2": "qwen2"}
LOGIT_TOLERANCE = 2e-3
"""Largest difference from transformers' float32 logits: the weights are identical (float16 values),
the sums' order differs."""
PADDED = 448
"""Every reference sequence (prompt + greedy tokens) fits: `forward` runs one shape per model."""


def path_of(family: str, fmt: str) -> Path:
    return MODELS / family / ("hf" if fmt == "hf" else "model.gguf")


@functools.cache
def reference(family: str) -> dict[str, Any]:
    return json.loads((MODELS / family / "reference.json").read_text())


@functools.cache
def loaded(family: str, fmt: str) -> tuple[ModelFiles, LlamaParams]:
    files = open_model(path_of(family, fmt))
    return files, files.load_params()


def expected_greedy(family: str, fmt: str, case: dict[str, Any]) -> list[int]:
    return case["llama_cpp_greedy_ids" if (family, fmt) == ("mistral", "gguf") else "greedy_ids"]


CASES = [(family, fmt) for family in FAMILIES for fmt in FORMATS]


@pytest.mark.parametrize(("family", "fmt"), CASES)
def test_configuration_is_read_as_the_family_needs(family: str, fmt: str) -> None:
    files, params = loaded(family, fmt)
    config, layer = files.config, params.layers[0]
    assert files.architecture == (reference(family)["architecture"] if fmt == "hf" else
                                  {"qwen2": "qwen2", "qwen3": "qwen3"}.get(family, "llama"))
    assert (layer.bq is not None, layer.q_norm is not None) == (family == "qwen2", family == "qwen3")
    assert config.rope_scaling.kind == {"llama": "linear", "qwen2": "yarn"}.get(
        family, "llama3" if family == "llama3" and fmt == "hf" else "none")
    if (family, fmt) == ("llama3", "gguf"):
        assert config.rope_scaling.freq_factors is not None  # llama.cpp writes Llama 3's scaling as rope_freqs
    assert config.sliding_window == (8 if (family, fmt) == ("mistral", "hf") else None)
    assert files.tokenizer.eos_ids >= set(reference(family)["eos_token_ids"])


@pytest.mark.parametrize(("family", "fmt"), CASES)
def test_prompt_ids_and_chat_rendering_match_transformers(family: str, fmt: str) -> None:
    tokenizer = loaded(family, fmt)[0].tokenizer
    for case in reference(family)["cases"]:
        if case["messages"] is None:
            assert tokenizer.encode(case["text"]) == case["prompt_ids"], case["name"]
        else:
            assert tokenizer.render_chat(case["messages"], tools=case["tools"]) == case["rendered"], case["name"]
            assert tokenizer.encode_chat(case["messages"], tools=case["tools"]) == case["prompt_ids"], case["name"]


@pytest.mark.parametrize(("family", "fmt"), CASES)
def test_logits_and_greedy_tokens_match_the_reference(family: str, fmt: str) -> None:
    files, params = loaded(family, fmt)
    for case in reference(family)["cases"]:
        prompt, greedy = case["prompt_ids"], expected_greedy(family, fmt, case)
        tokens = prompt + greedy
        logits = np.asarray(forward(params, jnp.asarray(tokens + [0] * (PADDED - len(tokens))), config=files.config))
        assert np.argmax(logits[len(prompt) - 1:len(tokens) - 1], axis=-1).tolist() == greedy, case["name"]
        if (family, fmt) != ("mistral", "gguf"):
            np.testing.assert_allclose(logits[len(prompt) - 1], case["last_logits"], atol=LOGIT_TOLERANCE, rtol=0)
        else:  # the windowless file must not match the windowed reference: the window is what differs
            assert np.abs(logits[len(prompt) - 1] - np.asarray(case["last_logits"])).max() > 0.1


def request_for(case: dict[str, Any], index: int) -> Request:
    sampling = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=len(case["greedy_ids"]))
    if case["messages"] is not None:
        messages = tuple(ChatMessage(role=m["role"], content=m["content"]) for m in case["messages"])
        tools = [Tool(name=t["function"]["name"], description=t["function"]["description"],
                      parameters=json.dumps(t["function"]["parameters"])) for t in case["tools"] or ()]
        return Request(id=f"r{index}", model="m", messages=messages, tools=tools, sampling=sampling)
    return Request(id=f"r{index}", model="m", prompt=case["text"], sampling=sampling)


@pytest.mark.parametrize("dtype", ["bfloat16", "int8", pytest.param("q4_1", marks=pytest.mark.skipif(
    cpu_kernels_absent(), reason="the ggml kernel is not built here"))])
@pytest.mark.parametrize(("family", "fmt"), [("llama", "gguf"), ("llama", "hf"), ("qwen2", "gguf"), ("qwen2", "hf")])
def test_weights_held_as_they_are_read_are_the_float32_weights_cast(family: str, fmt: str, dtype: str) -> None:
    """Tensor by tensor (no float32 copy of the model first), untied and tied heads, with biases:
    the same arrays as the float32 weights cast whole."""
    files, float32 = loaded(family, fmt)
    held, expected = files.load_params(dtype=dtype), weight_formats.cast(float32, dtype)
    assert jax.tree.structure(held) == jax.tree.structure(expected)
    for got, want in zip(jax.tree.leaves(held), jax.tree.leaves(expected), strict=True):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.parametrize(("family", "fmt"), [("llama", "gguf"), ("qwen2", "hf")])
def test_a_probe_reads_the_first_layers_and_the_head_only(family: str, fmt: str) -> None:
    """``layers = 1`` (``auto`` times formats on such a probe): the embedding, norm, head and first
    layer of the whole load."""
    files, whole = loaded(family, fmt)
    done: list[tuple[int, int]] = []
    probe = files.load_params(lambda n, total: done.append((n, total)), layers=1)
    assert len(whole.layers) > 1 and len(probe.layers) == 1
    expected = attrs.evolve(whole, layers=whole.layers[:1])
    for got, want in zip(jax.tree.leaves(probe), jax.tree.leaves(expected), strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert done[-1] == (len(jax.tree.leaves(probe)),) * 2, "the progress counts the probe's tensors alone"


def test_only_a_gguf_of_q4_1_matrices_and_a_q8_0_head_is_stored_in_blocks() -> None:
    from lamina_jax.weights.gguf import smollm2_path

    assert not any(open_model(path_of(family, fmt)).in_blocks for family, fmt in CASES)
    try:
        smollm2 = smollm2_path()
    except FileNotFoundError as error:
        pytest.skip(str(error))
    assert open_model(smollm2).in_blocks


@pytest.mark.parametrize("devices", device_counts(1, 2, 4))
@pytest.mark.parametrize(("family", "fmt"), CASES)
def test_the_executor_serves_the_reference_tokens_batched(family: str, fmt: str, devices: int) -> None:
    """Every case at once, next to unrelated requests, with chunked prefill: the reference's tokens,
    on one device and split over two (attention by head) or four (attention whole on each)."""
    cases = reference(family)["cases"]
    noise = [Request(id=f"n{i}", model="m", prompt="Lorem ipsum dolor sit amet " * (i + 1),
                     sampling=SamplingParams(temperature=0.8, seed=i, max_tokens=12)) for i in range(3)]

    async def go() -> list[list[int]]:
        executor = JaxExecutor(JaxOptions(model=str(path_of(family, fmt)), weights_dtype="float32", max_batch=8,
                                          prefill_chunk=64, kv_cache_mb=4, max_model_len=512,
                                          tensor_parallel=devices))
        await executor.start()
        try:
            async def tokens(request: Request) -> list[int]:
                return [t async for chunk in executor.generate(request) for t in chunk.token_ids]

            results = await asyncio.gather(*(tokens(r) for r in [*map(request_for, cases, range(len(cases))), *noise]))
            for _ in range(100):  # the engine thread frees a finished sequence's blocks after its last chunk
                if executor.state().kv_blocks_used == 0:
                    break
                await asyncio.sleep(0.01)
            assert executor.state().kv_blocks_used == 0
            return results[:len(cases)]
        finally:
            await executor.stop()

    assert asyncio.run(go()) == [expected_greedy(family, fmt, case) for case in cases]


@pytest.mark.parametrize("kind", sorted(TOKENIZER_OF))
@pytest.mark.parametrize("fmt", FORMATS)
def test_tokenizer_ids_match_hugging_face_on_sharegpt_text(kind: str, fmt: str) -> None:
    """The GGUF's vocabulary, rebuilt, and the directory's tokenizer.json give transformers' ids."""
    parity = json.loads((MODELS / "tokenizers" / f"{kind}.json").read_text())
    tokenizer = loaded(TOKENIZER_OF[kind], fmt)[0].tokenizer
    mismatched = [s for s, ids in zip(parity["strings"], parity["ids"], strict=True)
                  if tokenizer.encode(s, add_special_tokens=False) != ids]
    assert not mismatched, f"{len(mismatched)} of {len(parity['strings'])} differ, e.g. {mismatched[:3]!r}"
    skip = set(parity.get("no_roundtrip", []))
    for i, s in enumerate(parity["strings"]):
        if i not in skip:
            assert tokenizer.decode(tokenizer.encode(s, add_special_tokens=False)) == s


@pytest.mark.parametrize("kind", sorted(TOKENIZER_OF))
def test_streaming_detokenization_is_utf8_safe_for_every_tokenizer_type(kind: str) -> None:
    """Token by token, the text never holds a broken character and adds up to the full decode."""
    parity = json.loads((MODELS / "tokenizers" / f"{kind}.json").read_text())
    tokenizer = loaded(TOKENIZER_OF[kind], "gguf")[0].tokenizer
    prompt = tokenizer.encode("Hi")
    for ids in parity["ids"][:150]:
        detokenizer = IncrementalDetokenizer(tokenizer, prompt)
        pieces = [detokenizer.add(token_id) for token_id in ids]
        # after a prompt, SentencePiece's leading "▁" of the first token is a real space
        expected = tokenizer.decode(prompt + ids)[len(tokenizer.decode(prompt)):]
        assert "".join(pieces) + detokenizer.flush() == expected
        assert not any("\ufffd" in piece for piece in pieces) or "\ufffd" in expected


def hf_copy(tmp_path: Path, family: str = "qwen2", **config: Any) -> Path:
    directory = tmp_path / family
    shutil.copytree(path_of(family, "hf"), directory)
    hf_config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps(hf_config | config))
    return directory


def test_an_unsupported_architecture_is_refused_before_the_weights_are_read(tmp_path: Path) -> None:
    directory = hf_copy(tmp_path, architectures=["GemmaForCausalLM"])
    (directory / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(ModelFileError, match=r"GemmaForCausalLM.*supported are LlamaForCausalLM, Mistral"):
        open_model(directory)


def test_a_model_file_error_names_the_file_and_the_field(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match=r"qwen2: config.json rope_scaling type 'dynamic' is not supported"):
        open_model(hf_copy(tmp_path, rope_scaling={"rope_type": "dynamic", "factor": 2.0}))
    directory = hf_copy(tmp_path / "b")
    (directory / "tokenizer.json").unlink()
    with pytest.raises(ModelFileError, match="no tokenizer.json"):
        open_model(directory)
    (tmp_path / "junk.gguf").write_bytes(b"GGUF but not really")
    with pytest.raises(ModelFileError, match="junk.gguf"):
        open_model(tmp_path / "junk.gguf")


def test_broken_weights_are_reported_with_the_tensor(tmp_path: Path) -> None:
    directory = hf_copy(tmp_path, hidden_size=48, head_dim=12)
    files = open_model(directory)
    with pytest.raises(ModelFileError, match=r"model.embed_tokens.weight' has shape \(528, 64\), expected \(528, 48\)"):
        files.load_params()


def test_hugging_face_special_tokens_and_end_ids() -> None:
    tokenizer = Tokenizer.from_hf(path_of("llama3", "hf"))
    assert tokenizer.token(tokenizer.bos_id) == "<|begin_of_text|>"
    assert {tokenizer.token(i) for i in tokenizer.eos_ids} == {"<|eot_id|>", "<|end_of_text|>"}


def test_a_model_without_a_chat_template_answers_400_until_the_option_gives_one(tmp_path: Path) -> None:
    directory = hf_copy(tmp_path, "qwen3")
    template = (directory / "chat_template.jinja").read_text()
    (directory / "chat_template.jinja").unlink()
    (tmp_path / "chatml.jinja").write_text(template)
    case = next(c for c in reference("qwen3")["cases"] if c["name"] == "chat")

    async def go(**options: Any) -> list[int]:
        executor = JaxExecutor(JaxOptions(model=str(directory), weights_dtype="float32", max_batch=2,
                                          prefill_chunk=64, kv_cache_mb=1, max_model_len=256, **options))
        await executor.start()
        try:
            return [t async for chunk in executor.generate(request_for(case, 0)) for t in chunk.token_ids]
        finally:
            await executor.stop()

    with pytest.raises(InvalidRequestError, match="has no chat template.*chat_template option") as refused:
        asyncio.run(go())
    assert refused.value.param == "messages"
    assert asyncio.run(go(chat_template=str(tmp_path / "chatml.jinja"))) == case["greedy_ids"]
    assert asyncio.run(go(chat_template=template)) == case["greedy_ids"]
