"""The microkernel: what one process needs to turn a request into tokens.

It owns plugin loading (``plugins``, ``registry``, ``options``), stack files (``stack_config``),
the built stack with its A/B arms (``stack``, ``ab``), and the request's path through it:
admission, the routing tree, the lifecycle hooks, the pipeline, ``n`` choices, tool calls and
SLO accounting. It imports ``lamina_hookspecs`` and nothing else of Lamina: the worker pool,
the transports and the tools build on it, never the other way.
"""
