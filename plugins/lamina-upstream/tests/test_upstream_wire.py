"""The upstream's wire formats without a server: request bodies per engine, server-sent events read
across blocks, stream events (Lamina's, vLLM's and llama-server's shapes, taken from their sources),
error responses and load figures."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import attrs
import orjson
import pytest
from lamina_hookspecs.errors import (
    BackendLostError, ConfigError, InternalError, InvalidRequestError, RateLimitError, ServiceUnavailableError,
)
from lamina_hookspecs.types import ChatMessage, Request, SamplingParams, StructuredOutput

from lamina_upstream.executor import MAX_LINE_BYTES, _Answer, _event_data, _http_error
from lamina_upstream.options import TEXT_ONLY, Engine, UpstreamOptions
from lamina_upstream.upstream_body import CHAT_PATH, COMPLETION_PATH, upstream_call
from lamina_upstream.upstream_load import load_from_metrics, load_from_slots
from lamina_upstream.upstream_stream import UpstreamStream
from lamina_upstream.upstream_tokens import answer, detokenize_body, template_body, tokenize_body


def _chat(**sampling: object) -> Request:
    return Request(id="r", model="m", messages=[ChatMessage(role="user", content="hi")],
                   sampling=SamplingParams(**sampling))


def test_bodies_ask_each_engine_for_token_ids_its_own_way() -> None:
    path, body = upstream_call(_chat(max_tokens=4, temperature=0.0), "up-model", "lamina")
    assert path == CHAT_PATH and body["model"] == "up-model" and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True} and body["max_tokens"] == 4
    assert "logprobs" not in body and "return_token_ids" not in body and "top_k" not in body
    _, vllm = upstream_call(_chat(top_k=5), "m", "vllm")
    assert vllm["return_token_ids"] is True and vllm["top_k"] == 5
    _, llama = upstream_call(_chat(), "m", "llama-server")
    assert (llama["logprobs"], llama["top_logprobs"], llama["top_k"], llama["min_p"]) == (True, 1, 0, 0.0)
    assert llama["post_sampling_probs"] is True
    _, greedy = upstream_call(_chat(temperature=0.0), "m", "llama-server")
    assert greedy["top_k"] == 1 and greedy["post_sampling_probs"] is True
    _, llama_wants = upstream_call(_chat(logprobs=True, top_logprobs=3, temperature=0.0), "m", "llama-server")
    assert llama_wants["top_logprobs"] == 3 and llama_wants["top_k"] == 0 and "post_sampling_probs" not in llama_wants


def test_completion_bodies_carry_text_or_token_prompts_and_every_sampling_field() -> None:
    sampling = SamplingParams(max_tokens=None, seed=7, stop=("\n",), stop_token_ids=(2,), ignore_eos=True,
                              logprobs=True, top_logprobs=0)
    path, body = upstream_call(Request(id="r", model="m", prompt_token_ids=[1, 2, 3], sampling=sampling,
                                       user="u1"), "m", "vllm")
    assert path == COMPLETION_PATH and body["prompt"] == [1, 2, 3] and "max_tokens" not in body
    assert (body["seed"], body["stop"], body["stop_token_ids"], body["ignore_eos"], body["user"]) == (
        7, ["\n"], [2], True, "u1")
    assert body["logprobs"] == 0
    _, text = upstream_call(Request(id="r", model="m", prompt="once"), "m", "llama-server")
    assert text["prompt"] == "once" and text["logprobs"] == 1
    with pytest.raises(InvalidRequestError) as refused:
        upstream_call(Request(id="r", model="m", prompt="x", sampling=SamplingParams(stop_token_ids=(2,))),
                      "m", "llama-server")
    assert refused.value.param == "stop_token_ids"


def test_sampling_controls_reach_each_engine_under_its_own_names() -> None:
    sampling = SamplingParams(presence_penalty=0.5, frequency_penalty=-0.25, repetition_penalty=1.3,
                              logit_bias=((7, -100.0), (9, 2.5)), min_p=0.1, min_tokens=4)
    request = Request(id="r", model="m", prompt="x", sampling=sampling)
    _, vllm = upstream_call(request, "m", "vllm")
    assert {k: vllm[k] for k in ("presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias",
                                 "min_p", "min_tokens")} == {
        "presence_penalty": 0.5, "frequency_penalty": -0.25, "repetition_penalty": 1.3,
        "logit_bias": {"7": -100.0, "9": 2.5}, "min_p": 0.1, "min_tokens": 4}
    with pytest.raises(InvalidRequestError) as refused:
        upstream_call(request, "m", "llama-server")
    assert refused.value.param == "min_tokens"
    _, llama = upstream_call(attrs.evolve(request, sampling=attrs.evolve(sampling, min_tokens=0)), "m",
                             "llama-server")
    assert (llama["repeat_penalty"], llama["repeat_last_n"], llama["min_p"], llama["logit_bias"]) == (
        1.3, -1, 0.1, {"7": -100.0, "9": 2.5})
    assert "repetition_penalty" not in llama and "min_tokens" not in llama
    _, plain = upstream_call(Request(id="r", model="m", prompt="x"), "m", "vllm")
    assert not {"presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias", "min_p",
                "min_tokens"} & set(plain)


def test_structured_output_reaches_each_engine_under_its_own_names() -> None:
    def body(structured: StructuredOutput, engine: str) -> dict:
        request = Request(id="r", model="m", messages=[ChatMessage(role="user", content="x")],
                          sampling=SamplingParams(structured=structured))
        return upstream_call(request, "m", engine)[1]

    schema = StructuredOutput(kind="json", spec='{"type": "object"}', param="response_format")
    choice = StructuredOutput(kind="choice", choices=("a", "b"), param="guided_choice")
    gbnf = StructuredOutput(kind="grammar", spec='root ::= "a"')
    lark = StructuredOutput(kind="grammar", spec='start: "a"')
    for engine in ("vllm", "lamina"):
        assert body(schema, engine)["structured_outputs"] == {"json": {"type": "object"}}
        assert body(choice, engine)["structured_outputs"] == {"choice": ["a", "b"]}
        assert body(StructuredOutput(kind="json_object"), engine)["structured_outputs"] == {"json_object": True}
        assert body(lark, engine)["structured_outputs"] == {"grammar": 'start: "a"'}
    assert body(schema, "llama-server")["json_schema"] == {"type": "object"}
    assert body(StructuredOutput(kind="json_object"), "llama-server")["json_schema"] == {"type": "object"}
    assert body(gbnf, "llama-server")["grammar"] == 'root ::= "a"'
    for unsupported in (choice, lark, StructuredOutput(kind="regex", spec="a+", param="guided_regex")):
        with pytest.raises(InvalidRequestError) as refused:
            body(unsupported, "llama-server")
        assert refused.value.param == unsupported.param


def _llama_entry(token_id: int, text: str, logprob: float) -> dict[str, object]:
    return {"id": token_id, "token": text, "logprob": logprob, "bytes": list(text.encode()),
            "top_logprobs": [{"id": token_id, "token": text, "logprob": logprob, "bytes": []}]}


def test_llama_server_chat_events_give_ids_from_logprobs_and_text_held_back_arrives_later() -> None:
    stream = UpstreamStream("r", chat=True, logprobs=False, prompt_tokens=10)
    assert stream.event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": None}}]}) is None
    first = stream.event({"choices": [{"index": 0, "finish_reason": None, "delta": {"content": "Hello"},
                                       "logprobs": {"content": [_llama_entry(9906, "Hello", -0.1)]}}]})
    assert first is not None and first.token_ids == (9906,) and first.text == "Hello" and first.index == 0
    assert first.logprobs is None  # the client did not ask: requested only for the ids
    late = stream.event({"choices": [{"index": 0, "delta": {"content": " wo"}}]})  # held-back text, no logprobs
    assert late is not None and late.token_ids == () and late.text == " wo" and late.index == 1
    stream.event({"choices": [{"index": 0, "finish_reason": "stop", "delta": {}}]})
    stream.event({"choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}})
    final = stream.final()
    assert final.finish_reason == "stop" and final.index == 1
    assert (final.usage.prompt_tokens, final.usage.completion_tokens) == (12, 3)


def test_post_sampling_probabilities_give_ids_and_no_logprobs() -> None:
    stream = UpstreamStream("r", chat=True, logprobs=True, prompt_tokens=1)
    chunk = stream.event({"choices": [{"delta": {"content": "Hi"}, "logprobs": {"content": [
        {"id": 5, "token": "Hi", "prob": 1.0, "bytes": [72, 105], "top_probs": [{"id": 5, "token": "Hi", "prob": 1.0}]}]}}]})
    assert chunk.token_ids == (5,) and chunk.logprobs is None and chunk.top_logprobs is None


def test_logprobs_pass_on_in_both_formats_when_asked() -> None:
    chat = UpstreamStream("r", chat=True, logprobs=True, prompt_tokens=1)
    chunk = chat.event({"choices": [{"delta": {"content": "Hi"},
                                     "logprobs": {"content": [_llama_entry(5, "Hi", -0.5)]}}]})
    assert chunk.logprobs == (-0.5,) and chunk.top_logprobs[0][0].token_id == 5
    legacy = UpstreamStream("r", chat=False, logprobs=True, prompt_tokens=1)
    chunk = legacy.event({"choices": [{"text": " a b", "token_ids": [10, 11], "top_token_ids": [[10, 3], [11, 4]],
                                       "logprobs": {"tokens": [" a", " b"], "token_logprobs": [-1.0, -2.0],
                                                    "top_logprobs": [{" a": -1.0, " c": -3.0}, {" b": -2.0}]}}]})
    assert chunk.token_ids == (10, 11) and chunk.logprobs == (-1.0, -2.0)
    assert [(a.token_id, a.text) for a in chunk.top_logprobs[0]] == [(10, " a"), (3, " c")]
    assert legacy.emitted == 2


def test_a_stream_without_usage_estimates_the_prompt_and_counts_its_own_tokens() -> None:
    stream = UpstreamStream("r", chat=False, logprobs=False, prompt_tokens=10)
    stream.event({"choices": [{"text": "x", "token_ids": [1]}]})
    stream.event({"choices": [{"text": "", "finish_reason": "tool_calls"}]})
    final = stream.final()
    assert final.finish_reason == "stop"
    assert (final.usage.prompt_tokens, final.usage.completion_tokens) == (10, 1)


@pytest.mark.parametrize("engine", sorted(TEXT_ONLY))
def test_a_text_only_upstream_is_asked_for_text_and_refuses_what_needs_ids_or_a_nonstandard_constraint(
        engine: Engine) -> None:
    _, body = upstream_call(_chat(temperature=0.0, top_k=5), "m", engine)
    assert not {"return_token_ids", "post_sampling_probs", "logprobs", "top_logprobs"} & set(body)
    assert body["top_k"] == 5 and body["stream_options"] == {"include_usage": True}
    with pytest.raises(InvalidRequestError) as refused:
        upstream_call(_chat(logprobs=True, top_logprobs=2), "m", engine)
    assert refused.value.param == "logprobs" and engine in refused.value.message
    schema = '{"type": "object", "properties": {"a": {"type": "integer"}}}'
    _, structured = upstream_call(_chat(structured=StructuredOutput(kind="json", spec=schema)), "m", engine)
    assert structured["response_format"] == {"type": "json_schema", "json_schema": {
        "name": "response", "schema": {"type": "object", "properties": {"a": {"type": "integer"}}}, "strict": True}}
    assert "structured_outputs" not in structured
    _, any_object = upstream_call(_chat(structured=StructuredOutput(kind="json_object", spec="")), "m", engine)
    assert any_object["response_format"] == {"type": "json_object"}
    with pytest.raises(InvalidRequestError) as regex:
        upstream_call(_chat(structured=StructuredOutput(kind="regex", spec="a+", param="structured_outputs.regex")),
                      "m", engine)
    assert regex.value.param == "structured_outputs.regex"


def test_a_text_only_stream_counts_one_token_per_event_where_the_upstream_reports_no_usage() -> None:
    stream = UpstreamStream("r", chat=True, logprobs=False, prompt_tokens=6, text_only=True)
    chunks = [stream.event({"choices": [{"delta": {"content": text}}]}) for text in ("Hel", "lo", " there")]
    assert [(c.index, c.token_ids, c.text) for c in chunks] == [(0, (), "Hel"), (1, (), "lo"), (2, (), " there")]
    assert all(c.has_output for c in chunks)
    stream.event({"choices": [{"delta": {}, "finish_reason": "length"}]})
    assert (stream.final().usage.prompt_tokens, stream.final().usage.completion_tokens) == (6, 3)
    stream.event({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 4}})
    assert (stream.final().usage.prompt_tokens, stream.final().usage.completion_tokens) == (9, 4), "its usage wins"


def test_stream_errors_and_cut_streams_are_lamina_errors() -> None:
    stream = UpstreamStream("r", chat=False, logprobs=False, prompt_tokens=1)
    with pytest.raises(ServiceUnavailableError) as busy:
        stream.event({"error": {"message": "too slow", "type": "service_unavailable", "code": "slow_client"}})
    assert busy.value.code == "slow_client" and "too slow" in busy.value.message
    with pytest.raises(InternalError):
        stream.event({"error": "boom"})
    with pytest.raises(ServiceUnavailableError, match="without a finish reason"):
        stream.final()


def _response(status: int, body: object, retry_after: str | None = None) -> _Answer:
    return _Answer(status, orjson.dumps(body), retry_after)


def test_http_errors_keep_their_class_message_and_retry_hint() -> None:
    bad = _http_error(_response(400, {"error": {"message": "max_tokens is too big", "param": "max_tokens",
                                                "code": "context_length_exceeded"}}), "u")
    assert type(bad) is InvalidRequestError and bad.message == "max_tokens is too big"
    assert (bad.param, bad.code) == ("max_tokens", "context_length_exceeded")
    limited = _http_error(_response(429, {"error": {"message": "slow down"}}, "3"), "u")
    assert isinstance(limited, RateLimitError) and limited.retry_after == 3.0
    assert isinstance(_http_error(_response(503, {"error": {"message": "loading"}}), "u"), BackendLostError)
    busy = _http_error(_response(503, {"error": {"message": "overloaded", "code": "overloaded"}}, "7"), "u")
    assert isinstance(busy, BackendLostError) and (busy.code, busy.retry_after) == ("overloaded", 7.0)
    assert isinstance(_http_error(_Answer(500, b"oops", None), "u"), BackendLostError)
    denied = _http_error(_response(401, {"error": {"message": "bad key"}}), "u")
    assert isinstance(denied, InternalError) and "credentials" in denied.message


VLLM_METRICS = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 4.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
"""
LLAMA_METRICS = """# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 2
# HELP llamacpp:requests_deferred Number of requests deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 1
"""


def test_load_is_read_from_each_engines_metrics_or_slots() -> None:
    vllm = load_from_metrics(VLLM_METRICS, "vllm")
    assert (vllm.running, vllm.waiting, vllm.kv_usage) == (5, 4, 0.25)
    llama = load_from_metrics(LLAMA_METRICS, "llama-server")
    assert (llama.running, llama.waiting, llama.kv_usage) == (2, 1, None)
    assert load_from_slots([{"id": 0, "is_processing": True}, {"id": 1, "is_processing": False}]).running == 1


def test_options_refuse_a_url_that_is_not_http() -> None:
    with pytest.raises(ValueError, match="http"):
        UpstreamOptions(url="127.0.0.1:8080")
    assert UpstreamOptions(url="http://h:1/").url == "http://h:1"


def test_backends_entries_take_an_address_or_an_executor() -> None:
    from lamina.kernel.plugins import load_plugins
    from lamina.kernel.stack_config import StackConfig

    registry = load_plugins().registry
    pool = StackConfig.from_dict({"backends": [
        {"name": "llama", "executor": {"use": "openai-upstream", "url": "http://127.0.0.1:8080"}},
        {"name": "worker", "address": "127.0.0.1:50051"}]}, registry)
    assert pool.backends[0].executor.name == "openai-upstream" and pool.backends[1].address == "127.0.0.1:50051"
    assert pool.describe()["backends"][0]["executor"]["options"]["url"] == "http://127.0.0.1:8080"
    with pytest.raises(ConfigError, match=r"backends\[0\]: give a backend an address or an executor"):
        StackConfig.from_dict({"backends": [{"name": "b", "address": "h:1", "executor": {"use": "echo"}}]}, registry)
    with pytest.raises(ConfigError, match=r"backends\[0\]\.address: missing"):
        StackConfig.from_dict({"backends": [{"name": "b"}]}, registry)
    with pytest.raises(ConfigError, match=r"backends\[0\]\.executor\.url: missing"):
        StackConfig.from_dict({"backends": [{"name": "b", "executor": {"use": "openai-upstream"}}]}, registry)


def test_tokenize_bodies_follow_each_engine() -> None:
    chat, text = _chat(), Request(id="r", model="m", prompt="once")
    assert tokenize_body(chat, "up", "vllm", add_special_tokens=False, add_generation_prompt=True) == {
        "model": "up", "add_special_tokens": False, "messages": [{"role": "user", "content": "hi"}],
        "add_generation_prompt": True}
    assert tokenize_body(text, "up", "lamina", add_special_tokens=True, add_generation_prompt=True) == {
        "model": "up", "add_special_tokens": True, "prompt": "once"}
    assert tokenize_body(text, "up", "llama-server", add_special_tokens=False, add_generation_prompt=True) == {
        "content": "once", "add_special": False}
    assert template_body(chat, False) == {"messages": [{"role": "user", "content": "hi"}],
                                          "add_generation_prompt": False}
    assert tokenize_body(chat, "up", "llama-server", add_special_tokens=False, add_generation_prompt=True,
                         rendered="<|im_start|>user\nhi") == {"content": "<|im_start|>user\nhi", "add_special": True}
    assert detokenize_body((1, 2), "up", "llama-server") == {"tokens": [1, 2]}
    assert detokenize_body([1, 2], "up", "vllm") == {"model": "up", "tokens": [1, 2]}
    assert answer({"tokens": [1, 2]}, "tokens", list, "u") == [1, 2]
    for payload in ({}, {"tokens": "12"}, {"tokens": [1, "2"]}):
        with pytest.raises(BackendLostError):
            answer(payload, "tokens", list, "u")


async def _body(*blocks: bytes) -> AsyncIterator[bytes]:
    """A response body that arrives in the given blocks."""
    for block in blocks:
        yield block


def _events(*blocks: bytes) -> list[bytes]:
    async def collect() -> list[bytes]:
        return [data async for data in _event_data(_body(*blocks))]
    return asyncio.run(collect())


def test_events_are_read_across_blocks_with_either_line_end() -> None:
    assert _events(b'data: {"a": 1}\r\n\r\nda', b"ta: [DO", b"NE]\n\n") == [b'{"a": 1}', b"[DONE]"]
    assert _events(b"event: x\ndata: one\ndata:two\n\n: comment\n\ndata: end") == [b"one\ntwo", b"end"]
    assert _events(b"data: a\r", b"\ndata: b\r\n\r\n") == [b"a\nb"]


def test_a_stream_line_past_the_limit_is_a_lost_backend() -> None:
    long = b"data: " + b"x" * MAX_LINE_BYTES
    with pytest.raises(BackendLostError, match="stream line"):
        _events(long[:1000], long[1000:])
    with pytest.raises(BackendLostError, match="stream line"):
        _events(long + b"\n\n")
