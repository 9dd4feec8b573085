"""Lamina's JAX executor plugin (entry point ``jax``).

Importing this module stays cheap: JAX and the model code load only when a stack builds
the executor.
"""

from __future__ import annotations

from typing import Any

from lamina_hookspecs import hookimpl
from lamina_hookspecs.registration import BuildContext, Register


def _build(options: Any, context: BuildContext) -> Any:
    """A Llama-family GGUF model in JAX with continuous batching and a paged KV cache."""
    from lamina_jax.executor import build_jax

    return build_jax(options, context)


@hookimpl
def lamina_register_executors(register: Register) -> None:
    from lamina_jax.options import JaxOptions

    register("jax", _build, options=JaxOptions)
