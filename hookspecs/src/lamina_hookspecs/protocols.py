"""One ``typing.Protocol`` per layer: what a component must provide.

Core resolves each layer to one object (or one per A/B arm) when the stack is built and
calls it directly through these methods; no pluggy dispatch happens per token. All
protocols are ``runtime_checkable`` so the conformance kit can check shape.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Literal, Protocol, runtime_checkable

from lamina_hookspecs.types import (
    BackendState,
    ModelInfo,
    PoolSnapshot,
    PrefixMatch,
    Principal,
    RateDecision,
    Request,
    ScaleDecision,
    SchedulerState,
    StreamError,
    StreamMeta,
    StructuredOutput,
    TokenChunk,
    Tool,
    ToolCall,
    ToolCallDelta,
    WarmPrefix,
    WorkerLaunch,
)

StreamItem = StreamMeta | TokenChunk | StreamError


@runtime_checkable
class Router(Protocol):
    """Layer 1: picks the backend that serves a request."""

    def choose(self, request: Request, backends: Sequence[BackendState]) -> BackendState:
        """Return one of ``backends``; never one that is not ``available`` while an
        available one exists. Raise :class:`~lamina_hookspecs.errors.NoBackendError`
        when none is available. Called once per request on the event loop; must not block.
        """
        ...


@runtime_checkable
class StreamEncoder(Protocol):
    """Encodes one response stream; one instance per stream."""

    def header(self, meta: StreamMeta) -> bytes:
        """Bytes that open the stream (may be empty)."""
        ...

    def chunk(self, chunk: TokenChunk) -> bytes:
        """Bytes for one chunk; the final chunk (``finish_reason`` set) also closes the stream."""
        ...

    def error(self, error: StreamError) -> bytes:
        """Bytes that report an error and close the stream."""
        ...


@runtime_checkable
class StreamDecoder(Protocol):
    """Incrementally decodes one stream; accepts bytes split anywhere."""

    def feed(self, data: bytes) -> list[StreamItem]:
        """Consume ``data`` and return every item it completed, in order. Raise
        :class:`~lamina_hookspecs.errors.CodecError` on malformed or oversized input."""
        ...

    def close(self) -> None:
        """Declare the end of input; raise ``CodecError`` if the stream was cut short."""
        ...


@runtime_checkable
class Codec(Protocol):
    """Layer 2: how tokens travel on the wire."""

    media_type: str

    def encoder(self) -> StreamEncoder:
        """A fresh encoder for one response stream."""
        ...

    def decoder(self) -> StreamDecoder:
        """A fresh decoder for one response stream (clients and tests use it)."""
        ...


@runtime_checkable
class Executor(Protocol):
    """Layer 3: computes tokens for requests, batching them as it likes."""

    model: ModelInfo

    async def start(self) -> None:
        """Load the model and start the engine; return when it can serve."""
        ...

    async def stop(self) -> None:
        """Abort running requests, free their KV slots and stop the engine."""
        ...

    def generate(self, request: Request) -> AsyncIterator[TokenChunk]:
        """Stream the request's output. The last chunk has ``finish_reason`` and ``usage``.
        Closing the iterator early (``aclose()``, client gone) aborts the request and
        frees its resources. Raise a :class:`~lamina_hookspecs.errors.LaminaError` for
        a request it cannot serve (``ContextLengthError``, ``InvalidRequestError``)."""
        ...

    def state(self) -> BackendState:
        """A cheap snapshot of load and KV usage, for routers, autoscalers and metrics."""
        ...


@runtime_checkable
class Tokenizes(Protocol):
    """What an executor that shows its tokenization adds (``POST /tokenize``, ``/detokenize``)."""

    async def tokenize(self, request: Request, *, add_special_tokens: bool = True,
                       add_generation_prompt: bool = True) -> list[int]:
        """The prompt ids ``request`` is served with: its prompt's ids, its prompt text encoded
        (``add_special_tokens``: BOS where the model adds it), or its messages rendered through
        the chat template (``add_generation_prompt``: ending where the reply starts).
        Raise ``InvalidRequestError`` for what :meth:`Executor.generate` would refuse, and
        ``TokenizerNotAvailableError`` where this instance cannot tokenize (what it fronts does not)."""
        ...

    async def detokenize(self, token_ids: Sequence[int]) -> str:
        """The text of ``token_ids``, special tokens included; ``InvalidRequestError`` for an id out of range."""
        ...


@runtime_checkable
class PrefixCache(Protocol):
    """Layer 4: maps prompt prefixes to stored KV blocks, isolated per ``salt`` (tenant).

    The cache records block ids; the executor owns the memory behind them and its allocator. The
    rules between the two (the cache never frees memory itself):

    - **Ids the cache stores are the cache's.** ``insert`` stores ``block_ids[i]`` for whole block
      ``i`` of ``token_ids`` only where it has no block yet for those tokens under that salt. From
      then on the executor must not free or reuse that id, until ``evict`` hands it back; the
      executor then returns it to its allocator.
    - **Ids the cache did not store stay the executor's.** A block the cache already had keeps
      its id, so the executor's duplicate is not taken and the executor frees it; so are the ids
      past the last whole block (a partially filled tail). After ``insert(tokens, blocks)`` the
      executor frees ``[b for b in blocks if not cache.owns(b)]``, which is also right for blocks
      that came from an earlier ``match`` (those are the cache's already).
    - **Inserting does not pin.** A stored block can go at the next ``evict``, so insert only
      blocks nothing reads any more (a sequence that finished or was preempted), or ``match`` the
      prefix to pin it before reading it again.
    - **Only computed K/V is inserted.** ``token_ids`` are tokens whose K/V is already written (a
      decoding sequence's last sampled token has none yet).
    - **A match pins.** Every block of a matched prefix is pinned and never evicted until the
      match is released, exactly once (``release`` of a match not outstanding raises
      ``ValueError``). The executor reads a match's blocks but never frees them.

    ``evict`` frees only unpinned blocks. A cache with a size bound of its own may drop blocks
    while inserting; it hands their ids back from the next ``evict``, first. A cache is called
    from one engine thread at a time;
    ``stats`` may be read from any thread.
    """

    block_size: int

    def match(self, token_ids: Sequence[int], *, salt: bytes) -> PrefixMatch:
        """The longest cached whole-block prefix of ``token_ids``; its blocks are pinned."""
        ...

    def insert(self, token_ids: Sequence[int], block_ids: Sequence[int], *, salt: bytes) -> None:
        """Record that ``block_ids`` hold the KV of ``token_ids`` (whole blocks only). The cache
        takes ownership of the ids it stores; the others (a prefix it already had, a partial
        last block) stay the caller's — ask :meth:`owns`."""
        ...

    def owns(self, block_id: int) -> bool:
        """Whether the cache holds ``block_id`` (the executor must then not free or reuse it)."""
        ...

    def release(self, match: PrefixMatch) -> None:
        """Unpin the blocks of a match once the request no longer reads them."""
        ...

    def evict(self, num_blocks: int) -> list[int]:
        """Free up to ``num_blocks`` unpinned blocks (least recently used first); return their ids."""
        ...

    def stats(self) -> Mapping[str, float]:
        """Counters for metrics: hit tokens, lookups, cached and evicted blocks."""
        ...


@runtime_checkable
class Autoscaler(Protocol):
    """Layer 5: decides how many replicas run, how many to warm and which to drain.

    The same object drives a live pool (core's pool controller calls it every
    ``[replicas] autoscale_interval_s``) and a replayed one (``lamina autoscale replay``), so it must
    take time only from ``snapshot.now``, never from a clock of its own.
    """

    def decide(self, snapshot: PoolSnapshot) -> ScaleDecision:
        """The replica count the pool should move to, given its state now."""
        ...


@runtime_checkable
class RateLimiter(Protocol):
    """Admission: limits the rate of requests, or of tokens, per key.

    Core reads ``key_by`` and ``unit`` to call ``acquire`` with the request's key (its
    tenant, its API key's id, or its client address) and cost (1 per request, or the
    prompt's estimated tokens plus ``max_tokens`` for each of its ``n`` choices). ``acquire``
    runs on the event loop, so an in-process limiter needs no lock; it must keep memory bounded
    however many keys it sees.
    """

    key_by: Literal["tenant", "api_key", "client"]
    unit: Literal["requests", "tokens"]

    def acquire(self, key: str, now: float, cost: float = 1.0) -> RateDecision:
        """Take ``cost`` units for ``key`` at time ``now`` (seconds, monotonic) if allowed;
        a refusal says in ``retry_after_s`` when the same cost would be allowed."""
        ...


@runtime_checkable
class Authenticator(Protocol):
    """Admission: turns the credential a request presents into the tenant it acts for."""

    def authenticate(self, credential: str | None) -> Principal:
        """Return who ``credential`` (the bearer token, ``None`` when absent) belongs to, or
        raise :class:`~lamina_hookspecs.errors.AuthenticationError` (HTTP 401). Compare
        secrets in constant time; never log or keep the credential itself."""
        ...


@runtime_checkable
class Validator(Protocol):
    """Admission: checks a request body before anything is started."""

    def validate(self, endpoint: str, body: Mapping[str, Any]) -> None:
        """Raise :class:`~lamina_hookspecs.errors.InvalidRequestError` naming the field
        (``param``) and the rule it broke; return ``None`` when the body is acceptable."""
        ...


@runtime_checkable
class Breaker(Protocol):
    """Admission: a circuit breaker per backend. Core asks it which backends may take work
    (an open circuit takes a backend out of the router's candidates), tells it which one a
    request went to, and reports how that request ended."""

    def retry_after(self, key: str, now: float) -> float | None:
        """``None`` when backend ``key`` may take a request now (closed, or half-open with a
        probe free); otherwise the seconds until it may. Must not change state."""
        ...

    def started(self, key: str, now: float) -> None:
        """A request was routed to ``key`` (in half-open state it is a probe)."""
        ...

    def record(self, key: str, ok: bool, now: float) -> None:
        """The outcome of a request routed to ``key``: ``ok`` unless the backend failed (5xx)."""
        ...


@runtime_checkable
class BatchingPolicy(Protocol):
    """Consulted by an executor's scheduler before it starts new prefills: whether to hold them
    a little longer, to gather more requests into one batch, and how many to start at once.

    The scheduler asks only while requests wait; decoding never waits for it. A policy takes
    time only from ``state.now`` (never from a clock of its own), so a test can replay it.
    """

    def wait_s(self, state: SchedulerState) -> float:
        """Seconds to keep holding new prefills (0: start them now). It must reach 0 once
        ``state.oldest_wait_s`` exceeds the policy's longest window, so no request waits for ever."""
        ...

    def max_prefills(self, state: SchedulerState) -> int:
        """The most new sequences to start prefilling in this step (at least 1)."""
        ...

    def observe(self, latency_s: float, state: SchedulerState) -> None:
        """Feedback after a step in which started requests got their first token: ``latency_s``
        is the longest of their times to first token (queueing, the window held, prefill)."""
        ...


@runtime_checkable
class PrewarmPolicy(Protocol):
    """Layer 4's pre-warm: notices prompt prefixes that recur across requests (system prompts,
    templates) and names those the executor should keep in its prefix cache — pinned against
    eviction while wanted, and computed ahead, when the executor is idle, if they are missing.

    Called from the executor's engine thread. A policy takes time only from ``now`` (never
    from a clock of its own) and keeps its memory bounded however many prompts it sees.
    """

    def observe(self, token_ids: Sequence[int], *, salt: bytes, now: float) -> None:
        """A prompt about to be prefilled under ``salt`` (its tenant's prefix-cache salt)."""
        ...

    def wanted(self, now: float) -> Sequence[WarmPrefix]:
        """The prefixes to keep cached now, most valuable first, within the policy's budget;
        each is a prefix of prompts it observed under the same salt."""
        ...


@runtime_checkable
class Observer(Protocol):
    """A configured lifecycle plugin: its ``@hookimpl`` methods (``lamina_request_wrap``,
    ``lamina_request_finished``, ...) are registered while the stack runs."""

    def close(self) -> None:
        """Flush and release what the observer holds (exporters, files); called once when
        the stack stops, after the last request."""
        ...


@runtime_checkable
class ReplicaHandle(Protocol):
    """One running ``lamina worker``, wherever a provider placed it."""

    address: str
    """``host:port`` of its gRPC API, reachable from the gateway."""

    def exited(self) -> int | None:
        """``None`` while it runs; its exit status (or -1 when unknown) once it is gone."""
        ...

    def stop(self) -> None:
        """Stop it and wait until it is gone. Blocking: core calls it off the event loop."""
        ...


@runtime_checkable
class ReplicaProvider(Protocol):
    """Where replicas run (layer 5's hands): local processes by default, or another placement
    (a Ray cluster) chosen with ``[replicas] provider``. Core's replica pool decides when to
    launch and stop; the provider only does it."""

    def launch(self, worker: WorkerLaunch) -> ReplicaHandle:
        """Start ``worker`` (core's command line and files: where and how is the provider's) and
        return once it has an address; it may still be loading its model. Blocking: core calls
        it off the event loop."""
        ...

    def close(self) -> None:
        """Release what the provider holds (a cluster connection); replicas are stopped first."""
        ...


@runtime_checkable
class ToolCallStream(Protocol):
    """Reads the tool calls out of one reply as its text arrives."""

    def feed(self, text: str) -> tuple[str, Sequence[ToolCallDelta]]:
        """Take the reply's next text; return the content to send now (text that is not part of a
        call; text that might begin one is held back) and the fragments of calls it completed."""
        ...

    def close(self) -> tuple[str, Sequence[ToolCallDelta]]:
        """The reply ended: what was held back, as content (an unfinished or malformed call is
        content) or as the calls it completes."""
        ...


@runtime_checkable
class ToolParser(Protocol):
    """A model family's way of calling tools (``[tool_parser]``): how it is told about them, the
    grammar a call follows and the calls read back from its output. Core runs it around every chat
    request with tools: the executor sees the instructions and, when a call is required, the
    grammar as the request's ``structured`` constraint; the codecs see the calls."""

    def instructions(self, tools: Sequence[Tool]) -> str:
        """A system turn describing ``tools`` and how to call them, for a chat template that
        takes no tools."""
        ...

    def constraint(self, tools: Sequence[Tool], *, parallel: bool) -> StructuredOutput:
        """The output when a call is required: one call of one of ``tools`` (one or more with
        ``parallel``), in this format, its arguments valid against that tool's schema."""
        ...

    def render(self, calls: Sequence[ToolCall]) -> str:
        """``calls`` as the model writes them (for earlier turns, under a chat template that takes
        no tools); what `stream` reads back as these calls."""
        ...

    def stream(self, tools: Sequence[Tool]) -> ToolCallStream:
        """A fresh reader for one reply that may call ``tools``."""
        ...
