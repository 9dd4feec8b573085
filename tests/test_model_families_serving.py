"""The tiny models of every architecture (``plugins/lamina-jax/tests/data/models``) served for real:
through a stack with the radix prefix cache, and by ``lamina serve --model`` to the official
``openai`` client; a model that cannot be served stops ``lamina serve`` with the reason."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import tokenizers
from lamina_hookspecs.types import ChatMessage, Request, SamplingParams

from lamina.tools.bench.servers import free_port
from lamina.kernel.plugins import load_plugins
from lamina.kernel.stack import Stack
from lamina.kernel.stack_config import StackConfig

MODELS = Path(__file__).resolve().parents[1] / "plugins/lamina-jax/tests/data/models"
FORMAT_OF = {"llama": "hf", "llama3": "gguf", "mistral": "hf", "qwen2": "gguf", "qwen3": "hf"}
"""One format per family here (the plugin's tests take both): Mistral's GGUF has no window."""
SENTENCEPIECE = ("llama", "mistral")


def reference(family: str) -> dict[str, Any]:
    return json.loads((MODELS / family / "reference.json").read_text())


def model_path(family: str, fmt: str) -> Path:
    return MODELS / family / ("hf" if fmt == "hf" else "model.gguf")


def chat_request(case: dict[str, Any], rid: str) -> Request:
    return Request(id=rid, model="m", messages=tuple(ChatMessage(role=m["role"], content=m["content"])
                                                     for m in case["messages"]),
                   sampling=SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=len(case["greedy_ids"])))


@pytest.mark.parametrize("family", sorted(FORMAT_OF))
def test_the_prefix_cache_keeps_each_familys_reference_tokens(family: str) -> None:
    """The chat case twice, one after the other: the second reuses the first's cached prompt blocks
    and still gets transformers' greedy tokens."""
    case = next(c for c in reference(family)["cases"] if c["name"] == "chat")
    config = {"executor": {"use": "jax", "model": str(model_path(family, FORMAT_OF[family])), "block_size": 8,
                           "max_batch": 4, "prefill_chunk": 32, "max_model_len": 512, "kv_cache_mb": 2,
                           "weights_dtype": "float32"},
              "prefix_cache": {"use": "radix", "block_size": 8}}
    plugins = load_plugins()
    stack = Stack(StackConfig.from_dict(config, plugins.registry), plugins)
    executor = stack.backends["local"]

    async def go() -> list[tuple[list[int], int]]:
        await stack.start()
        try:
            results = []
            for rid in ("first", "second"):
                chunks = [chunk async for chunk in executor.generate(chat_request(case, rid))]
                results.append(([t for c in chunks for t in c.token_ids], chunks[-1].usage.cached_tokens))
            return results
        finally:
            await stack.stop()

    (first, cached_first), (second, cached_second) = asyncio.run(go())
    assert first == second == case["greedy_ids"]
    assert cached_first == 0 and cached_second >= len(case["prompt_ids"]) // 8 * 8 - 8


@pytest.mark.parametrize("fmt", ["hf", "gguf"])
@pytest.mark.parametrize("family", sorted(FORMAT_OF))
def test_the_openai_client_gets_each_fixtures_reference_text(live: Any, family: str, fmt: str) -> None:
    """Each fixture served over HTTP (float32 weights: ``auto`` could pick bfloat16 on another CPU);
    the completion's text is what transformers' own tokenizer decodes the reference tokens to."""
    server = live({"executor": {"use": "jax", "model": str(model_path(family, fmt)), "weights_dtype": "float32",
                                "served_name": "tiny", "max_batch": 4, "prefill_chunk": 64}})
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    decoder = tokenizers.Tokenizer.from_file(str(model_path(family, "hf") / "tokenizer.json"))
    for case in reference(family)["cases"]:
        if case["text"] is None:
            continue
        greedy = case["llama_cpp_greedy_ids" if (family, fmt) == ("mistral", "gguf") else "greedy_ids"]
        stream = client.completions.create(model="tiny", prompt=case["text"], temperature=0, stream=True,
                                           max_tokens=len(greedy), extra_body={"ignore_eos": True})
        events = [event.choices[0] for event in stream if event.choices]
        assert [t for e in events for t in (e.model_extra or {}).get("token_ids", [])] == greedy, case["name"]
        expected = decoder.decode(greedy, skip_special_tokens=True)
        # A random model emits invalid UTF-8. Byte-level BPE streams it as the full decode does; a
        # SentencePiece ByteFallback decoder turns every byte of an invalid run into U+FFFD, so a
        # window that starts inside the run (streaming) may keep a valid byte the full decode drops.
        if family not in SENTENCEPIECE or "\ufffd" not in expected:
            assert "".join(e.text for e in events) == expected, case["name"]


def serve(tmp_path: Path, *args: str) -> tuple[subprocess.Popen[bytes], Path]:
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "lamina.cli", "serve", *args],
                                   stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    return process, log


def test_lamina_serve_model_serves_a_hugging_face_directory_to_the_openai_client(tmp_path: Path) -> None:
    port = free_port()
    process, log = serve(tmp_path, "--model", str(model_path("llama", "hf")), "--served-model-name", "tiny-llama",
                         "--port", str(port))
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while True:
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            try:
                if httpx.get(f"{url}/ready").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        assert [m.id for m in client.models.list().data] == ["tiny-llama"]
        case = next(c for c in reference("llama")["cases"] if c["name"] == "plain")
        completion = client.completions.create(model="tiny-llama", prompt=case["text"], temperature=0,
                                               max_tokens=len(case["greedy_ids"]), extra_body={"ignore_eos": True})
        # transformers' tokenizer (tokenizer.json as it is) decodes the reference tokens to this text
        expected = tokenizers.Tokenizer.from_file(str(model_path("llama", "hf") / "tokenizer.json")).decode(
            case["greedy_ids"], skip_special_tokens=True)
        assert completion.choices[0].text == expected
        assert completion.usage.prompt_tokens == len(case["prompt_ids"])
        with pytest.raises(openai.BadRequestError) as refused:  # the Llama 2 template wants alternating roles
            client.chat.completions.create(model="tiny-llama", messages=[
                {"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
        assert "Conversation roles must alternate" in refused.value.body["message"]
        chat = client.chat.completions.create(model="tiny-llama", messages=[{"role": "user", "content": "Hi"}],
                                              max_tokens=4)
        assert chat.choices[0].finish_reason in ("stop", "length")
        check_tokenize(url, "tiny-llama", "llama")
    finally:
        process.terminate()
        process.wait(timeout=60)


def check_tokenize(url: str, model: str, family: str) -> None:
    """``/tokenize`` gives transformers' prompt ids for a text and for a chat; ``/detokenize`` gives back text."""
    cases = {c["name"]: c for c in reference(family)["cases"]}
    tokenized = httpx.post(f"{url}/tokenize", json={"model": model, "prompt": cases["plain"]["text"]}).json()
    assert tokenized["tokens"] == cases["plain"]["prompt_ids"] and tokenized["count"] == len(tokenized["tokens"])
    chat = httpx.post(f"{url}/tokenize", json={"model": model, "messages": cases["chat"]["messages"]}).json()
    assert chat["tokens"] == cases["chat"]["prompt_ids"]
    decoder = tokenizers.Tokenizer.from_file(str(model_path(family, "hf") / "tokenizer.json"))
    text = httpx.post(f"{url}/detokenize", json={"model": model, "tokens": chat["tokens"]}).json()["prompt"]
    assert text == decoder.decode(chat["tokens"], skip_special_tokens=False)
    out_of_range = httpx.post(f"{url}/detokenize", json={"model": model, "tokens": [10**9]})
    assert out_of_range.status_code == 400 and out_of_range.json()["error"]["param"] == "tokens"
    unknown = httpx.post(f"{url}/tokenize", json={"model": "nope", "prompt": "x"})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"


def test_lamina_serve_exits_non_zero_naming_the_reason_when_the_model_cannot_load(tmp_path: Path) -> None:
    directory = tmp_path / "gemma"
    shutil.copytree(model_path("qwen3", "hf"), directory)
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps(config | {"architectures": ["GemmaForCausalLM"]}))
    process, log = serve(tmp_path, "--model", str(directory), "--port", str(free_port()))
    try:
        assert process.wait(timeout=120) == 1
    finally:
        if process.poll() is None:
            process.kill()
    output = log.read_text()
    assert f"{directory}: config.json architectures ['GemmaForCausalLM'] is not supported" in output
