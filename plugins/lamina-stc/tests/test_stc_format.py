"""The exact bytes of SPEC.md's example, and what the STC encoder and decoder refuse."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import attrs
import pytest

from lamina_hookspecs.errors import CodecError
from lamina_hookspecs.types import StreamError, StreamMeta, TokenChunk, Usage
from lamina_stc.codec import StcCodec, StcDecoder, StcEncoder

SPEC = Path(__file__).parents[1] / "SPEC.md"
CODEC = StcCodec()
Encode = Callable[[StcEncoder, list[object]], bytes]
Decode = Callable[..., list[object]]


def spec_examples() -> list[bytes]:
    """The hex dumps under SPEC.md's "Example": the leading hex bytes of each line, per code block."""
    example = SPEC.read_text().split("## Example", 1)[1]
    blocks = re.findall(r"```\n(.*?)```", example, re.DOTALL)
    dumps = []
    for block in blocks:
        data = bytearray()
        for line in block.splitlines():
            for token in line.split():
                if not re.fullmatch(r"[0-9a-f]{2}", token):
                    break
                data.append(int(token, 16))
        dumps.append(bytes(data))
    return dumps


def test_the_spec_example_bytes(spec_items: list[object], encode: Encode, decode: Decode) -> None:
    stream, error_frame = spec_examples()
    assert encode(CODEC.encoder(), spec_items) == stream
    assert decode(CODEC.decoder(), stream) == spec_items
    with_error = encode(CODEC.encoder(), [*spec_items[:3], StreamError(message="boom")])
    assert with_error == stream[:stream.rindex(b"\x07\x03")] + error_frame
    assert decode(CODEC.decoder(), with_error)[-1] == StreamError(message="boom")


@pytest.mark.parametrize("step", [1, 2, 5, 1000])
def test_any_split_decodes_the_same(spec_items: list[object], encode: Encode, decode: Decode, step: int) -> None:
    assert decode(CODEC.decoder(), encode(CODEC.encoder(), spec_items), step) == spec_items


def test_several_tokens_are_one_frame_and_a_final_chunk_with_tokens_is_one_item(decode: Decode) -> None:
    meta = StreamMeta(request_id="r", model="m", created=1)
    several = TokenChunk(request_id="r", index=0, token_ids=(1, 200, 70000), text="a b c", logprobs=(-1.0, -2.0, -3.0))
    final = TokenChunk(request_id="r", index=3, token_ids=(9,), text="!", finish_reason="length",
                       usage=Usage(prompt_tokens=2, completion_tokens=4))
    encoder = CODEC.encoder()
    frames = [encoder.header(meta), encoder.chunk(several), encoder.chunk(final)]
    assert frames[1] == bytes.fromhex("1b 02 03 03 01 c8 01 f0 a2 04 05 61 20 62 20 63 00 00 80 bf 00 00 00 c0 00 00 40 c0")
    assert frames[2][0] == len(frames[2]) - 1 and frames[2][1] == 0x03  # one END frame
    assert decode(CODEC.decoder(), b"".join(frames)) == [meta, several, final]


def test_an_index_that_skips_is_carried(encode: Encode, decode: Decode) -> None:
    meta = StreamMeta(request_id="r", model="m", created=1)
    items = [meta, TokenChunk(request_id="r", index=5, token_ids=(1,), text="x"),
             TokenChunk(request_id="r", index=6, token_ids=(2,), text="y"),
             TokenChunk(request_id="r", index=40, finish_reason="abort")]
    assert decode(CODEC.decoder(), encode(CODEC.encoder(), items)) == items


@pytest.mark.parametrize("include_usage", [None, False, True])
def test_the_header_round_trips(include_usage: bool | None, decode: Decode) -> None:
    meta = StreamMeta(request_id="cmpl-ü", model="smol/lm", created=2**40, kind="completion",
                      include_usage=include_usage)
    encoder = CODEC.encoder()
    data = encoder.header(meta) + encoder.chunk(TokenChunk(request_id="x", index=0, finish_reason="stop"))
    assert decode(CODEC.decoder(), data)[0] == meta


def test_an_error_first_is_a_whole_stream(decode: Decode) -> None:
    data = CODEC.encoder().error(StreamError(message="m", type="t", code="c"))
    assert decode(CODEC.decoder(), data) == [StreamError(message="m", type="t", code="c")]


@pytest.mark.parametrize(("chunk", "message"), [
    (TokenChunk(request_id="r", index=0, token_ids=(1, 2), logprobs=(-1.0,)), "1 logprobs for 2 tokens"),
    (TokenChunk(request_id="r", index=0, token_ids=(1,), top_logprobs=()), "0 top_logprobs entries for 1 tokens"),
    (TokenChunk(request_id="r", index=0, token_ids=(-1,)), "outside the varint range"),
    (TokenChunk(request_id="r", index=0, token_ids=(1,), text="\ud800"), "not encodable as UTF-8"),
    (TokenChunk(request_id="r", index=0, token_ids=(1,), logprobs=(-1e300,)), "float32"),
    (TokenChunk(request_id="r", index=0, text="x" * (1 << 20)), "over the limit"),
])
def test_the_encoder_refuses(chunk: TokenChunk, message: str) -> None:
    encoder = CODEC.encoder()
    encoder.header(StreamMeta(request_id="r", model="m", created=1))
    with pytest.raises(CodecError, match=message):
        encoder.chunk(chunk)


def test_the_encoder_refuses_out_of_order_calls() -> None:
    encoder = CODEC.encoder()
    chunk = TokenChunk(request_id="r", index=0, finish_reason="stop")
    with pytest.raises(CodecError, match="before header"):
        encoder.chunk(chunk)
    encoder.header(StreamMeta(request_id="r", model="m", created=1))
    encoder.chunk(chunk)
    with pytest.raises(CodecError, match="after the stream ended"):
        encoder.chunk(chunk)


HEAD = bytes.fromhex("4c5354430108010000017201 6d01")  # preamble, HEADER: completion, "r", "m", created 1
END = bytes.fromhex("0403000000")  # END: no flags, 0 tokens, stop


@pytest.mark.parametrize(("data", "message"), [
    (b"data: {}\n\n", "not an STC stream"),
    (b"LSTC\x03", "unsupported version 3"),
    (HEAD + b"\x00", "empty frame"),
    (HEAD + b"\xff\xff\x7f", "the limit is 1048576"),
    (HEAD + b"\x01\x09", "unknown frame type 0x09"),
    (HEAD[:5] + END, "END frame before the HEADER frame"),
    (HEAD + HEAD[5:], "a second HEADER frame"),
    (HEAD + b"\x04\x02\x40\x00\x00", "unknown flags 0x40"),
    (HEAD + b"\x04\x02\x10\x00\x00", "unknown flags 0x10"),
    (HEAD + b"\x04\x02\x00\x00\x00", "1 bytes after its last field"),
    (HEAD + b"\x04\x02\x00\x01\x80", "ends inside a field"),
    (HEAD + b"\x05\x02\x01\x00\x01\xff", "not valid UTF-8"),
    (HEAD + b"\x05\x02\x00\x01\x81\x00", "over-long varint"),
    (HEAD + b"\x04\x02\x00\x7f\x01", "127 tokens do not fit"),
    (HEAD + b"\x04\x03\x00\x00\x07", "unknown finish reason 7"),
    (HEAD + b"\x04\x03\x00\x00\x03", "unknown finish reason 3"),
    (HEAD[:5] + b"\x04\x01\x05\x00\x00", "unknown kind 5"),
    (HEAD[:5] + b"\x04\x01\x00\x03\x00", "unknown options 0x03"),
    (HEAD + END + b"\x00", "data after the end"),
    (HEAD, "cut short"),
    (HEAD + END[:3], "cut short: it ended before its END or ERROR frame with 3 bytes"),
    (b"", "cut short"),
])
def test_the_decoder_rejects(data: bytes, message: str, decode: Decode) -> None:
    with pytest.raises(CodecError, match=message):
        decode(CODEC.decoder(), data)


def test_the_header_fixture_is_valid(decode: Decode) -> None:
    assert decode(CODEC.decoder(), HEAD + END)[0] == StreamMeta(request_id="r", model="m", created=1)


def test_an_oversized_frame_fails_from_its_length_prefix_alone() -> None:
    decoder = StcDecoder(max_frame_bytes=100)
    decoder.feed(HEAD)
    with pytest.raises(CodecError, match="the limit is 100"):
        decoder.feed(b"\xe5")  # a length of 0x65 = 101 bytes, or more


def test_a_lower_frame_limit_applies_to_every_frame(spec_items: list[object], encode: Encode) -> None:
    data = encode(CODEC.encoder(), spec_items)
    with pytest.raises(CodecError, match="the limit is 20"):
        CODEC.decoder(max_frame_bytes=20).feed(data)
    with pytest.raises(ValueError, match="max_frame_bytes"):
        CODEC.decoder(max_frame_bytes=2 << 20)


def test_a_long_chunk_text_near_the_limit_round_trips(decode: Decode) -> None:
    meta = StreamMeta(request_id="r", model="m", created=1)
    final = TokenChunk(request_id="r", index=0, text="é" * 500_000, finish_reason="stop")
    encoder = CODEC.encoder()
    data = encoder.header(meta) + encoder.chunk(final)
    assert decode(CODEC.decoder(), data, 4096)[1] == attrs.evolve(final)
