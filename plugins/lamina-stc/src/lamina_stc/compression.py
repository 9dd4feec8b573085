"""zstd framing around a codec's bytes, and the ``stc-zstd`` codec built with it.

A stream is one zstd frame (with a content checksum). The encoder flushes a zstd block
after every piece its inner encoder writes, so each piece can be decompressed as soon as
it arrives and latency does not grow with compression; the frame ends with the stream
(final chunk or error). The decoder bounds what a peer can make it allocate: the window
(``max_window_bytes``) and the decompressed output of one ``feed`` (``max_output_bytes``,
which stops a decompression bomb after at most that much output).
"""

from __future__ import annotations

from typing import Final

import attrs
import zstandard

from lamina_hookspecs.errors import CodecError
from lamina_hookspecs.protocols import StreamDecoder, StreamEncoder, StreamItem
from lamina_hookspecs.registration import BuildContext
from lamina_hookspecs.types import StreamError, StreamMeta, TokenChunk
from lamina_stc import wire
from lamina_stc.codec import StcDecoder, StcEncoder

MAX_LEVEL: Final = 19
"""The highest level whose window fits ``MAX_WINDOW_BYTES`` (levels 20-22 use larger ones)."""
MAX_WINDOW_BYTES: Final = 1 << 23
MAX_OUTPUT_BYTES: Final = 2 * wire.MAX_FRAME_BYTES
"""Default bound on the decompressed output of one ``feed``."""
_SLICE: Final = 64
"""Compressed bytes decompressed at a time: at most 16 zstd blocks (2 MiB) of output each."""


@attrs.frozen(kw_only=True)
class StcZstdOptions:
    """Stack-file options of ``stc-zstd``."""

    level: int = attrs.field(default=3, validator=[attrs.validators.ge(1), attrs.validators.le(MAX_LEVEL)],
                             metadata={"help": f"zstd compression level, 1 (fastest) to {MAX_LEVEL} (smallest)"})


class ZstdEncoder:
    """Compresses what ``inner`` writes for one stream, a flushed block per call."""

    def __init__(self, inner: StreamEncoder, *, level: int = 3) -> None:
        self._inner = inner
        self._compressor = zstandard.ZstdCompressor(level=level, write_checksum=True).compressobj()

    def header(self, meta: StreamMeta) -> bytes:
        return self._block(self._inner.header(meta))

    def chunk(self, chunk: TokenChunk) -> bytes:
        """The chunk's bytes in a flushed block; the final chunk also ends the zstd frame."""
        data = self._inner.chunk(chunk)
        return self._end(data) if chunk.is_final else self._block(data)

    def error(self, error: StreamError) -> bytes:
        """The error's bytes, ending the zstd frame."""
        return self._end(self._inner.error(error))

    def _block(self, data: bytes) -> bytes:
        try:
            return self._compressor.compress(data) + self._compressor.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK)
        except zstandard.ZstdError as exc:
            raise CodecError(f"stc-zstd: cannot compress: {exc}") from None

    def _end(self, data: bytes) -> bytes:
        try:
            return self._compressor.compress(data) + self._compressor.flush(zstandard.COMPRESSOBJ_FLUSH_FINISH)
        except zstandard.ZstdError as exc:
            raise CodecError(f"stc-zstd: cannot compress: {exc}") from None


class ZstdDecoder:
    """Decompresses one stream and hands the bytes to ``inner`` as they come out.

    :param max_output_bytes: the most decompressed bytes one ``feed`` may yield.
    :param max_window_bytes: the largest zstd window (decoder memory) a frame may ask for.
    """

    def __init__(self, inner: StreamDecoder, *, max_output_bytes: int = MAX_OUTPUT_BYTES,
                 max_window_bytes: int = MAX_WINDOW_BYTES) -> None:
        self.max_output_bytes = max_output_bytes
        self._inner = inner
        self._decompressor = zstandard.ZstdDecompressor(max_window_size=max_window_bytes).decompressobj()

    def feed(self, data: bytes) -> list[StreamItem]:
        decompressor = self._decompressor
        items: list[StreamItem] = []
        produced = 0
        for start in range(0, len(data), _SLICE):
            if decompressor.eof:
                raise CodecError("stc-zstd: data after the end of the zstd frame")
            try:
                out = decompressor.decompress(data[start:start + _SLICE])
            except zstandard.ZstdError as exc:
                raise CodecError(f"stc-zstd: not a valid zstd stream: {exc}") from None
            produced += len(out)
            if produced > self.max_output_bytes:
                raise CodecError(f"stc-zstd: one feed decompressed to over {self.max_output_bytes} bytes "
                                 "(a decompression bomb?)")
            if decompressor.eof and decompressor.unused_data:
                raise CodecError("stc-zstd: data after the end of the zstd frame")
            items += self._inner.feed(out)
        return items

    def close(self) -> None:
        if not self._decompressor.eof:
            raise CodecError("stc-zstd: the stream was cut short: it ended inside its zstd frame")
        self._inner.close()


class StcZstdCodec:
    """STC compressed with zstd (``application/x-lamina-stc+zstd``)."""

    media_type = "application/x-lamina-stc+zstd"

    def __init__(self, *, level: int = 3) -> None:
        self.level = level

    def encoder(self) -> ZstdEncoder:
        return ZstdEncoder(StcEncoder(), level=self.level)

    def decoder(self, *, max_frame_bytes: int = wire.MAX_FRAME_BYTES,
                max_output_bytes: int = MAX_OUTPUT_BYTES) -> ZstdDecoder:
        """A fresh decoder; STC frames over ``max_frame_bytes``, and feeds that decompress to
        over ``max_output_bytes``, raise ``CodecError``."""
        return ZstdDecoder(StcDecoder(max_frame_bytes=max_frame_bytes), max_output_bytes=max_output_bytes)


def build_stc_zstd(options: StcZstdOptions, context: BuildContext) -> StcZstdCodec:
    """STC frames compressed with zstd, a flushed block per frame (no added latency)."""
    return StcZstdCodec(level=options.level)
