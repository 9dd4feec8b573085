"""``stc-zstd``: a flushed block per frame, and a decoder that bounds what a peer makes it allocate."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable

import pytest
import zstandard

from lamina.kernel.options import build_options
from lamina_hookspecs.errors import CodecError
from lamina_hookspecs.types import TokenChunk
from lamina_stc.codec import StcCodec
from lamina_stc.compression import StcZstdCodec, StcZstdOptions

CODEC = StcZstdCodec()
Encode = Callable[..., bytes]
Decode = Callable[..., list[object]]


def test_decompresses_to_the_plain_stc_stream(spec_items: list[object], encode: Encode) -> None:
    compressed = encode(CODEC.encoder(), spec_items)
    assert zstandard.ZstdDecompressor().decompressobj().decompress(compressed) == encode(StcCodec().encoder(),
                                                                                          spec_items)


@pytest.mark.parametrize("step", [1, 3, 1000])
def test_round_trips_in_any_split(spec_items: list[object], encode: Encode, decode: Decode, step: int) -> None:
    assert decode(CODEC.decoder(), encode(CODEC.encoder(), spec_items), step) == spec_items


def test_every_frame_is_decodable_as_soon_as_it_arrives(spec_items: list[object]) -> None:
    encoder, decoder = CODEC.encoder(), CODEC.decoder()
    assert decoder.feed(encoder.header(spec_items[0])) == spec_items[:1]  # type: ignore[arg-type]
    for chunk in spec_items[1:]:
        assert isinstance(chunk, TokenChunk)
        assert decoder.feed(encoder.chunk(chunk)) == [chunk]
    decoder.close()


def test_the_level_is_a_stack_file_option() -> None:
    assert build_options(StcZstdOptions, {"level": 19}, "codec").level == 19
    with pytest.raises(ValueError, match="level"):
        StcZstdOptions(level=20)


def test_a_decompression_bomb_fails_within_the_output_bound() -> None:
    bomb = zstandard.ZstdCompressor(level=1).compress(b"\x00" * (256 << 20))
    assert len(bomb) < 64 << 10
    decoder = CODEC.decoder(max_output_bytes=1 << 20)
    tracemalloc.start()
    try:
        with pytest.raises(CodecError, match="decompression bomb"):
            decoder.feed(bomb)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20


def test_a_frame_that_asks_for_a_huge_window_is_refused() -> None:
    params = zstandard.ZstdCompressionParameters.from_level(3, window_log=27)
    compressor = zstandard.ZstdCompressor(compression_params=params).compressobj()
    data = compressor.compress(b"LSTC\x01") + compressor.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK)
    with pytest.raises(CodecError, match="too much memory"):
        CODEC.decoder().feed(data)


@pytest.mark.parametrize(("mangle", "message"), [
    (lambda data: data + b"\x00", "data after the end of the zstd frame"),
    (lambda data: data[:-1], "cut short: it ended inside its zstd frame"),
    (lambda data: b"LSTC\x01" + data, "not a valid zstd stream"),
])
def test_the_decoder_rejects(spec_items: list[object], encode: Encode, decode: Decode,
                             mangle: Callable[[bytes], bytes], message: str) -> None:
    with pytest.raises(CodecError, match=message):
        decode(CODEC.decoder(), mangle(encode(CODEC.encoder(), spec_items)))


def test_a_valid_zstd_frame_of_garbage_fails_as_stc(decode: Decode) -> None:
    with pytest.raises(CodecError, match="not an STC stream"):
        decode(CODEC.decoder(), zstandard.ZstdCompressor().compress(b"hello"))
