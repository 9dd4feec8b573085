"""Scorers of the ``scored`` router: each rates every candidate from 0 (worst) to 1 (best).

* ``load``: ``1 - outstanding_tokens / max`` over the candidates (1 for all when none has any).
* ``queue``: the same on ``queue_depth``.
* ``kv``: ``1 - kv_usage``, the free fraction of the KV cache.
* ``prefix``: 1 for the backend ``prefix-affinity``'s bounded-load ring picks among the
  candidates, 0 for the others.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar, Self

from lamina_hookspecs.types import BackendState, Request
from lamina_routing.prefix_affinity import PrefixAffinity

if TYPE_CHECKING:
    from lamina_routing.scored import ScoredOptions


class Scorer:
    """Rates ``candidates`` (some of the offered ``backends``), one score each."""

    name: ClassVar[str]

    @classmethod
    def from_options(cls, options: ScoredOptions) -> Self:
        return cls()

    def score(self, request: Request, candidates: Sequence[BackendState],
              backends: Sequence[BackendState]) -> list[float]:
        raise NotImplementedError


def _least_is_best(values: list[int]) -> list[float]:
    top = max(values)
    return [1.0 - value / top for value in values] if top > 0 else [1.0] * len(values)


class LoadScorer(Scorer):
    """Fewer outstanding tokens score higher."""

    name = "load"

    def score(self, request: Request, candidates: Sequence[BackendState],
              backends: Sequence[BackendState]) -> list[float]:
        return _least_is_best([b.outstanding_tokens for b in candidates])


class QueueScorer(Scorer):
    """Shorter queues score higher."""

    name = "queue"

    def score(self, request: Request, candidates: Sequence[BackendState],
              backends: Sequence[BackendState]) -> list[float]:
        return _least_is_best([b.queue_depth for b in candidates])


class KvScorer(Scorer):
    """More free KV cache scores higher."""

    name = "kv"

    def score(self, request: Request, candidates: Sequence[BackendState],
              backends: Sequence[BackendState]) -> list[float]:
        return [1.0 - min(b.kv_usage, 1.0) for b in candidates]


class PrefixScorer(Scorer):
    """1 for the request's bounded-load home on the prefix ring, else 0."""

    name = "prefix"

    def __init__(self, affinity: PrefixAffinity) -> None:
        self._affinity = affinity

    @classmethod
    def from_options(cls, options: ScoredOptions) -> Self:
        return cls(PrefixAffinity(options.prefix))

    def score(self, request: Request, candidates: Sequence[BackendState],
              backends: Sequence[BackendState]) -> list[float]:
        home = self._affinity.pick(request, backends, candidates)
        return [1.0 if b is home else 0.0 for b in candidates]


SCORERS: dict[str, type[Scorer]] = {cls.name: cls for cls in (LoadScorer, QueueScorer, KvScorer, PrefixScorer)}
