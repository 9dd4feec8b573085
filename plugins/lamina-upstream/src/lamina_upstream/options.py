"""Stack-file options of ``openai-upstream`` and the engines it knows."""

from __future__ import annotations

from typing import Literal

import attrs

Engine = Literal["lamina", "vllm", "llama-server", "sglang", "tgi", "generic"]
ENGINES: tuple[Engine, ...] = ("lamina", "vllm", "llama-server", "sglang", "tgi", "generic")
OWNED_BY: dict[str, Engine] = {"lamina": "lamina", "vllm": "vllm", "llamacpp": "llama-server", "sglang": "sglang"}
"""``/v1/models`` ``owned_by`` values and the engine each names, for ``engine = "auto"`` (TGI's is the
model's id, so it is named in the stack file); any other is ``generic``: an OpenAI-compatible
server (a hosted API, a proxy) read for text and usage only."""
TEXT_ONLY: frozenset[Engine] = frozenset({"sglang", "tgi", "generic"})
"""Engines read for text and usage alone: Lamina takes no token ids from their streams, and
reaches no tokenizer of theirs."""


def _url(instance: object, attribute: attrs.Attribute, value: str) -> None:
    if not value.startswith(("http://", "https://")):
        raise ValueError(f"must be an http:// or https:// URL; got {value!r}")


@attrs.frozen(kw_only=True)
class UpstreamOptions:
    """Stack-file options of ``openai-upstream``."""

    url: str = attrs.field(converter=lambda v: str(v).rstrip("/"), validator=_url, metadata={
        "help": "the upstream server's base URL, without /v1 (http://127.0.0.1:8080)"})
    model: str = attrs.field(default="", metadata={
        "help": "the upstream's model id to request (default: the first entry of its /v1/models)"})
    served_name: str = attrs.field(default="", metadata={
        "help": "the model id clients use here (default: the upstream's)"})
    engine: Literal["auto", "lamina", "vllm", "llama-server", "sglang", "tgi", "generic"] = attrs.field(
        default="auto", validator=attrs.validators.in_(("auto", *ENGINES)), metadata={
            "help": "what the upstream runs, which decides how token ids and load are read from it "
                    "(auto: from the owned_by of its /v1/models, which names every engine but tgi; "
                    "sglang, tgi and generic, any other OpenAI-compatible server, are read for text "
                    "and usage only)"})
    api_key_env: str = attrs.field(default="", metadata={
        "help": "environment variable holding the upstream's API key, sent as a bearer token"})
    context_length: int = attrs.field(default=0, validator=attrs.validators.ge(0), metadata={
        "help": "prompt + output tokens allowed (0: as the upstream reports)"})
    max_in_flight: int = attrs.field(default=256, validator=attrs.validators.ge(1), metadata={
        "help": "requests sent to the upstream at once; more wait here, in order"})
    max_queue_wait_s: float | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.gt(0)), metadata={
            "help": "longest a request may wait here for a place in flight, seconds: past it, HTTP 503 "
                    "queue_timeout with Retry-After (a request's X-Lamina-Max-Queue-Wait may tighten it; "
                    "unset: no bound)"})
    connect_timeout_s: float = attrs.field(default=5.0, validator=attrs.validators.gt(0.0), metadata={
        "help": "time allowed to open a connection to the upstream"})
    read_timeout_s: float = attrs.field(default=600.0, validator=attrs.validators.gt(0.0), metadata={
        "help": "longest silence allowed while waiting for the upstream's next bytes"})
    start_timeout_s: float = attrs.field(default=600.0, validator=attrs.validators.gt(0.0), metadata={
        "help": "how long start() waits for the upstream to become healthy"})
    poll_interval_s: float = attrs.field(default=0.5, validator=attrs.validators.gt(0.0), metadata={
        "help": "how often the upstream's health and load are read"})
