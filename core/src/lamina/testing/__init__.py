"""Lamina's conformance kit for plugin authors.

``lamina.testing.contracts`` holds one contract class per layer; subclass it in your
plugin's tests and either set ``registered_name`` (the kit builds your component from
the installed plugins with default options) or override the component fixture::

    from lamina.testing.contracts import RouterContract

    class TestMyRouter(RouterContract):
        registered_name = "my-router"

``lamina.testing.abandon`` has helpers for tests of clients that leave (an executor must let go of
their work); ``lamina.testing.fixtures`` is loaded by pytest automatically (entry point ``pytest11``)
and provides fixtures for a live server (``live``: a stack served over HTTP on loopback, see
``lamina.testing.live``), hook recording and log capture. The modules import only what they need
when they are used.
"""
