"""An incremental, bounded parser for Server-Sent Events (the WHATWG ``text/event-stream`` format).

Lines end at ``\\r\\n``, ``\\n`` or ``\\r``; a line ``name: value`` sets a field (one space
after the colon is dropped); ``data`` values of one event are joined with ``\\n``; a blank
line ends the event; lines starting with ``:`` are comments. Only ``data`` matters here:
``event``, ``id``, ``retry`` and unknown fields are ignored, and so is an event without
data. A leading byte-order mark is dropped. Input may be split anywhere, even inside a
UTF-8 sequence or between ``\\r`` and ``\\n``; each line is decoded once it is complete.
"""

from __future__ import annotations

import re

from lamina_hookspecs.errors import CodecError

MAX_EVENT_BYTES = 1 << 20
"""Default bound on one line and on the data of one event (1 MiB)."""

_EOL = re.compile(rb"[\r\n]")
_CR = 0x0D
_LF = 0x0A


class SseParser:
    """Turns bytes into the data strings of complete events; raises ``CodecError`` on input
    that is not UTF-8 or exceeds ``max_event_bytes`` (so memory stays bounded)."""

    def __init__(self, *, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        self.max_event_bytes = max_event_bytes
        self._buffer = bytearray()  # the incomplete last line
        self._scanned = 0  # bytes of ``_buffer`` already known to hold no line end
        self._skip_lf = False  # the last line ended with ``\r``: a leading ``\n`` belongs to it
        self._first_line = True
        self._data: list[str] = []
        self._data_bytes = 0

    def feed(self, data: bytes) -> list[str]:
        """Consume ``data``; return the data of every event it completed, in order."""
        if self._skip_lf and data:
            self._skip_lf = False
            if data[0] == _LF:
                data = data[1:]
        buffer = self._buffer
        buffer += data
        events: list[str] = []
        start = 0
        while (match := _EOL.search(buffer, self._scanned)) is not None:
            end = match.start()
            after = end + 1
            if buffer[end] == _CR:
                if after == len(buffer):
                    self._skip_lf = True
                elif buffer[after] == _LF:
                    after += 1
            event = self._line(buffer[start:end])
            if event is not None:
                events.append(event)
            start = self._scanned = after
        del buffer[:start]
        self._scanned = len(buffer)
        if len(buffer) > self.max_event_bytes:
            raise CodecError(f"SSE line longer than {self.max_event_bytes} bytes")
        return events

    def close(self) -> None:
        """Declare the end of input; raise ``CodecError`` if it ended inside a line or event."""
        if self._buffer or self._data:
            raise CodecError("SSE stream ended in the middle of an event")

    def _line(self, raw: bytearray) -> str | None:
        """Process one complete line; return the event's data if the line ended an event."""
        if len(raw) > self.max_event_bytes:
            raise CodecError(f"SSE line longer than {self.max_event_bytes} bytes")
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CodecError(f"SSE stream is not valid UTF-8: {exc.reason} at line byte {exc.start}") from None
        if self._first_line:
            self._first_line = False
            line = line.removeprefix("\ufeff")
        if not line:
            return self._dispatch()
        name, colon, value = line.partition(":")
        if name == "data":
            if colon and value.startswith(" "):
                value = value[1:]
            self._data_bytes += len(raw)
            if self._data_bytes > self.max_event_bytes:
                raise CodecError(f"SSE event data larger than {self.max_event_bytes} bytes")
            self._data.append(value)
        return None

    def _dispatch(self) -> str | None:
        if not self._data:
            return None
        data = "\n".join(self._data)
        self._data.clear()
        self._data_bytes = 0
        return data
