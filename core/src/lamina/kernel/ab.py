"""Deterministic, weighted A/B arm assignment."""

from __future__ import annotations

import bisect
import hashlib
import itertools
from collections.abc import Mapping, Sequence

import attrs


@attrs.frozen
class ArmPicker:
    """Maps a sticky key to an arm: the same key always gets the same arm, and keys
    spread over arms in proportion to the weights.

    The key is hashed with BLAKE2b (salted by the layer, so a tenant's router arm does
    not predict its executor arm) to a point in [0, 1), which falls into one arm's share
    of the cumulative weights.
    """

    salt: str
    names: tuple[str, ...]
    cumulative: tuple[float, ...]

    @classmethod
    def from_weights(cls, salt: str, arms: Sequence[tuple[str, float]]) -> ArmPicker:
        total = sum(weight for _, weight in arms)
        bounds = tuple(acc / total for acc in itertools.accumulate(weight for _, weight in arms))
        return cls(salt, tuple(name for name, _ in arms), bounds)

    def pick(self, key: str) -> str:
        digest = hashlib.blake2b(key.encode(), digest_size=8, person=self.salt.encode()[:16]).digest()
        point = int.from_bytes(digest, "big") / 2**64
        return self.names[min(bisect.bisect_right(self.cumulative, point), len(self.names) - 1)]


def arm_label(arms: Mapping[str, str]) -> str:
    """A request's A/B assignments as one metric label / log value: ``"router=treatment"``,
    layers in sorted order joined by commas; ``""`` outside any split."""
    return ",".join(f"{layer}={arm}" for layer, arm in sorted(arms.items()))
