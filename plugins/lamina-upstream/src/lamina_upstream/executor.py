"""The ``openai-upstream`` executor: an OpenAI-compatible server (llama-server, vLLM, SGLang, TGI,
another Lamina, or any other as ``generic``) behind Lamina's admission, routing, A/B splits, canaries and SLOs.

``generate`` streams the upstream's ``/v1/completions`` or ``/v1/chat/completions``
(:mod:`lamina_upstream.upstream_body`) and turns its events into chunks
(:mod:`lamina_upstream.upstream_stream`); closing the iterator closes the HTTP stream, which
llama-server, vLLM and Lamina all take as the client leaving, and abort. At most
``max_in_flight`` requests are sent at once; the rest wait here, each no longer than its
``max_queue_wait_s``. A background task reads the upstream's health and load every
``poll_interval_s`` (:mod:`lamina_upstream.upstream_load`), and ``state()`` reports the larger
of that and what this executor itself has in flight, so a burst is routed on current numbers.

Upstream errors come back as Lamina's: a 4xx keeps its status class and message; a failed
connection, a 5xx or a stream cut short is :class:`~lamina_hookspecs.errors.BackendLostError`
(core retries it on another backend while no token was sent).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import attrs
import orjson

from lamina_hookspecs.errors import (
    BackendLostError, ConfigError, InternalError, InvalidRequestError, LaminaError, NotFoundError,
    PayloadTooLargeError, RateLimitError, RequestTimeoutError, ServiceUnavailableError, TokenizerNotAvailableError,
)
from lamina_hookspecs.registration import BuildContext
from lamina_hookspecs.types import BackendState, ModelInfo, Request, TokenChunk
from lamina_upstream.options import OWNED_BY, TEXT_ONLY, Engine, UpstreamOptions
from lamina_upstream.upstream_body import CHAT_PATH, upstream_call
from lamina_upstream.upstream_http import ReadTimeout, Response, UpstreamHttp
from lamina_upstream.upstream_load import HEALTH_PATH, UpstreamLoad, load_from_metrics, load_from_slots
from lamina_upstream.upstream_stream import UpstreamStream
from lamina_upstream.upstream_tokens import (DETOKENIZE_PATH, TEMPLATE_PATH, TOKENIZE_PATH, answer,
                                             detokenize_body, template_body, tokenize_body)

KV_SCALE = 1000
"""An upstream reports KV usage as a fraction; ``state()`` gives it as blocks out of this many."""
RATE_HALF_LIFE_S = 5.0
"""Half-life of the moving average behind ``state().tokens_per_s``."""
MAX_LINE_BYTES = 1 << 20
"""Longest stream line accepted from the upstream."""

CLOSES_AFTER_STREAM: frozenset[Engine] = frozenset({"llama-server"})
"""Engines that close a connection once they have streamed a response over it (llama-server, while
still announcing keep-alive). Every request to one asks for ``Connection: close`` and gets its own
connection, opened ahead for POSTs (:class:`~lamina_upstream.upstream_http.UpstreamHttp` with
``fresh``): pooled, a streamed-over connection would be reused before the close arrived, and that
request fail with nothing sent."""

_TRANSPORT_ERRORS = (OSError, TimeoutError)
"""What the client raises for a connection refused, lost or timed out (``connect_timeout_s``,
``read_timeout_s``): :class:`~lamina_upstream.upstream_http.UpstreamLost` among them."""


@attrs.frozen
class _Answer:
    """An upstream's whole answer to one request."""

    status: int
    body: bytes
    retry_after: str | None

    @classmethod
    async def read(cls, response: Response) -> _Answer:
        return cls(response.status, await response.read(), response.headers.get("retry-after"))


_CLIENT_ERRORS: dict[int, type[LaminaError]] = {400: InvalidRequestError, 404: NotFoundError,
                                                413: PayloadTooLargeError, 422: InvalidRequestError,
                                                429: RateLimitError, 504: RequestTimeoutError}


class UpstreamExecutor:
    """Streams requests from one OpenAI-compatible upstream server."""

    def __init__(self, options: UpstreamOptions) -> None:
        self.options = options
        self.model = ModelInfo(id=options.served_name or options.model or "upstream",
                               context_length=options.context_length or 1)
        self.engine: Engine | None = None if options.engine == "auto" else options.engine
        self._upstream_model = options.model
        self._http: UpstreamHttp | None = None
        self._gate = asyncio.Semaphore(options.max_in_flight)
        self._waiting = 0
        self._streams: dict[object, int] = {}  # per request sent or waiting: its tokens still to come
        self._load = UpstreamLoad()
        self._others = 0  # requests the upstream held for other clients at the last poll
        self._load_path = "/metrics"
        self._healthy = False
        self._generated = 0
        self._rate = 0.0
        self._poller: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Connect, find the model and the engine, wait until the upstream is healthy, start polling;
        a start that fails closes what it opened."""
        self._http = self._client(fresh=self.engine in CLOSES_AFTER_STREAM)
        try:
            await self._connect()
        except BaseException:
            await self._http.close()
            raise
        self._poller = asyncio.create_task(self._poll(), name=f"upstream-poll {self.options.url}")

    async def _connect(self) -> None:
        assert self._http is not None
        deadline = time.monotonic() + self.options.start_timeout_s
        entry = await self._model_entry(deadline)
        if self.engine is None:
            self.engine = OWNED_BY.get(str(entry.get("owned_by")), "generic")
            if self.engine in CLOSES_AFTER_STREAM:
                await self._http.close()
                self._http = self._client(fresh=True)
        self._upstream_model = str(entry["id"])
        self.model = ModelInfo(id=self.options.served_name or self._upstream_model,
                               context_length=self.options.context_length or await self._context_length(entry))
        while not await self._poll_once():
            if time.monotonic() > deadline:
                raise BackendLostError(f"upstream {self.options.url} was not healthy within "
                                       f"{self.options.start_timeout_s:g} s")
            await asyncio.sleep(self.options.poll_interval_s)

    def _client(self, *, fresh: bool) -> UpstreamHttp:
        headers = {}
        if self.options.api_key_env:
            key = os.environ.get(self.options.api_key_env)
            if not key:
                raise ConfigError("api_key_env", f"environment variable {self.options.api_key_env} is not set")
            headers["Authorization"] = f"Bearer {key}"
        return UpstreamHttp(self.options.url, headers=headers, limit=self.options.max_in_flight + 4,  # + the poller's
                            connect_timeout_s=self.options.connect_timeout_s,
                            read_timeout_s=self.options.read_timeout_s, fresh=fresh)

    async def stop(self) -> None:
        """Stop polling and close every connection (streams still open end as lost)."""
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
        if self._http is not None:
            await self._http.close()

    def state(self) -> BackendState:
        load, kv = self._load, self._load.kv_usage
        return BackendState(
            name="openai-upstream", model=self.model.id, healthy=self._healthy,
            outstanding_requests=len(self._streams) + self._others,
            outstanding_tokens=sum(self._streams.values()), queue_depth=self._waiting + load.waiting,
            kv_blocks_used=0 if kv is None else round(kv * KV_SCALE), kv_blocks_total=0 if kv is None else KV_SCALE,
            tokens_per_s=self._rate)

    def generate(self, request: Request) -> AsyncIterator[TokenChunk]:
        path, body = upstream_call(request, self._upstream_model, self._started())
        return self._stream(request, path, body)

    async def tokenize(self, request: Request, *, add_special_tokens: bool = True,
                       add_generation_prompt: bool = True) -> list[int]:
        """The upstream's own tokenization (:mod:`lamina_upstream.upstream_tokens`)."""
        if request.prompt_token_ids is not None:
            return list(request.prompt_token_ids)
        self._tokenizes()
        rendered = None
        if self.engine == "llama-server" and request.messages is not None:
            rendered = answer(await self._post(TEMPLATE_PATH, template_body(request, add_generation_prompt)),
                              "prompt", str, self.options.url)
        body = tokenize_body(request, self._upstream_model, self._started(), add_special_tokens=add_special_tokens,
                             add_generation_prompt=add_generation_prompt, rendered=rendered)
        return answer(await self._post(TOKENIZE_PATH, body), "tokens", list, self.options.url)

    async def detokenize(self, token_ids: Sequence[int]) -> str:
        engine = self._tokenizes()
        payload = await self._post(DETOKENIZE_PATH, detokenize_body(token_ids, self._upstream_model, engine))
        return answer(payload, "content" if engine == "llama-server" else "prompt", str,
                      self.options.url)

    def _tokenizes(self) -> Engine:
        engine = self._started()
        if engine in TEXT_ONLY:
            raise TokenizerNotAvailableError(f"upstream {self.options.url} ({engine}) is read for text alone; "
                                             "Lamina does not reach its tokenizer")
        return engine

    def _started(self) -> Engine:
        if self._http is None or self.engine is None:
            raise BackendLostError(f"upstream {self.options.url} is not started")
        return self.engine

    async def _fetch(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> _Answer:
        """One whole request to the upstream (its connection errors raised as the client's)."""
        assert self._http is not None
        async with self._http.request(method, path, None if body is None else orjson.dumps(body)) as response:
            return await _Answer.read(response)

    async def _post(self, path: str, body: Mapping[str, Any]) -> Mapping[str, Any]:
        """POST ``body`` to the upstream and return its JSON answer; its errors as Lamina's."""
        try:
            answer = await self._fetch("POST", path, body)
        except _TRANSPORT_ERRORS as exc:
            raise _lost(self.options.url, exc) from None
        if answer.status != 200:
            raise _http_error(answer, self.options.url)
        return _json(answer.body)

    async def _stream(self, request: Request, path: str, body: Mapping[str, Any]) -> AsyncIterator[TokenChunk]:
        assert self._http is not None
        prompt = request.estimated_prompt_tokens()
        total = request.estimated_tokens(self.model.context_length)
        budget = total - prompt
        stream_key = object()
        self._streams[stream_key] = total
        try:
            await self._enter(request)
            try:
                async with self._http.request("POST", path, orjson.dumps(body)) as response:
                    if response.status != 200:
                        raise _http_error(await _Answer.read(response), self.options.url)
                    reader = UpstreamStream(request.id, chat=path == CHAT_PATH, logprobs=request.sampling.logprobs,
                                            prompt_tokens=prompt, text_only=self.engine in TEXT_ONLY)
                    async for data in _event_data(response.iter_blocks()):
                        if data == b"[DONE]":  # read on to the body's end, so the connection can be reused
                            continue
                        chunk = reader.event(_json(data))
                        if chunk is not None:
                            self._generated += reader.emitted - chunk.index
                            self._streams[stream_key] = max(budget - reader.emitted, 0)
                            yield chunk
                yield reader.final()  # the response is closed by now: its connection is back in the pool (or shut)
            except ReadTimeout:
                raise RequestTimeoutError(f"upstream {self.options.url} sent nothing for "
                                          f"{self.options.read_timeout_s:g} s") from None
            except _TRANSPORT_ERRORS as exc:
                raise _lost(self.options.url, exc) from None
            finally:
                self._gate.release()
        finally:
            del self._streams[stream_key]

    async def _enter(self, request: Request) -> None:
        """Take a place among the ``max_in_flight``, waiting no longer than the request allows."""
        if not self._gate.locked():
            await self._gate.acquire()
            return
        bounds = [b for b in (self.options.max_queue_wait_s, request.max_queue_wait_s) if b is not None]
        bound = min(bounds, default=None)
        self._waiting += 1
        try:
            await asyncio.wait_for(self._gate.acquire(), bound)
        except TimeoutError:
            raise ServiceUnavailableError(f"waited {bound:g} s for one of the {self.options.max_in_flight} "
                                          "places in flight to the upstream", code="queue_timeout",
                                          retry_after=1.0) from None
        finally:
            self._waiting -= 1

    async def _model_entry(self, deadline: float) -> Mapping[str, Any]:
        """The upstream's ``/v1/models`` entry for the model to request, retried until ``deadline``."""
        while True:
            try:
                answer = await self._fetch("GET", "/v1/models")
                if answer.status == 200:
                    break
                problem = f"answered {answer.status}"
            except _TRANSPORT_ERRORS as exc:
                problem = f"{type(exc).__name__}: {exc}"
            if time.monotonic() > deadline:
                raise BackendLostError(f"upstream {self.options.url}/v1/models {problem}")
            await asyncio.sleep(self.options.poll_interval_s)
        entries = [e for e in _json(answer.body).get("data", []) if isinstance(e, Mapping) and "id" in e]
        if not entries:
            raise ConfigError("url", f"{self.options.url}/v1/models lists no model")
        if not self.options.model:
            return entries[0]
        for entry in entries:
            if entry["id"] == self.options.model:
                return entry
        raise ConfigError("model", f"{self.options.url} does not serve {self.options.model!r}; it serves "
                                   f"{', '.join(str(e['id']) for e in entries)}")

    async def _context_length(self, entry: Mapping[str, Any]) -> int:
        """The context the upstream allows per request: the ``max_model_len`` of vLLM's, SGLang's and
        Lamina's ``/v1/models``, the slot context in llama-server's ``/props``, ``max_total_tokens`` in
        TGI's ``/info``."""
        if isinstance(entry.get("max_model_len"), int):
            return entry["max_model_len"]
        n_ctx = None
        if self.engine == "llama-server":
            n_ctx = _json((await self._fetch("GET", "/props")).body).get("default_generation_settings", {}).get("n_ctx")
        elif self.engine == "tgi":
            n_ctx = _json((await self._fetch("GET", "/info")).body).get("max_total_tokens")
        if isinstance(n_ctx, int) and n_ctx > 0:
            return n_ctx
        raise ConfigError("context_length", f"{self.options.url} does not report its context length; set it")

    async def _poll(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(self.options.poll_interval_s)
            await self._poll_once()
            now = time.monotonic()
            weight = 0.5 ** ((now - last) / RATE_HALF_LIFE_S)
            self._rate = weight * self._rate + (1 - weight) * self._generated / (now - last)
            self._generated, last = 0, now

    async def _poll_once(self) -> bool:
        """Read the upstream's health and load; return whether it is healthy."""
        assert self.engine is not None
        try:
            health = await self._fetch("GET", HEALTH_PATH[self.engine])
            self._healthy = health.status == 200
            if self.engine == "generic":  # reports no load Lamina can read
                return self._healthy
            answer = await self._fetch("GET", self._load_path)
            if answer.status == 200:
                self._observe(load_from_metrics(answer.body.decode(), self.engine) if self._load_path == "/metrics"
                              else load_from_slots(orjson.loads(answer.body)))
            elif self._load_path == "/metrics" and self.engine == "llama-server":
                self._load_path = "/slots"  # llama-server without --metrics: read its slots from now on
        except (*_TRANSPORT_ERRORS, ValueError):
            self._healthy = False
        return self._healthy

    def _observe(self, load: UpstreamLoad) -> None:
        """Keep the upstream's load, and the part of it that is not ours: ``state()`` adds that to
        what is in flight from here now, which is exact between polls."""
        self._load = load
        self._others = max(load.running + load.waiting - (len(self._streams) - self._waiting), 0)


async def _event_data(blocks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The ``data`` of each server-sent event of a response body (as it arrives, in ``blocks``), joined
    per event. Lines end in LF or CRLF (every OpenAI-compatible server's; SSE's lone CR is not read as
    an end)."""
    data: list[bytes] = []
    pending = b""
    async for block in blocks:
        *lines, pending = (pending + block).split(b"\n")
        if len(pending) > MAX_LINE_BYTES or any(len(line) > MAX_LINE_BYTES for line in lines):
            raise BackendLostError(f"upstream sent a stream line of over {MAX_LINE_BYTES} bytes")
        for line in lines:
            line = line.removesuffix(b"\r")
            if not line:
                if data:
                    yield b"\n".join(data)
                    data = []
            elif line.startswith(b"data:"):
                data.append(line[5:].removeprefix(b" "))
    if pending.startswith(b"data:"):
        data.append(pending[5:].removeprefix(b" "))
    if data:
        yield b"\n".join(data)


def _json(data: bytes) -> Mapping[str, Any]:
    try:
        payload = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise BackendLostError(f"upstream sent an event that is not JSON: {data[:200]!r}") from None
    if not isinstance(payload, Mapping):
        raise BackendLostError(f"upstream sent an event that is not a JSON object: {data[:200]!r}")
    return payload


def _lost(url: str, exc: BaseException) -> BackendLostError:
    return BackendLostError(f"upstream {url} was lost: {type(exc).__name__}: {exc}")


def _http_error(answer: _Answer, url: str) -> LaminaError:
    """The Lamina error an upstream's error response stands for."""
    try:
        error = orjson.loads(answer.body).get("error") or {}
    except (ValueError, AttributeError):
        error = {}
    if not isinstance(error, Mapping):
        error = {"message": str(error)}
    text = answer.body[:500].decode(errors="replace")
    message = str(error.get("message") or text or f"HTTP {answer.status}")
    status = answer.status
    retry_after = _seconds(answer.retry_after)
    code = str(error["code"]) if error.get("code") is not None else None
    if status in _CLIENT_ERRORS:
        param = error.get("param")
        return _CLIENT_ERRORS[status](message, param=str(param) if param is not None else None, code=code,
                                      retry_after=retry_after)
    if status in (401, 403):
        return InternalError(f"upstream {url} refused our credentials ({status}): {message}")
    return BackendLostError(f"upstream {url} answered {status}: {message}", code=code, retry_after=retry_after)


def _seconds(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def build_upstream(options: UpstreamOptions, context: BuildContext) -> UpstreamExecutor:
    """An OpenAI-compatible server elsewhere (llama-server, vLLM, Lamina) as this stack's executor."""
    return UpstreamExecutor(options)
