"""The default stack (SmolLM2-135M-Instruct on the JAX executor) behind the HTTP API, with the openai client."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

pytestmark = pytest.mark.slow

REFERENCE = json.loads((Path(__file__).resolve().parents[1] / "plugins/lamina-jax/tests/data/"
                        "smollm2_greedy_reference.json").read_text())


def test_openai_client_gets_the_reference_greedy_tokens_and_clients_that_leave_free_the_engine(live: Any) -> None:
    """One server for both checks (the model takes a minute to load): the reference greedy tokens, then
    non-streamed requests whose clients leave mid-answer hold nothing a second later."""
    server = live({})
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    prompt = REFERENCE["prompts"][0]
    stream = client.completions.create(model="smollm2-135m-instruct", prompt=prompt["prompt"], temperature=0,
                                       max_tokens=len(prompt["greedy_token_ids"]), stream=True,
                                       extra_body={"ignore_eos": True})
    ids = [t for event in stream if event.choices for t in (event.choices[0].model_extra or {}).get("token_ids", [])]
    assert ids == prompt["greedy_token_ids"]
    chat = client.chat.completions.create(model="smollm2-135m-instruct", temperature=0, max_tokens=20,
                                          messages=[{"role": "user", "content": "What is the capital of France?"}])
    assert "Paris" in chat.choices[0].message.content
    assert chat.usage.prompt_tokens > 20, "the chat template (with its default system prompt) was applied"

    leave_mid_answer(server)


def leave_mid_answer(server: Any) -> None:
    executor = server.stack.backends["local"]
    body = {"model": "smollm2-135m-instruct", "prompt": "Tell me a long story.", "max_tokens": 600,
            "ignore_eos": True, "temperature": 0}

    async def leave() -> int:
        async with httpx.AsyncClient(timeout=120) as client:
            posts = [asyncio.create_task(client.post(f"{server.url}/v1/completions", json=body)) for _ in range(8)]
            deadline = time.monotonic() + 60
            while executor.state().outstanding_requests < 8 or executor.engine.generated_tokens < 8 * 4:
                assert time.monotonic() < deadline, executor.state()
                await asyncio.sleep(0.01)
            busy = executor.state().kv_blocks_used
            for post in posts:
                post.cancel()
            await asyncio.gather(*posts, return_exceptions=True)
            return busy

    busy = asyncio.run(leave())
    left_at = time.monotonic()
    while (state := executor.state()).kv_blocks_used or state.outstanding_requests or state.queue_depth:
        assert time.monotonic() - left_at < 1.0, state
        time.sleep(0.02)
    assert busy > 0 and not executor.engine.scheduler.running and not executor.engine.scheduler.waiting
