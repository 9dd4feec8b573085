"""A small Python client for Lamina's HTTP API that streams with any installed codec.

Whichever codec carries the stream — OpenAI SSE, STC, STC with zstd — the client yields
the same typed :class:`~lamina_hookspecs.types.TokenChunk` values: it asks for the codec's
media type with ``Accept`` and decodes with that codec's own decoder, found through the
installed plugins (built with default options). Errors come back as the
:class:`~lamina_hookspecs.errors.LaminaError` subclass the server raised::

    with LaminaClient("http://127.0.0.1:8000") as client:
        for chunk in client.stream_completion(model="echo", prompt="hello there", codec="stc"):
            print(chunk.text, end="", flush=True)

:class:`AsyncLaminaClient` is the same on ``asyncio``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any

import httpx
import orjson

from lamina_hookspecs import layers
from lamina_hookspecs.errors import (
    AuthenticationError, CodecError, InternalError, InvalidRequestError, LaminaError, NotAcceptableError,
    NotFoundError, PayloadTooLargeError, PermissionDeniedError, RateLimitError, RequestTimeoutError,
    ServiceUnavailableError, UnsupportedMediaTypeError,
)
from lamina_hookspecs.protocols import Codec, StreamDecoder
from lamina_hookspecs.registration import BuildContext
from lamina_hookspecs.types import Completion, StreamError, TokenChunk, Usage
from lamina.kernel.options import build_options
from lamina.kernel.plugins import load_plugins

CODEC_ALIASES = {"sse": "openai-sse"}
"""Short codec names the client accepts besides the registered ones."""

# the status-specific 400-family classes first: for the shared openai_type the last one wins
_ERRORS = (NotAcceptableError, PayloadTooLargeError, UnsupportedMediaTypeError, InvalidRequestError, AuthenticationError, PermissionDeniedError, NotFoundError, RateLimitError,
           ServiceUnavailableError, RequestTimeoutError, CodecError, InternalError)
_BY_STATUS: dict[int, type[LaminaError]] = {cls.http_status: cls for cls in _ERRORS}
_BY_TYPE: dict[str, type[LaminaError]] = {cls.openai_type: cls for cls in _ERRORS}

Messages = Sequence[Mapping[str, str]]


def load_codec(name: str) -> Codec:
    """The installed codec ``name`` (or an alias: ``"sse"``), built with its default options.
    Raises :class:`~lamina_hookspecs.errors.ConfigError` naming the installed codecs if there is none."""
    component = load_plugins().registry.get((layers.CODEC,), CODEC_ALIASES.get(name, name), "codec")
    codec: Codec = component.factory(build_options(component.options, {}, "codec"), BuildContext(stack_name="client"))
    return codec


def _request(model: str, prompt: str | None, messages: Messages | None, stream: bool,
             sampling: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """The path and JSON body of a completion (``prompt``) or chat (``messages``) request."""
    if (prompt is None) == (messages is None):
        raise ValueError("give exactly one of prompt= (a completion) and messages= (a chat)")
    body: dict[str, Any] = {"model": model, **sampling, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    if messages is not None:
        return "/v1/chat/completions", {**body, "messages": [dict(m) for m in messages]}
    return "/v1/completions", {**body, "prompt": prompt}


def http_error(response: httpx.Response) -> LaminaError:
    """The error a non-200 response reports: the ``LaminaError`` subclass of its status, or
    a plain ``LaminaError`` carrying the status for one without a class (409, say)."""
    try:
        error = orjson.loads(response.content)["error"]
        message, param, code = str(error["message"]), error.get("param"), error.get("code")
    except (orjson.JSONDecodeError, KeyError, TypeError):
        message, param, code = response.text[:500] or response.reason_phrase, None, None
    retry_after = response.headers.get("retry-after")
    kwargs: dict[str, Any] = {"param": param, "code": code,
                              "retry_after": float(retry_after) if retry_after and retry_after.isdigit() else None}
    cls = _BY_STATUS.get(response.status_code)
    if cls is None:
        generic = LaminaError(f"HTTP {response.status_code}: {message}", **kwargs)
        generic.http_status = response.status_code  # type: ignore[misc]
        return generic
    return cls(message, **kwargs)


def stream_error(error: StreamError) -> LaminaError:
    """An error reported inside a stream, as the ``LaminaError`` subclass of its type."""
    return _BY_TYPE.get(error.type, LaminaError)(error.message, code=error.code)


def _chunks(decoder: StreamDecoder, data: bytes) -> Iterator[TokenChunk]:
    for item in decoder.feed(data):
        if isinstance(item, TokenChunk):
            yield item
        elif isinstance(item, StreamError):
            raise stream_error(item)


def _check_media_type(response: httpx.Response, codec: Codec) -> None:
    answered = response.headers.get("content-type", "").split(";")[0].strip().lower()
    if answered != codec.media_type:
        raise CodecError(f"asked for {codec.media_type} but the server answered {answered or 'no content type'}")


def _completion(payload: Mapping[str, Any]) -> Completion:
    """A non-streamed OpenAI response body as a :class:`Completion` (it carries no token ids)."""
    try:
        choice, usage = payload["choices"][0], payload["usage"]
        text = choice["message"]["content"] if "message" in choice else choice["text"]
        return Completion(request_id=payload["id"], text=text, token_ids=(), finish_reason=choice["finish_reason"],
                          usage=Usage(prompt_tokens=usage["prompt_tokens"],
                                      completion_tokens=usage["completion_tokens"],
                                      cached_tokens=(usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)))
    except (KeyError, IndexError, TypeError) as exc:
        raise CodecError(f"the server's completion body lacks {exc}") from None


class _Codecs:
    """Codecs by name, built on first use from the installed plugins."""

    def __init__(self) -> None:
        self._built: dict[str, Codec] = {}

    def __call__(self, codec: str | Codec) -> Codec:
        if not isinstance(codec, str):
            return codec
        if codec not in self._built:
            self._built[codec] = load_codec(codec)
        return self._built[codec]


def _headers(api_key: str | None) -> dict[str, str]:
    return {"authorization": f"Bearer {api_key}"} if api_key else {}


class LaminaClient:
    """A synchronous client for one Lamina server.

    :param base_url: the server's root, e.g. ``http://127.0.0.1:8000``.
    :param api_key: sent as a bearer token when given.
    :param timeout: seconds httpx waits to connect and for each read.
    """

    def __init__(self, base_url: str, *, api_key: str | None = None, timeout: float = 60.0) -> None:
        self._http = httpx.Client(base_url=base_url.rstrip("/"), headers=_headers(api_key), timeout=timeout)
        self._codecs = _Codecs()

    def stream_completion(self, *, model: str, prompt: str | None = None, messages: Messages | None = None,
                          codec: str | Codec = "sse", **sampling: Any) -> Iterator[TokenChunk]:
        """Stream a completion (``prompt``) or a chat (``messages``) as ``TokenChunk``s; the
        last has ``finish_reason`` and ``usage``. ``codec`` is an installed codec's name
        (``"sse"``, ``"stc"``, ``"stc-zstd"``) or a codec object; ``sampling`` holds OpenAI
        body fields (``max_tokens=8, temperature=0``). Raises ``LaminaError``."""
        wire = self._codecs(codec)
        path, body = _request(model, prompt, messages, True, sampling)
        with self._http.stream("POST", path, content=orjson.dumps(body),
                               headers={"accept": wire.media_type, "content-type": "application/json"}) as response:
            if response.status_code != 200:
                response.read()
                raise http_error(response)
            _check_media_type(response, wire)
            decoder = wire.decoder()
            for data in response.iter_bytes():
                yield from _chunks(decoder, data)
            decoder.close()

    def complete(self, *, model: str, prompt: str | None = None, messages: Messages | None = None,
                 **sampling: Any) -> Completion:
        """A whole completion or chat answer (OpenAI's non-streamed body has no token ids)."""
        path, body = _request(model, prompt, messages, False, sampling)
        response = self._http.post(path, content=orjson.dumps(body), headers={"content-type": "application/json"})
        if response.status_code != 200:
            raise http_error(response)
        return _completion(orjson.loads(response.content))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> LaminaClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncLaminaClient:
    """:class:`LaminaClient` on ``asyncio`` (``httpx.AsyncClient``); same parameters."""

    def __init__(self, base_url: str, *, api_key: str | None = None, timeout: float = 60.0,
                 max_connections: int = 100) -> None:
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self._http = httpx.AsyncClient(base_url=base_url.rstrip("/"), headers=_headers(api_key), timeout=timeout,
                                       limits=limits)
        self._codecs = _Codecs()

    async def stream_completion(self, *, model: str, prompt: str | None = None, messages: Messages | None = None,
                                codec: str | Codec = "sse", **sampling: Any) -> AsyncIterator[TokenChunk]:
        """See :meth:`LaminaClient.stream_completion`."""
        wire = self._codecs(codec)
        path, body = _request(model, prompt, messages, True, sampling)
        async with self._http.stream("POST", path, content=orjson.dumps(body),
                                     headers={"accept": wire.media_type,
                                              "content-type": "application/json"}) as response:
            if response.status_code != 200:
                await response.aread()
                raise http_error(response)
            _check_media_type(response, wire)
            decoder = wire.decoder()
            async for data in response.aiter_bytes():
                for chunk in _chunks(decoder, data):
                    yield chunk
            decoder.close()

    async def complete(self, *, model: str, prompt: str | None = None, messages: Messages | None = None,
                       **sampling: Any) -> Completion:
        """See :meth:`LaminaClient.complete`."""
        path, body = _request(model, prompt, messages, False, sampling)
        response = await self._http.post(path, content=orjson.dumps(body),
                                         headers={"content-type": "application/json"})
        if response.status_code != 200:
            raise http_error(response)
        return _completion(orjson.loads(response.content))

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncLaminaClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
