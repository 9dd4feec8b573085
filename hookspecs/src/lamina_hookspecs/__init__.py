"""Lamina's public contract for plugins: markers, hookspecs, value types, protocols, errors.

A plugin module implements hooks with ``@hookimpl`` and is found through the entry-point
group ``lamina``::

    from lamina_hookspecs import hookimpl

    @hookimpl
    def lamina_register_routers(register):
        register("first-available", FirstAvailable, summary="...")
"""

from lamina_hookspecs.markers import PROJECT_NAME, hookimpl, hookspec

__all__ = ["PROJECT_NAME", "hookimpl", "hookspec"]
