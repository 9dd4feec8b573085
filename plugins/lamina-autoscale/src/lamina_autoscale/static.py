"""The ``static`` autoscaler: a fixed number of replicas, whatever the load."""

from __future__ import annotations

import attrs

from lamina_hookspecs.registration import BuildContext
from lamina_hookspecs.types import PoolSnapshot, ScaleDecision


@attrs.frozen(kw_only=True)
class StaticOptions:
    """Stack-file options of ``static``."""

    replicas: int | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.ge(1)),
        metadata={"help": "replicas to run at all times; unset: keep the count the pool started with"})


@attrs.frozen
class Static:
    """Always answers the configured replica count (or the pool's current one)."""

    options: StaticOptions

    def decide(self, snapshot: PoolSnapshot) -> ScaleDecision:
        replicas = self.options.replicas if self.options.replicas is not None else snapshot.replicas
        return ScaleDecision(replicas=replicas, reason="static")


def build_static(options: StaticOptions, context: BuildContext) -> Static:
    """A fixed number of replicas."""
    return Static(options)
