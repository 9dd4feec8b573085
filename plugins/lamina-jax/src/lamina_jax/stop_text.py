"""Stop strings on streamed text: hold back just enough text to never emit part of a stop."""

from __future__ import annotations

from collections.abc import Sequence


class StopText:
    """Filters a text stream for stop strings.

    Text is released as it arrives except a tail that is the start of some stop string
    (``"ST"`` while waiting to see whether ``"STOP"`` follows); when a stop string completes,
    the text before it is released and the stream is done.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = [s for s in stops if s]
        self._pending = ""

    def push(self, text: str) -> tuple[str, bool]:
        """Add new text; return ``(text safe to emit, whether a stop string was hit)``."""
        buffer = self._pending + text
        hits = [i for i in (buffer.find(s) for s in self._stops) if i != -1]
        if hits:
            self._pending = ""
            return buffer[: min(hits)], True
        hold = max((k for s in self._stops for k in range(1, min(len(s), len(buffer) + 1))
                    if buffer.endswith(s[:k])), default=0)
        cut = len(buffer) - hold
        self._pending = buffer[cut:]
        return buffer[:cut], False

    def flush(self) -> str:
        """The held-back text, at the end of a stream that did not stop on a string."""
        pending, self._pending = self._pending, ""
        return pending
