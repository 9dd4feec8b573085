"""structlog configuration, in one place.

A console renderer on a TTY, JSON lines otherwise. Standard-library loggers (grpc, the
HTTP server, jax) go through the same processors. Exceptions are rendered without frame
locals: locals would hold prompts and API keys. Plugins only call
``structlog.get_logger(__name__)``; the request id is bound per request by core and
passed explicitly into engine threads (contextvars do not cross threads).
"""

from __future__ import annotations

import logging
import sys

import structlog


def configure_logging(*, level: str = "INFO", json: bool | None = None) -> None:
    """Route structlog and stdlib logging to stderr; ``json=None`` picks JSON unless on a TTY."""
    use_json = not sys.stderr.isatty() if json is None else json
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: structlog.types.Processor
    if use_json:
        shared.append(
            structlog.processors.ExceptionRenderer(
                structlog.tracebacks.ExceptionDictTransformer(show_locals=False)
            )
        )
        renderer = structlog.processors.JSONRenderer()
    else:
        # plain tracebacks: the rich formatter's default would print frame locals
        renderer = structlog.dev.ConsoleRenderer(exception_formatter=structlog.dev.plain_traceback)
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        # not cached: a cached logger keeps the first configuration forever, so an embedder that
        # reconfigures (or structlog.testing.capture_logs) would miss it; we log a line per
        # request, not per token, so the lookup costs nothing measurable
        cache_logger_on_first_use=False,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(foreign_pre_chain=shared, processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer,
        ])
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())

