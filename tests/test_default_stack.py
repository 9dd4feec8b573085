"""The default stack (SmolLM2-135M-Instruct on the JAX executor) behind the HTTP API, with the openai client."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai
import pytest
from lamina.testing.abandon import leave_mid_answer, wait_until_idle

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
    paris = prompt["greedy_token_ids"][0]  # the sampling controls reach the real model through the client
    forced = client.completions.create(model="smollm2-135m-instruct", prompt=prompt["prompt"], max_tokens=3,
                                       temperature=0.7, seed=1, logit_bias={"1234": 100}, stream=True)
    assert [t for e in forced if e.choices for t in (e.choices[0].model_extra or {}).get("token_ids", [])] == [1234] * 3
    banned = client.completions.create(model="smollm2-135m-instruct", prompt=prompt["prompt"], max_tokens=1,
                                       temperature=0, logit_bias={str(paris): -100}, stream=True,
                                       extra_body={"repetition_penalty": 1.1, "min_p": 0.05})
    assert paris not in [t for e in banned if e.choices for t in (e.choices[0].model_extra or {}).get("token_ids", [])]

    clients_leave_mid_answer(server)


def clients_leave_mid_answer(server: Any) -> None:
    executor = server.stack.backends["local"]
    body = {"model": "smollm2-135m-instruct", "prompt": "Tell me a long story.", "max_tokens": 600,
            "ignore_eos": True, "temperature": 0}
    busy = leave_mid_answer(server.url, executor, body, clients=8)
    wait_until_idle(executor, within_s=1.0)
    assert busy > 0 and not executor.engine.scheduler.running and not executor.engine.scheduler.waiting
