"""The default stack (SmolLM2-135M-Instruct on the JAX executor) behind the HTTP API, with the openai client."""

from __future__ import annotations

import enum
import json
import re
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pydantic
import pytest
from lamina.testing.abandon import leave_mid_answer, wait_until_idle
from lamina_jax.testing import device_counts

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

    ids = httpx.post(f"{server.url}/tokenize", json={"model": "smollm2-135m-instruct", "prompt": prompt["prompt"]}
                     ).json()["tokens"]
    echoed = client.completions.create(model="smollm2-135m-instruct", prompt=ids, echo=True, max_tokens=2,
                                       temperature=0)
    assert echoed.choices[0].text.startswith(prompt["prompt"]) and len(echoed.choices[0].text) > len(prompt["prompt"])

    structured_outputs_through_the_client(client)
    tool_calls_through_the_client(client)
    choices_through_the_client(client)
    clients_leave_mid_answer(server)


@pytest.mark.parametrize("devices", device_counts(4))
def test_split_over_four_devices_the_openai_client_gets_what_one_device_gives(live: Any, devices: int) -> None:
    """The real model split over four devices behind the HTTP API: the reference greedy tokens
    streamed, a chat answer, and clients that leave mid-answer free the engine."""
    server = live({"executor": {"use": "jax", "tensor_parallel": devices, "weights_dtype": "float32",
                                "max_batch": 8, "prefill_chunk": 64}})
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    for prompt in REFERENCE["prompts"][:2]:
        stream = client.completions.create(model="smollm2-135m-instruct", prompt=prompt["prompt"], temperature=0,
                                           max_tokens=len(prompt["greedy_token_ids"]), stream=True,
                                           extra_body={"ignore_eos": True})
        assert [t for e in stream if e.choices
                for t in (e.choices[0].model_extra or {}).get("token_ids", [])] == prompt["greedy_token_ids"]
    chat = client.chat.completions.create(model="smollm2-135m-instruct", temperature=0, max_tokens=20,
                                          messages=[{"role": "user", "content": "What is the capital of France?"}])
    assert "Paris" in chat.choices[0].message.content
    clients_leave_mid_answer(server)


class Kind(enum.Enum):
    capital = "capital"
    port = "port"
    other = "other"


class City(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=30)
    kind: Kind
    rivers: list[str] = pydantic.Field(max_length=2)


class Cities(pydantic.BaseModel):
    country: str = pydantic.Field(max_length=30)
    cities: list[City] = pydantic.Field(min_length=1, max_length=3)


def choices_through_the_client(client: openai.OpenAI) -> None:
    """``n`` with a seed: different choices, the same ones again for the same request, and choice ``i``
    whatever ``n`` is (streamed or not); the prompt counted once."""
    ask = dict(model="smollm2-135m-instruct", messages=[{"role": "user", "content": "Name a fruit."}],
               temperature=1.0, seed=11, max_tokens=12, extra_body={"ignore_eos": True})
    three = client.chat.completions.create(n=3, **ask)
    texts = [c.message.content for c in three.choices]
    assert [c.index for c in three.choices] == [0, 1, 2] and len(set(texts)) > 1, texts
    assert [c.message.content for c in client.chat.completions.create(n=3, **ask).choices] == texts
    one = client.chat.completions.create(n=1, **ask)
    assert one.choices[0].message.content == texts[0] and three.usage.prompt_tokens == one.usage.prompt_tokens
    assert (three.usage.completion_tokens, one.usage.completion_tokens) == (3 * 12, 12)
    streamed = ["", ""]
    for event in client.chat.completions.create(n=2, stream=True, **ask):
        for choice in event.choices:
            streamed[choice.index] += choice.delta.content or ""
    assert streamed == texts[:2]


def structured_outputs_through_the_client(client: openai.OpenAI) -> None:
    """The official client's ``parse`` and ``stream`` helpers get their Pydantic model (nested objects,
    an enum, arrays) from the real model; a regex and a choice hold; a bad schema is a 400 naming it."""
    model, messages = "smollm2-135m-instruct", [{"role": "user", "content": "List two cities of France as JSON."}]
    for temperature in (0.0, 0.8):
        parsed = client.chat.completions.parse(model=model, messages=messages, response_format=Cities,
                                               temperature=temperature, seed=3, max_tokens=300)
        assert isinstance(parsed.choices[0].message.parsed, Cities), parsed.choices[0].message.content
    with client.chat.completions.stream(model=model, messages=messages, response_format=Cities, temperature=0,
                                        max_tokens=300) as stream:
        assert isinstance(stream.get_final_completion().choices[0].message.parsed, Cities)
    phone = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "A phone number?"}],
                                           temperature=0.8, seed=5, extra_body={"guided_regex": r"0[1-9]( [0-9]{2}){4}"})
    assert re.fullmatch(r"0[1-9]( [0-9]{2}){4}", phone.choices[0].message.content)
    choice = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Is Paris in France?"}],
                                            temperature=0, extra_body={"structured_outputs": {"choice": ["yes", "no"]}})
    assert choice.choices[0].message.content in ("yes", "no") and choice.choices[0].finish_reason == "stop"
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=model, messages=messages, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "no such type"}}})
    assert refused.value.body["param"] == "response_format"


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object", "required": ["city", "unit"], "properties": {
        "city": {"type": "string", "maxLength": 40}, "unit": {"enum": ["celsius", "fahrenheit"]}}}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The local time in a city.",
    "parameters": {"type": "object", "required": ["city"], "properties": {"city": {"type": "string", "maxLength": 40}}}}}


def tool_calls_through_the_client(client: openai.OpenAI) -> None:
    """With ``tool_choice`` ``required`` or a named function, the real model's reply is calls of the
    offered tools whose arguments hold against the tool's schema, streamed or not."""
    model, messages = "smollm2-135m-instruct", [{"role": "user", "content": "What is the weather in Paris?"}]
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}

    def valid_calls(choice: Any, names: set[str]) -> None:
        assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
        for call in choice.message.tool_calls:
            assert call.function.name in names and call.id.startswith("call_")
            jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])

    for temperature in (0.0, 0.8):
        reply = client.chat.completions.create(model=model, messages=messages, tools=[WEATHER, TIME], seed=2,
                                               tool_choice="required", temperature=temperature, max_tokens=150)
        valid_calls(reply.choices[0], {"get_weather", "get_time"})
    named = client.chat.completions.create(model=model, messages=messages, tools=[WEATHER, TIME], temperature=0,
                                           tool_choice={"type": "function", "function": {"name": "get_time"}})
    valid_calls(named.choices[0], {"get_time"})
    with client.chat.completions.stream(model=model, messages=messages, tools=[WEATHER, TIME], temperature=0,
                                        tool_choice="required", max_tokens=150) as stream:
        valid_calls(stream.get_final_completion().choices[0], {"get_weather", "get_time"})


def clients_leave_mid_answer(server: Any) -> None:
    executor = server.stack.backends["local"]
    body = {"model": "smollm2-135m-instruct", "prompt": "Tell me a long story.", "max_tokens": 600,
            "ignore_eos": True, "temperature": 0}
    busy = leave_mid_answer(server.url, executor, body, clients=8)
    wait_until_idle(executor, within_s=1.0)
    assert busy > 0 and not executor.engine.scheduler.running and not executor.engine.scheduler.waiting
