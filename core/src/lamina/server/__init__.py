"""The servers over a built stack: the OpenAI-compatible HTTP API (``http``, its request and
response bodies in ``openai_api``), the ``lamina.v1`` gRPC service (``grpc_service``), Prometheus
``/metrics`` (``metrics``), and process start-up, signals and draining (``serve``, ``priority``).

They import the kernel and :mod:`lamina.wire`, never the pool: a gateway's pool state reaches
``/metrics`` through the kernel's ``BackendPool.status()``.
"""
