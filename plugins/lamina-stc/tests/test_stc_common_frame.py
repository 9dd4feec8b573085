"""The common frame's fast paths (one token, text, implied index) agree with the general code.

The encoder must write the general code's bytes, and the decoder must read, or reject with
the same error, whatever the general code reads or rejects, however the input is split.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lamina_hookspecs.errors import CodecError
from lamina_hookspecs.types import StreamMeta, TokenChunk, Usage
from lamina_stc.codec import StcCodec, StcDecoder, StcEncoder

CODEC = StcCodec()
META = StreamMeta(request_id="r", model="m", created=1)
COMMON = b"\x02\x01\x01"  # a TOKENS frame's type, HAS_TEXT, one token
HEAD = bytes.fromhex("4c5354430108010000017201 6d01")  # preamble, HEADER: completion, "r", "m", created 1
END = bytes.fromhex("0403000000")  # END: no flags, 0 tokens, stop
Decode = Callable[..., list[object]]

# Token ids whose varints take 1, 2, 3 (the fast path's) and 4 bytes (the general code's).
IDS = [0, 1, 127, 128, 300, 16383, 16384, 49151, (1 << 21) - 1, 1 << 21, 1 << 40]
# Text sizes around the last one a one-byte frame length prefix holds, for each id width.
TEXTS = ["a", "é", "日本", "🙂", *("x" * size for size in range(117, 126))]


class GeneralDecoder(StcDecoder):
    """A decoder without the fast path: the reference the fast path must agree with."""

    def _common_chunk(self, data: bytes, start: int, end: int) -> None:
        return None


def outcome(decoder: StcDecoder, parts: list[bytes]) -> tuple[str, Any]:
    """``("items", items)`` for a stream that decodes whole, else ``("error", message)``."""
    items: list[object] = []
    try:
        for part in parts:
            items += decoder.feed(part)
        decoder.close()
    except CodecError as exc:
        return "error", str(exc)
    return "items", items


def pieces(data: bytes, cuts: list[int]) -> list[bytes]:
    bounds = [0, *sorted(c % (len(data) + 1) for c in cuts), len(data)]
    return [data[start:end] for start, end in itertools.pairwise(bounds)]


@pytest.mark.parametrize("token_id", IDS)
@pytest.mark.parametrize("text", TEXTS)
def test_the_encoder_writes_the_general_codes_bytes(token_id: int, text: str) -> None:
    fast, general = CODEC.encoder(), CODEC.encoder()
    fast.header(META), general.header(META)
    for index in range(2):  # the first chunk fills the head cache, the second reads it
        chunk = TokenChunk(request_id="r", index=index, token_ids=(token_id,), text=text)
        assert fast.chunk(chunk) == general._chunk(chunk)


def test_the_encoder_leaves_ids_that_are_not_ints_to_the_general_code() -> None:
    encoder = CODEC.encoder()
    encoder.header(META)
    encoder.chunk(TokenChunk(request_id="r", index=0, token_ids=(5,), text="a"))  # caches id 5's head
    with pytest.raises(TypeError):  # as before the fast path: 5.0 is not a token id
        encoder.chunk(TokenChunk(request_id="r", index=1, token_ids=(5.0,), text="a"))  # type: ignore[arg-type]


def mixed_stream() -> list[object]:
    """Common frames of every id width, and of texts near the size limit, between frames that
    take the general code's path."""
    general = [
        {"token_ids": (7,), "text": "skips", "index_step": 5},  # HAS_INDEX
        {"token_ids": (1, 2), "text": "two"},
        {"token_ids": (3,), "text": ""},  # no HAS_TEXT
        {"token_ids": (4,), "text": "lp", "logprobs": (-0.5,)},
        {"token_ids": (5,), "text": "z" * 200},  # a two-byte length prefix
    ]
    common = [{"token_ids": (token_id,), "text": text} for token_id, text in zip(IDS * 2, TEXTS)]
    fields = [chunk for pair in itertools.zip_longest(common, general) for chunk in pair if chunk is not None]
    items: list[object] = [META]
    index = 0
    for chunk in fields:
        index += chunk.pop("index_step", 0)
        items.append(TokenChunk(request_id="r", index=index, **chunk))
        index += len(chunk["token_ids"])
    items.append(TokenChunk(request_id="r", index=index, token_ids=(9,), text="!", finish_reason="stop",
                            usage=Usage(prompt_tokens=3, completion_tokens=index + 1)))
    return items


def test_the_mixed_stream_has_both_kinds_of_frame() -> None:
    encoder, decoder = CODEC.encoder(), CODEC.decoder()
    decoder.feed(encoder.header(META))
    frames = [encoder.chunk(chunk) for chunk in mixed_stream()[1:]]  # type: ignore[arg-type]
    common = [frame for frame in frames if frame[0] < 0x80 and frame[1:4] == COMMON]
    assert 5 < len(common) < len(frames) - 5
    assert all(decoder._common_chunk(frame, 1, len(frame)) is not None for frame in common)  # read fast


def test_a_mixed_stream_split_at_every_offset_decodes_the_same(decode: Decode,
                                                               encode: Callable[..., bytes]) -> None:
    items = mixed_stream()
    data = encode(CODEC.encoder(), items)
    assert decode(CODEC.decoder(), data, 1) == items
    for cut in range(len(data) + 1):
        decoder = CODEC.decoder()
        assert [*decoder.feed(data[:cut]), *decoder.feed(data[cut:])] == items
        decoder.close()


@pytest.mark.parametrize(("frame", "message"), [
    (b"\x06" + COMMON + b"\x80\x00\x00", "over-long varint"),  # a two-byte id ending in 0x00
    (b"\x07" + COMMON + b"\x81\x80\x00\x00", "over-long varint"),  # a three-byte one
    (b"\x07" + COMMON + b"\x05\x01ab", "1 bytes after its last field"),  # text shorter than the frame
    (b"\x06" + COMMON + b"\x05\x02a", "ends inside a field"),  # text longer than the frame
    (b"\x05" + COMMON + b"\x80\x80", "ends inside a field"),  # an id running to the end of the frame
    (b"\x06" + COMMON + b"\x05\x01\xff", "not valid UTF-8"),
    (b"\x06" + COMMON + b"\x05\x01\x80", "not valid UTF-8"),
])
def test_a_malformed_common_frame_fails_as_the_general_code_says(frame: bytes, message: str,
                                                                 decode: Decode) -> None:
    with pytest.raises(CodecError, match=message):
        decode(CODEC.decoder(), HEAD + frame + END)  # the END frame's bytes follow, to be left unread


def test_a_common_frame_out_of_place_fails(decode: Decode) -> None:
    frame = b"\x06" + COMMON + b"\x05\x01a"
    with pytest.raises(CodecError, match="TOKENS frame before the HEADER frame"):
        decode(CODEC.decoder(), HEAD[:5] + frame)
    with pytest.raises(CodecError, match="data after the end"):
        decode(CODEC.decoder(), HEAD + END + frame)
    with pytest.raises(CodecError, match="the limit is 5"):
        decode(CODEC.decoder(max_frame_bytes=5), HEAD[:5] + frame)


def test_a_common_frame_with_empty_text_reads_as_before(decode: Decode) -> None:
    """``HAS_TEXT`` with no text is not what a writer sends, but readers have always taken it."""
    items = decode(CODEC.decoder(), HEAD + b"\x05" + COMMON + b"\x05\x00" + END)
    assert items[1] == TokenChunk(request_id="r", index=0, token_ids=(5,), text="")


# Bodies that start like a common frame's: an id's bytes, a text size that is right or any
# byte, text bytes (UTF-8 or not); or random bytes after the common start; or any bytes.
sized_text = st.tuples(st.binary(max_size=8), st.booleans(), st.integers(0, 255)).map(
    lambda t: bytes((len(t[0]) if t[1] else t[2],)) + t[0])
common_like = st.tuples(st.binary(min_size=1, max_size=4), sized_text | st.text(max_size=4).map(
    lambda text: bytes((len(text.encode()),)) + text.encode())).map(lambda t: COMMON + t[0] + t[1])
any_body = st.one_of(common_like, st.binary(max_size=12).map(lambda tail: COMMON + tail),
                     st.binary(min_size=1, max_size=12))
framed = any_body.map(lambda body: bytes((len(body),)) + body)


@settings(max_examples=500, deadline=timedelta(seconds=2))
@given(frames=st.lists(framed, max_size=6), end=st.sampled_from([END, b""]),
       cuts=st.lists(st.integers(min_value=0), max_size=6))
def test_the_decoder_agrees_with_the_general_code_on_any_frames(frames: list[bytes], end: bytes,
                                                                cuts: list[int]) -> None:
    parts = pieces(HEAD + b"".join(frames) + end, cuts)
    assert outcome(CODEC.decoder(), parts) == outcome(GeneralDecoder(), parts)
