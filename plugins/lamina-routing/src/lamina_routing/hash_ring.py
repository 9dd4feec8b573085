"""A consistent-hash ring (Karger et al., 1997): each backend owns ``virtual_nodes`` points.

A point is the first 8 bytes of ``blake2b(name + "#" + i)``, read as an integer. A key is
served by the owner of the first point at or after it, wrapping around; removing a backend
moves only the keys it owned, each to the next owner clockwise.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from hashlib import blake2b


def point(data: bytes) -> int:
    """A 64-bit position on the ring."""
    return int.from_bytes(blake2b(data, digest_size=8).digest(), "big")


class HashRing:
    """The ring of ``names``; owners are reported as indexes into ``names``."""

    def __init__(self, names: tuple[str, ...], virtual_nodes: int) -> None:
        self.names = names
        ring = sorted((point(f"{name}#{i}".encode()), owner)
                      for owner, name in enumerate(names) for i in range(virtual_nodes))
        self._points = [p for p, _ in ring]
        self._owners = [owner for _, owner in ring]

    def walk(self, key: int) -> Iterator[int]:
        """Every owner once, in the order met going clockwise from ``key``: O(log points) to
        start, then about ``len(names) * log(len(names))`` points to meet all of them."""
        points, owners, size = self._points, self._owners, len(self.names)
        start = bisect.bisect_left(points, key)
        seen: set[int] = set()
        for i in range(start, start + len(points)):
            owner = owners[i % len(points)]
            if owner not in seen:
                seen.add(owner)
                yield owner
                if len(seen) == size:
                    return
