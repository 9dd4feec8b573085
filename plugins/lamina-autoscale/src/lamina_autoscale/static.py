"""The ``static`` autoscaler: a fixed number of replicas, whatever the load."""

from __future__ import annotations

import attrs

from lamina_hookspecs.registration import BuildContext
from lamina_hookspecs.types import PoolSnapshot, ScaleDecision


@attrs.frozen(kw_only=True)
class StaticOptions:
    """Stack-file options of ``static``."""

    replicas: int = attrs.field(default=1, validator=attrs.validators.ge(1),
                                metadata={"help": "replicas to run at all times"})


@attrs.frozen
class Static:
    """Always answers the configured replica count."""

    options: StaticOptions

    def decide(self, snapshot: PoolSnapshot) -> ScaleDecision:
        return ScaleDecision(replicas=self.options.replicas, reason="static")


def build_static(options: StaticOptions, context: BuildContext) -> Static:
    """A fixed number of replicas."""
    return Static(options)
