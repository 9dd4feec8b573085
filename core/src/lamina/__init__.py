"""Lamina core, as packages with one-way imports (``docs/architecture.md`` draws them):

- ``kernel``: plugins, stack files, the built stack and the request's path through it;
- ``wire``: the gRPC protocol and what both ends of a process boundary share;
- ``pool``: workers and remote backends behind a gateway, and the policy that runs them;
- ``server``: the HTTP and gRPC servers over a stack;
- ``tools``: bench, status, the A/B report, autoscale replay, the Python client;
- ``cli``: the ``lamina`` command; ``testing``: the conformance kit and fixtures for plugin authors.
"""

__version__ = "0.1.0"
