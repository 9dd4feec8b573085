"""The ``scored`` router: filters, weighted scorers and a picker, composed from options.

Built like llm-d's inference scheduler (itself after the Kubernetes scheduler's filter and
score plugins): filters narrow the candidates (:mod:`lamina_routing.filters`), each scorer
rates them from 0 to 1 (:mod:`lamina_routing.scorers`), a backend's score is the weighted
sum, and a picker chooses by it (:mod:`lamina_routing.pickers`). All of it is named in
options, so two A/B arms of ``scored`` that differ in one weight compare that weight::

    [router]
    use = "scored"
    weights = { load = 1.0, kv = 0.5, prefix = 2.0 }
    filters = { max_queue_depth = 8 }
    picker = "max"

A scorer weighted 0 is not run. O(backends * scorers) per request.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from lamina_hookspecs.registration import BuildContext
from lamina_hookspecs.types import BackendState, Request
from lamina_routing.filters import FILTERS, Filter, servable
from lamina_routing.pickers import PICKERS, Picker
from lamina_routing.prefix_affinity import PrefixAffinityOptions
from lamina_routing.scorers import SCORERS, Scorer


def _unknown(kind: str, name: str, known: Mapping[str, Any]) -> ValueError:
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ValueError(f"unknown {kind} {name!r}{hint}; {kind}s: {', '.join(sorted(known))}")


def _check_weights(instance: object, attribute: attrs.Attribute[Any], weights: Mapping[str, float]) -> None:
    for name, weight in weights.items():
        if name not in SCORERS:
            raise _unknown("scorer", name, SCORERS)
        if not 0.0 <= weight < math.inf:
            raise ValueError(f"weight of {name!r} must be a finite number >= 0; got {weight!r}")


def _check_filters(instance: object, attribute: attrs.Attribute[Any], filters: Mapping[str, float]) -> None:
    for name, limit in filters.items():
        if name not in FILTERS:
            raise _unknown("filter", name, FILTERS)
        if not 0.0 <= limit <= FILTERS[name].most:
            raise ValueError(f"limit of {name!r} must be between 0 and {FILTERS[name].most}; got {limit!r}")


def _check_picker(instance: object, attribute: attrs.Attribute[Any], picker: str) -> None:
    if picker not in PICKERS:
        raise _unknown("picker", picker, PICKERS)


@attrs.frozen(kw_only=True)
class ScoredOptions:
    """Stack-file options of ``scored``."""

    weights: dict[str, float] = attrs.field(factory=lambda: {"load": 1.0, "kv": 0.5}, validator=_check_weights,
                                            metadata={"help": f"weight of each scorer ({', '.join(SCORERS)}), "
                                                              "each of which scores 0..1"})
    filters: dict[str, float] = attrs.field(factory=dict, validator=_check_filters, metadata={
        "help": f"filters and their limits ({', '.join(FILTERS)}), applied in order after dropping unavailable "
                "and other-model backends; one that would leave no backend is skipped"})
    picker: str = attrs.field(default="max", validator=_check_picker, metadata={
        "help": f"how the weighted score chooses: {', '.join(PICKERS)} (best of all, or better of two random)"})
    seed: int | None = attrs.field(default=None, metadata={
        "help": "seed of the p2c picker's draws; unset: seeded from the OS"})
    prefix: PrefixAffinityOptions = attrs.field(factory=PrefixAffinityOptions, metadata={
        "help": "the prefix scorer's ring and load bound (the options of prefix-affinity)"})


class Scored:
    """Filters the backends, scores the rest and lets the picker choose."""

    def __init__(self, filters: Sequence[Filter], scorers: Sequence[tuple[float, Scorer]], picker: Picker) -> None:
        self._filters = filters
        self._scorers = scorers
        self._picker = picker

    def choose(self, request: Request, backends: Sequence[BackendState]) -> BackendState:
        candidates = servable(request, backends)
        for check in self._filters:
            kept = [b for b in candidates if check.keep(b)]
            if kept:
                candidates = kept
        if len(candidates) == 1:
            return candidates[0]
        totals = [0.0] * len(candidates)
        for weight, scorer in self._scorers:
            for i, score in enumerate(scorer.score(request, candidates, backends)):
                totals[i] += weight * score
        return self._picker.pick(candidates, totals)


def build_scored(options: ScoredOptions, context: BuildContext) -> Scored:
    """Filters, weighted scorers (load, queue, kv, prefix) and a picker (max, p2c), from options."""
    return Scored(
        filters=[FILTERS[name](limit) for name, limit in options.filters.items()],
        scorers=[(weight, SCORERS[name].from_options(options)) for name, weight in options.weights.items() if weight],
        picker=PICKERS[options.picker].from_options(options),
    )
