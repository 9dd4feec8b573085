"""Load generation: arrival processes and the async runner that streams requests and times them.

Every request is a streaming call to an OpenAI-compatible endpoint (``/v1/completions`` or
``/v1/chat/completions``), so the runner works against Lamina, vLLM, SGLang, llama.cpp, ...
It parses the SSE chunks itself: an output token is a chunk with non-empty ``text`` (or
``delta.content``), timestamped when its line arrives; the ``usage`` of the final chunk
(``stream_options.include_usage``) gives the output token count when the server sends one.
Failures are recorded with a kind (``http_429``, ``timeout``, ``connect``, ``stream_error``, ...),
never dropped.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx
import orjson

from lamina.tools.bench.workloads import BenchRequest


@dataclass(frozen=True)
class Load:
    """How requests arrive: open-loop (``poisson`` or ``constant`` at ``rate`` req/s; ``rate=inf``
    sends all at once), optionally capped at ``max_concurrency`` in flight, or ``closed`` loop with
    ``concurrency`` requests always in flight."""

    kind: str = "closed"
    rate: float = math.inf
    concurrency: int = 1
    max_concurrency: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("poisson", "constant", "closed"):
            raise ValueError(f"unknown arrival process {self.kind!r}: poisson, constant or closed")
        if self.kind == "closed" and self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if self.kind != "closed" and not self.rate > 0:
            raise ValueError("rate must be positive")

    @property
    def label(self) -> str:
        if self.kind == "closed":
            return f"concurrency={self.concurrency}"
        rate = "inf" if math.isinf(self.rate) else f"{self.rate:g}"
        cap = f",max_concurrency={self.max_concurrency}" if self.max_concurrency else ""
        return f"{self.kind} rate={rate}/s{cap}"

    def arrivals(self, n: int, seed: int) -> list[float]:
        """Send times (seconds from the start) of ``n`` open-loop requests."""
        if math.isinf(self.rate):
            return [0.0] * n
        rng, t, out = random.Random(seed), 0.0, []
        for _ in range(n):
            out.append(t)
            t += rng.expovariate(self.rate) if self.kind == "poisson" else 1.0 / self.rate
        return out


@dataclass
class Record:
    """One request's measurements; times in seconds, ``start`` from the start of its run."""

    index: int
    target: str = ""
    level: str = ""
    round: int = 0
    warmup: bool = False
    start: float = 0.0
    ok: bool = False
    error: str | None = None
    """The error's kind: ``http_<status>``, ``timeout``, ``connect``, ``transport``, ``stream_error``,
    ``bad_response``, ``empty_output``."""
    message: str | None = None
    code: str | None = None
    """The ``code`` of the server's error body (``queue_full``, ``queue_timeout``, ...), if it sent one."""
    error_s: float | None = None
    """Seconds from sending until the error status came back (an HTTP error only)."""
    ttft: float | None = None
    e2e: float | None = None
    itl: list[float] = field(default_factory=list)
    output_tokens: int = 0
    """From the server's ``usage`` if sent, else the number of chunks with text."""
    chunks: int = 0
    prompt_tokens: int | None = None
    """From the server's ``usage`` if sent, else the workload's estimate."""
    cached_tokens: int | None = None
    """Prompt tokens the server served from its prefix cache (``usage.prompt_tokens_details``), if sent."""
    max_tokens: int = 0
    usage: bool = False

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first: ``(e2e - ttft) / (output_tokens - 1)``."""
        if self.ttft is None or self.e2e is None or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "tpot": self.tpot}


@dataclass(frozen=True)
class Endpoint:
    """Where and how to send: base URL, model, API flavour and extra body fields."""

    url: str
    model: str
    api: str = "completions"
    api_key: str | None = None
    ignore_eos: bool = True
    extra_body: dict[str, Any] = field(default_factory=dict)
    timeout_s: float = 300.0
    """httpx's timeout for each step (connecting, the response's headers, each read)."""
    extra_headers: dict[str, str] = field(default_factory=dict)

    def path_and_body(self, request: BenchRequest) -> tuple[str, dict[str, Any]]:
        body: dict[str, Any] = {"model": self.model, "max_tokens": request.max_tokens, "stream": True,
                                "stream_options": {"include_usage": True}, "temperature": 0.0}
        if self.ignore_eos:
            body["ignore_eos"] = True
        body.update(self.extra_body)
        body.update(request.extra)
        if self.api == "chat":
            return "/v1/chat/completions", {**body, "messages": request.chat_messages()}
        return "/v1/completions", {**body, "prompt": request.completion_prompt()}

    def headers(self) -> dict[str, str]:
        auth = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        return {**self.extra_headers, **auth}


def _error(content: bytes) -> dict[str, Any] | None:
    try:
        error = orjson.loads(content)["error"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return None
    return error if isinstance(error, dict) else None


def _error_text(content: bytes) -> str:
    error = _error(content)
    if error is None:
        return content[:300].decode("utf-8", "replace")
    return f"{error.get('type', '')}: {error.get('message', '')}".strip(": ")


def _chunk_text(payload: dict[str, Any]) -> str:
    choices = payload.get("choices") or []
    if not choices:
        return ""
    choice = choices[0]
    if "delta" in choice:
        delta = choice.get("delta") or {}
        return (delta.get("content") or "") + (delta.get("reasoning_content") or "")
    return choice.get("text") or ""


async def send(client: httpx.AsyncClient, endpoint: Endpoint, request: BenchRequest, record: Record) -> Record:
    """Stream ``request`` to ``endpoint`` and fill ``record`` with what was measured."""
    path, body = endpoint.path_and_body(request)
    record.max_tokens = request.max_tokens
    record.prompt_tokens = request.prompt_tokens
    began = time.perf_counter()
    last: float | None = None
    try:
        async with client.stream("POST", endpoint.url.rstrip("/") + path, json=body, headers=endpoint.headers(),
                                 timeout=endpoint.timeout_s) as response:
            if response.status_code != 200:
                content = await response.aread()
                record.error_s = time.perf_counter() - began
                record.error, record.message = f"http_{response.status_code}", _error_text(content)
                code = (_error(content) or {}).get("code")
                record.code = None if code is None else str(code)
                return record
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                now = time.perf_counter()
                try:
                    payload = orjson.loads(data)
                except orjson.JSONDecodeError:
                    record.error, record.message = "bad_response", data[:300]
                    return record
                if "error" in payload:
                    record.error, record.message = "stream_error", _error_text(data.encode())
                    return record
                if _chunk_text(payload):
                    if last is None:
                        record.ttft = now - began
                    else:
                        record.itl.append(now - last)
                    last = now
                    record.chunks += 1
                usage = payload.get("usage")
                if usage:
                    record.usage = True
                    record.output_tokens = int(usage.get("completion_tokens") or 0)
                    if usage.get("prompt_tokens") is not None:
                        record.prompt_tokens = int(usage["prompt_tokens"])
                    details = usage.get("prompt_tokens_details") or {}
                    if details.get("cached_tokens") is not None:
                        record.cached_tokens = int(details["cached_tokens"])
    except httpx.TimeoutException as exc:
        record.error, record.message = "timeout", repr(exc)
        return record
    except httpx.ConnectError as exc:
        record.error, record.message = "connect", repr(exc)
        return record
    except httpx.HTTPError as exc:
        record.error, record.message = "transport", repr(exc)
        return record
    record.e2e = time.perf_counter() - began
    if not record.usage:
        record.output_tokens = record.chunks
    if record.chunks == 0:
        record.error, record.message = "empty_output", "the stream ended without any text"
        return record
    record.ok = True
    return record


@dataclass
class RunResult:
    """The records of one run (one target, one load level, one round) and its wall time."""

    records: list[Record]
    duration_s: float


def _client(limit: int | None) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=limit, max_keepalive_connections=limit)
    return httpx.AsyncClient(limits=limits, timeout=None)


async def run(endpoint: Endpoint, requests: Sequence[BenchRequest], load: Load, *, seed: int = 0,
              duration_s: float | None = None, on_done: Callable[[Record], None] | None = None,
              first_index: int = 0, tags: dict[str, Any] | None = None) -> RunResult:
    """Send ``requests`` to ``endpoint`` as ``load`` says; stop issuing new ones after ``duration_s``
    (those in flight finish). Requests never issued get no record."""
    tags = tags or {}
    records: list[Record] = []
    limit = load.concurrency if load.kind == "closed" else load.max_concurrency

    def new_record(i: int) -> Record:
        record = Record(index=first_index + i, **tags)
        records.append(record)
        return record

    async def one(client: httpx.AsyncClient, i: int, began: float) -> None:
        record = new_record(i)
        record.start = time.perf_counter() - began
        await send(client, endpoint, requests[i], record)
        if on_done is not None:
            on_done(record)

    async with _client(limit) as client:
        began = time.perf_counter()
        deadline = began + duration_s if duration_s else math.inf
        if load.kind == "closed":
            queue = iter(range(len(requests)))

            async def worker() -> None:
                for i in queue:
                    if time.perf_counter() >= deadline:
                        return
                    await one(client, i, began)

            await asyncio.gather(*(worker() for _ in range(min(load.concurrency, len(requests)))))
        else:
            semaphore = asyncio.Semaphore(load.max_concurrency) if load.max_concurrency else None

            async def gated(i: int) -> None:
                if semaphore is None:
                    await one(client, i, began)
                    return
                async with semaphore:
                    await one(client, i, began)

            tasks = []
            for i, at in enumerate(load.arrivals(len(requests), seed)):
                wait = began + at - time.perf_counter()
                if began + at >= deadline:
                    break
                if wait > 0:
                    await asyncio.sleep(wait)
                tasks.append(asyncio.create_task(gated(i)))
            await asyncio.gather(*tasks)
        duration = time.perf_counter() - began
    records.sort(key=lambda r: r.index)
    return RunResult(records, duration)


async def discover_model(url: str, api_key: str | None = None, timeout_s: float = 30.0) -> str:
    """The first model ``GET /v1/models`` lists."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(timeout=timeout_s) as client:
        response = await client.get(url.rstrip("/") + "/v1/models", headers=headers)
        response.raise_for_status()
        models = response.json().get("data") or []
    if not models:
        raise RuntimeError(f"{url}/v1/models lists no models; give --model")
    return str(models[0]["id"])
