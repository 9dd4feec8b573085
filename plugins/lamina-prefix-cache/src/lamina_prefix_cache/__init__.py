"""Lamina prefix caches and pre-warm policies (layer 4). Registered through the ``lamina`` entry point
``prefix-cache``."""

from __future__ import annotations

from lamina_hookspecs import hookimpl
from lamina_hookspecs.registration import Register
from lamina_prefix_cache.hot import HotPrefixCache, HotPrefixOptions, build_hot_prefix
from lamina_prefix_cache.prewarm import RecurringOptions, RecurringPrefixes, build_recurring
from lamina_prefix_cache.radix import Adoption, RadixCache, RadixOptions, build_radix

__all__ = [
    "Adoption", "HotPrefixCache", "HotPrefixOptions", "RadixCache", "RadixOptions", "RecurringOptions",
    "RecurringPrefixes", "build_hot_prefix", "build_radix", "build_recurring",
]


@hookimpl
def lamina_register_prefix_caches(register: Register) -> None:
    register("radix", build_radix, options=RadixOptions)
    register("hot-prefix", build_hot_prefix, options=HotPrefixOptions)


@hookimpl
def lamina_register_prewarm_policies(register: Register) -> None:
    register("recurring", build_recurring, options=RecurringOptions)
