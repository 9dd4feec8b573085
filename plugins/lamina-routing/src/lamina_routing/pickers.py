"""Pickers of the ``scored`` router: which candidate the weighted scores elect.

* ``max``: the highest score; equal scores take turns.
* ``p2c``: two distinct random candidates, the higher score wins (the first drawn on a tie):
  the power of two choices on a composite score, which keeps a burst from all landing on
  the one backend that looked best when the burst began.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar, Self

from lamina_hookspecs.types import BackendState
from lamina_routing.candidates import Rotation

if TYPE_CHECKING:
    from lamina_routing.scored import ScoredOptions


class Picker:
    """Chooses one of ``candidates`` (non-empty) by ``scores`` (one each)."""

    name: ClassVar[str]

    @classmethod
    def from_options(cls, options: ScoredOptions) -> Self:
        return cls()

    def pick(self, candidates: Sequence[BackendState], scores: Sequence[float]) -> BackendState:
        raise NotImplementedError


class MaxPicker(Picker):
    """The best score; ties by turns."""

    name = "max"

    def __init__(self) -> None:
        self._rotation = Rotation()

    def pick(self, candidates: Sequence[BackendState], scores: Sequence[float]) -> BackendState:
        best = max(scores)
        return self._rotation.pick([b for b, score in zip(candidates, scores, strict=True) if score == best])


class P2CPicker(Picker):
    """The better of two random candidates."""

    name = "p2c"

    def __init__(self, seed: int | None = None) -> None:
        self._rng = random.Random(seed)

    @classmethod
    def from_options(cls, options: ScoredOptions) -> Self:
        return cls(options.seed)

    def pick(self, candidates: Sequence[BackendState], scores: Sequence[float]) -> BackendState:
        if len(candidates) == 1:
            return candidates[0]
        first, second = self._rng.sample(range(len(candidates)), 2)
        return candidates[second] if scores[second] > scores[first] else candidates[first]


PICKERS: dict[str, type[Picker]] = {cls.name: cls for cls in (MaxPicker, P2CPicker)}
