"""The registration side of the contract: the ``register`` callback and what factories get."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import attrs

from lamina_hookspecs.protocols import BatchingPolicy, PrefixCache, PrewarmPolicy

Factory = Callable[[Any, "BuildContext"], Any]
"""``factory(options, context) -> component``: ``options`` is an instance of the options
class given to ``register`` (or ``None`` when none was given)."""


@attrs.frozen(kw_only=True)
class BuildContext:
    """What a factory may use besides its own options when the stack is built.

    ``prefix_cache``, ``batching`` and ``prewarm`` are the stack's instances of those
    components (for an executor), or ``None`` when the stack has none. ``arm`` names the A/B arm this
    instance serves, or ``None`` outside a split.
    """

    stack_name: str
    arm: str | None = None
    prefix_cache: PrefixCache | None = None
    batching: BatchingPolicy | None = None
    prewarm: PrewarmPolicy | None = None


class Register(Protocol):
    """The callback passed to every ``lamina_register_*`` hook."""

    def __call__(
        self,
        name: str,
        factory: Factory,
        *,
        options: type | None = None,
        summary: str = "",
    ) -> None:
        """Register one component.

        :param name: kebab-case name, unique within the layer; stack files select it
            with ``use = "<name>"``.
        :param factory: ``factory(options, context)`` builds one instance.
        :param options: an ``attrs`` class whose fields are the component's stack-file
            options (defaults, validators and ``metadata={"help": ...}`` are honoured).
        :param summary: one line for ``lamina plugins``; defaults to the factory's
            docstring's first line.
        """
        ...
