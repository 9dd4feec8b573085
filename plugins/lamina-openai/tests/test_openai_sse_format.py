"""The exact bytes the encoder writes, and what the decoder accepts and rejects."""

from __future__ import annotations

import re
from collections.abc import Callable

import attrs
import orjson
import pytest

from lamina_hookspecs.errors import CodecError
from lamina_hookspecs.types import StreamError, StreamMeta, TokenChunk, TopLogprob, Usage
from lamina_openai.codec import OpenAISseCodec, SseDecoder, SseEncoder

CHAT_META = StreamMeta(request_id="chatcmpl-1", model="m", created=1_700_000_000, kind="chat")
COMPLETION_META = StreamMeta(request_id="cmpl-1", model="m", created=1_700_000_000, kind="completion")
Encode = Callable[[SseEncoder, list[object]], bytes]


def decode(data: bytes, step: int | None = None, **kw: int) -> list[object]:
    decoder = SseDecoder(**kw)
    step = step or len(data) or 1
    items = [item for start in range(0, len(data), step) for item in decoder.feed(data[start:start + step])]
    decoder.close()
    return items


CHAT = '{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"m","choices":'
CHAT_SSE = (
    f'data: {CHAT}[{{"index":0,"delta":{{"role":"assistant","content":"Hi"}},"logprobs":null,'
    '"finish_reason":null,"token_ids":[17]}],"usage":null}\n\n'
    f'data: {CHAT}[{{"index":0,"delta":{{"content":" there"}},"logprobs":{{"content":[{{"token":" there",'
    '"logprob":-0.5,"bytes":[32,116,104,101,114,101],"top_logprobs":[{"token":" there","logprob":-0.5,'
    '"bytes":[32,116,104,101,114,101]},{"token":" you","logprob":-1.25,"bytes":[32,121,111,117]}]}]},'
    '"finish_reason":null,"token_ids":[18],"top_token_ids":[[18,19]]}],"usage":null}\n\n'
    f'data: {CHAT}[{{"index":0,"delta":{{}},"logprobs":null,"finish_reason":"length"}}],"usage":null}}\n\n'
    f'data: {CHAT}[],"usage":{{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7,'
    '"prompt_tokens_details":{"cached_tokens":3}}}\n\n'
    'data: [DONE]\n\n'
).encode()

COMPLETION = '{"id":"cmpl-1","object":"text_completion","created":1700000000,"model":"m","choices":'
COMPLETION_SSE = (
    f'data: {COMPLETION}[{{"index":0,"text":"Hello","logprobs":{{"tokens":["Hello"],"token_logprobs":[-0.25],'
    '"top_logprobs":[{"Hello":-0.25,"Hi":-2.0}],"text_offset":[0]},"finish_reason":null,'
    '"token_ids":[1],"top_token_ids":[[1,2]]}]}\n\n'
    f'data: {COMPLETION}[{{"index":0,"text":" world","logprobs":{{"tokens":[" world",""],'
    '"token_logprobs":[-1.0,-0.5],"top_logprobs":null,"text_offset":[5,11]},"finish_reason":null,'
    '"token_ids":[2,3]}]}\n\n'
    f'data: {COMPLETION}[{{"index":0,"text":"!","logprobs":null,"finish_reason":null,"token_ids":[4]}}]}}\n\n'
    f'data: {COMPLETION}[{{"index":0,"text":"","logprobs":null,"finish_reason":"stop"}}]}}\n\n'
    'data: [DONE]\n\n'
).encode()


def test_chat_stream_bytes_with_usage(chat_items: list[object], encode: Encode) -> None:
    assert encode(OpenAISseCodec(include_usage=True).encoder(), chat_items) == CHAT_SSE


def test_completion_stream_bytes_without_usage(completion_items: list[object], encode: Encode) -> None:
    assert encode(OpenAISseCodec().encoder(), completion_items) == COMPLETION_SSE


def test_the_clients_choice_in_the_stream_meta_overrides_codec_default(chat_items: list[object],
                                                                        encode: Encode) -> None:
    meta, *rest = chat_items
    asks, declines = attrs.evolve(meta, include_usage=True), attrs.evolve(meta, include_usage=False)
    assert encode(OpenAISseCodec(include_usage=False).encoder(), [asks, *rest]) == CHAT_SSE
    assert b'"usage"' not in encode(OpenAISseCodec(include_usage=True).encoder(), [declines, *rest])


def test_error_bytes() -> None:
    encoder = OpenAISseCodec().encoder()
    encoder.header(CHAT_META)
    assert encoder.error(StreamError(message="backend died", type="server_error", code="oops")) == (
        b'data: {"error":{"message":"backend died","type":"server_error","param":null,"code":"oops"}}\n\n'
        b'data: [DONE]\n\n'
    )


def test_empty_chat_generation_still_sends_the_role() -> None:
    encoder = OpenAISseCodec().encoder()
    encoder.header(CHAT_META)
    out = encoder.chunk(TokenChunk(request_id="chatcmpl-1", index=0, finish_reason="stop"))
    assert out == (
        f'data: {CHAT}[{{"index":0,"delta":{{"role":"assistant","content":""}},"logprobs":null,'
        '"finish_reason":null}]}\n\n'
        f'data: {CHAT}[{{"index":0,"delta":{{}},"logprobs":null,"finish_reason":"stop"}}]}}\n\n'
        'data: [DONE]\n\n'
    ).encode()


def test_chunk_before_header_is_a_codec_error() -> None:
    with pytest.raises(CodecError, match="before header"):
        OpenAISseCodec().encoder().chunk(TokenChunk(request_id="r", index=0, text="x"))


def test_decodes_chat_stream_with_ids_and_usage(chat_items: list[object]) -> None:
    items = decode(CHAT_SSE)
    assert items == chat_items


def test_several_choices_round_trip(choices_items: list[object], encode: Encode) -> None:
    body = encode(OpenAISseCodec(include_usage=True).encoder(), choices_items)
    events = [orjson.loads(e.removeprefix(b"data: ")) for e in body.split(b"\n\n")[:-2]]
    assert [(c["index"], c["finish_reason"]) for e in events for c in e["choices"]] == [
        (0, None), (1, None), (1, None), (1, "stop"), (0, None), (0, "length")]
    assert [c["delta"].get("role") for e in events[:2] for c in e["choices"]] == ["assistant", "assistant"]
    assert body.count(b"[DONE]") == 1 and events[-1]["usage"]["completion_tokens"] == 4
    decoder = OpenAISseCodec().decoder()
    decoded = decoder.feed(body)
    decoder.close()
    assert decoded[0] == attrs.evolve(choices_items[0], include_usage=None, choices=1)  # n is not on the wire
    # a final chunk with tokens decodes as two: its tokens, then its finish
    split = [*choices_items[1:3], attrs.evolve(choices_items[3], finish_reason=None, more=False),
             attrs.evolve(choices_items[3], index=2, token_ids=(), text="", finish_reason="stop"),
             *choices_items[4:]]
    assert decoded[1:] == split


def test_decodes_completion_stream() -> None:
    meta, first, second, bang, final = decode(COMPLETION_SSE)
    assert meta == COMPLETION_META
    assert first.top_logprobs == ((TopLogprob(token_id=1, text="Hello", logprob=-0.25),
                                   TopLogprob(token_id=2, text="Hi", logprob=-2.0)),)
    assert (second.index, second.token_ids, second.logprobs, second.top_logprobs) == (1, (2, 3), (-1.0, -0.5), None)
    assert (bang.text, bang.index, bang.finish_reason) == ("!", 3, None)
    assert (final.text, final.index, final.finish_reason, final.usage) == ("", 4, "stop", None)


@pytest.mark.parametrize("step", [1, 2, 5, 13])
def test_decodes_any_split(step: int) -> None:
    assert decode(CHAT_SSE, step) == decode(CHAT_SSE)
    assert decode(COMPLETION_SSE, step) == decode(COMPLETION_SSE)


def test_decodes_errors(chat_items: list[object], encode: Encode) -> None:
    encoder = OpenAISseCodec().encoder()
    data = encode(encoder, [*chat_items[:2], StreamError(message="gone", type="timeout_error", code=None)])
    assert decode(data)[-1] == StreamError(message="gone", type="timeout_error", code=None)


# A stream as api.openai.com writes it: no token ids, a role-only first chunk, extra fields.
OPENAI_STREAM = (
    b'data: {"id":"chatcmpl-9","object":"chat.completion.chunk","created":1,"model":"gpt-4o-mini",'
    b'"system_fingerprint":"fp_1","choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null},'
    b'"logprobs":null,"finish_reason":null}],"usage":null}\n\n'
    b'data: {"id":"chatcmpl-9","object":"chat.completion.chunk","created":1,"model":"gpt-4o-mini",'
    b'"system_fingerprint":"fp_1","choices":[{"index":0,"delta":{"content":"Hi"},"logprobs":{"content":'
    b'[{"token":"Hi","logprob":-0.1,"bytes":[72,105],"top_logprobs":[{"token":"Hi","logprob":-0.1,"bytes":[72,105]}]}],'
    b'"refusal":null},"finish_reason":null}],"usage":null}\n\n'
    b'data: {"id":"chatcmpl-9","object":"chat.completion.chunk","created":1,"model":"gpt-4o-mini",'
    b'"system_fingerprint":"fp_1","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}],"usage":null}\n\n'
    b'data: {"id":"chatcmpl-9","object":"chat.completion.chunk","created":1,"model":"gpt-4o-mini",'
    b'"system_fingerprint":"fp_1","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":1,"total_tokens":10,'
    b'"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0}}}\n\n'
    b'data: [DONE]\n\n'
)


def test_decodes_an_openai_stream() -> None:
    meta, hi, final = decode(OPENAI_STREAM)
    assert meta == StreamMeta(request_id="chatcmpl-9", model="gpt-4o-mini", created=1, kind="chat")
    assert hi == TokenChunk(request_id="chatcmpl-9", index=0, text="Hi", logprobs=(-0.1,),
                            top_logprobs=((TopLogprob(token_id=-1, text="Hi", logprob=-0.1),),))
    assert final.finish_reason == "stop" and final.usage == Usage(prompt_tokens=9, completion_tokens=1)


def test_sse_syntax_crlf_cr_comments_fields_bom_multiline(chat_items: list[object]) -> None:
    first, rest = CHAT_SSE.decode().split("\n\n", 1)
    body = first.removeprefix("data: ")
    cut = body.index('"choices"')  # between two JSON members, where a "\n" is whitespace
    head, tail = body[:cut], body[cut:]
    odd = (
        "\ufeff: keep-alive\r\n"
        "event: message\rid: 7\rretry: 10\r"
        f"data:{head}\r\n"  # no space after the colon; the two data lines join with "\n"
        f"data: {tail}\n"
        "unknown-field\n"
        "\r\n"
        ": a comment-only event dispatches nothing\n\n"
    )
    data = (odd + rest).encode()
    for step in (1, 2, 3, len(data)):
        assert decode(data, step) == chat_items


@pytest.mark.parametrize(("data", "message"), [
    (b"data: {not json}\n\ndata: [DONE]\n\n", "not JSON"),
    (b"data: [1, 2]\n\n", "not a JSON object"),
    (b"data: \xff\xfe\n\n", "not valid UTF-8"),
    (b'data: {"id":"x","object":"text_completion","created":1,"model":"m"}\n\n', "lacks field 'choices'"),
    (b'data: {"id":"x","object":"response","created":1,"model":"m","choices":[]}\n\n', "unknown object"),
    (b'data: {"id":"x","object":"text_completion","created":"1","model":"m","choices":[]}\n\n', "wrong type"),
    (COMPLETION_SSE.replace(b'"stop"', b'"content_filter"'), "unknown finish_reason"),
    (COMPLETION_SSE.replace(b'"token_ids":[2,3]', b'"token_ids":[2,"3"]'), "list of integers"),
    (COMPLETION_SSE.replace(b'"top_token_ids":[[1,2]]', b'"top_token_ids":[[1]]'), "top_token_ids"),
    (COMPLETION_SSE.replace(b'"index":0,"text":" world"', b'"index":-1,"text":" world"'), "negative"),
    (COMPLETION_SSE.replace(b'"index":0,"text":" world"', b'"index":"0","text":" world"'), "'index' has the wrong type"),
    (COMPLETION_SSE + b"data: [DONE]\n\n", "after 'data: [DONE]'"),
    (CHAT_SSE.replace(b'"finish_reason":"length"', b'"finish_reason":null'), "usage chunk before the finish"),
    (COMPLETION_SSE.replace(b"data: [DONE]\n\n", COMPLETION_SSE.split(b"\n\n")[0] + b"\n\n"), "after the finish"),
    (COMPLETION_SSE.removesuffix(b"data: [DONE]\n\n"), "before 'data: [DONE]'"),
    (COMPLETION_SSE.removesuffix(b"\n"), "middle of an event"),
    (COMPLETION_SSE + b"data: x", "middle of an event"),
])
def test_rejects_malformed_streams(data: bytes, message: str) -> None:
    with pytest.raises(CodecError, match=re.escape(message)):
        decode(data)


def test_bounds_a_line_without_end() -> None:
    decoder = OpenAISseCodec().decoder()
    piece = b"x" * 65536
    with pytest.raises(CodecError, match="line longer than 1048576 bytes"):
        for _ in range(100):  # 6.4 MiB, if it never raised
            decoder.feed(piece)


def test_bounds_an_event() -> None:
    with pytest.raises(CodecError, match="event data larger than 100 bytes"):
        decode(b"data: 0123456789\n" * 20, max_event_bytes=100)
    with pytest.raises(CodecError, match="line longer than 100 bytes"):
        decode(b"data: " + b"x" * 200 + b"\n\n", max_event_bytes=100)
