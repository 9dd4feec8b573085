"""Contract test classes, one per layer, for any implementation.

Subclass one in a test module. Set ``registered_name`` to build the component from the
installed plugins (through its entry point, with default options or ``options``), or
override ``build()`` (or the ``component`` fixture) to construct it yourself.
"""

from __future__ import annotations

import asyncio
import copy
import json
import math
import random
import time
from collections.abc import AsyncIterator
from typing import Any, ClassVar

import attrs
import pytest

from lamina_hookspecs import hookimpl, layers
from lamina_hookspecs.errors import (
    AuthenticationError, CodecError, InvalidRequestError, LaminaError, NoBackendError, NotFoundError,
    TokenizerNotAvailableError,
)
from lamina_hookspecs.layers import Layer
from lamina_hookspecs.protocols import Tokenizes
from lamina_hookspecs.registration import BuildContext
from lamina.testing.streams import decode_stream, encode_stream
from lamina_hookspecs.types import (
    STRUCTURED_KINDS, BackendState, PoolSnapshot, PrefixMatch, Request, SamplingParams, ScaleDecision, SchedulerState,
    StreamError, StreamMeta, StructuredOutput, TokenChunk, Tool, ToolCall, ToolCallDelta, TopLogprob, Usage,
)


class ComponentContract:
    """Shared part: finding, building and shape-checking the component."""

    layer: ClassVar[Layer]
    registered_name: ClassVar[str | None] = None
    options: ClassVar[dict[str, Any]] = {}

    @pytest.fixture
    def component(self) -> Any:
        return self.build()

    def build(self) -> Any:
        """The component under test: built from the installed plugins by ``registered_name`` with
        ``options``; override it (or the ``component`` fixture) to construct it yourself."""
        if self.registered_name is None:
            pytest.fail(f"{type(self).__name__}: set registered_name or override build()")
        from lamina.kernel.options import build_options
        from lamina.kernel.plugins import load_plugins

        registry = load_plugins().registry
        found = registry.get((self.layer,), self.registered_name, self.layer.key)
        options = build_options(found.options, self.options, self.layer.key)
        return found.factory(options, BuildContext(stack_name="conformance"))

    def test_is_registered_by_an_installed_plugin(self) -> None:
        if self.registered_name is None:
            pytest.skip("component built by the test itself")
        from lamina.kernel.plugins import load_plugins

        plugins = load_plugins()
        owners = [i.name for i in plugins.infos.values() if self.registered_name in i.registered.get(self.layer.key, [])]
        assert owners, f"no installed plugin registers {self.layer.noun} {self.registered_name!r}"
        assert not plugins.infos[owners[0]].error

    def test_satisfies_the_layer_protocol(self, component: Any) -> None:
        assert isinstance(component, self.layer.protocol), (
            f"{type(component).__name__} lacks methods of {self.layer.protocol.__name__}"
        )


def _backends(rng: random.Random, n: int) -> list[BackendState]:
    return [
        BackendState(
            name=f"b{i}", model="m", healthy=rng.random() > 0.2, draining=rng.random() < 0.2,
            outstanding_requests=rng.randrange(20), outstanding_tokens=rng.randrange(5000),
            queue_depth=rng.randrange(10), kv_blocks_used=rng.randrange(100), kv_blocks_total=100,
        )
        for i in range(n)
    ]


class RouterContract(ComponentContract):
    """A router returns one of the offered backends, never an unavailable one while an
    available one exists, and raises ``NoBackendError`` when none is available."""

    layer = layers.ROUTER

    def test_returns_an_offered_available_backend(self, component: Any) -> None:
        rng = random.Random(1234)
        for i in range(300):
            backends = _backends(rng, rng.randrange(1, 9))
            if not any(b.available for b in backends):
                continue
            request = Request(id=f"r{i}", model="m", prompt=f"prompt {i % 7}", tenant=f"t{i % 3}")
            chosen = component.choose(request, backends)
            assert any(chosen is b for b in backends), "router must return one of the offered objects"
            assert chosen.available, f"router chose unavailable backend {chosen.name}"

    @pytest.mark.parametrize("backends", [
        [],
        [BackendState(name="a", model="m", healthy=False), BackendState(name="b", model="m", draining=True)],
    ], ids=["empty", "all-unavailable"])
    def test_raises_no_backend_when_none_is_available(self, component: Any, backends: list[BackendState]) -> None:
        with pytest.raises(NoBackendError):
            component.choose(Request(id="r", model="m", prompt="x"), backends)

    def test_spreads_identical_requests_over_equal_backends_or_sticks(self, component: Any) -> None:
        backends = [BackendState(name=f"b{i}", model="m") for i in range(4)]
        picks = {component.choose(Request(id=f"r{i}", model="m", prompt="same"), backends).name for i in range(40)}
        assert picks <= {b.name for b in backends}


def _sample_stream() -> list[Any]:
    meta = StreamMeta(request_id="req-1", model="test-model", created=1_700_000_000, kind="chat")
    top = (TopLogprob(token_id=5, text=" a", logprob=-0.1), TopLogprob(token_id=6, text=" b", logprob=-2.5))
    return [
        meta,
        TokenChunk(request_id="req-1", index=0, token_ids=(17,), text="Hello"),
        TokenChunk(request_id="req-1", index=1, token_ids=(18, 19), text=", wörld 🌍 漢字"),
        TokenChunk(request_id="req-1", index=3, token_ids=(5,), text=" a", logprobs=(-0.1,), top_logprobs=(top,)),
        TokenChunk(request_id="req-1", index=4, token_ids=(), text="", finish_reason="stop",
                   usage=Usage(prompt_tokens=12, completion_tokens=4)),
    ]


def _same_chunk(decoded: TokenChunk, original: TokenChunk) -> None:
    assert decoded.text == original.text
    assert decoded.token_ids in ((), original.token_ids), "token ids, when carried, must round-trip"
    assert decoded.finish_reason == original.finish_reason
    assert decoded.usage == original.usage
    if original.logprobs is not None:
        assert decoded.logprobs is not None
        assert all(math.isclose(a, b, abs_tol=1e-3) for a, b in zip(decoded.logprobs, original.logprobs, strict=True))


class CodecContract(ComponentContract):
    """A codec round-trips every chunk kind, decodes input split anywhere to the same
    items, and rejects truncated input with ``CodecError``."""

    layer = layers.CODEC

    def test_has_a_media_type(self, component: Any) -> None:
        assert isinstance(component.media_type, str) and "/" in component.media_type

    def _tokens(self, items: list[Any]) -> list[TokenChunk]:
        return [item for item in items if isinstance(item, TokenChunk) and (item.text or item.is_final)]

    def test_round_trips_every_chunk_kind(self, component: Any) -> None:
        items = _sample_stream()
        decoded = self._tokens(decode_stream(component.decoder(), encode_stream(component.encoder(), items)))
        originals = items[1:]
        assert len(decoded) == len(originals)
        for got, want in zip(decoded, originals, strict=True):
            _same_chunk(got, want)

    @pytest.mark.parametrize("split", [1, 2, 3, 7, 64])
    def test_decodes_input_split_anywhere(self, component: Any, split: int) -> None:
        data = encode_stream(component.encoder(), _sample_stream())
        assert (self._tokens(decode_stream(component.decoder(), data, split))
                == self._tokens(decode_stream(component.decoder(), data)))

    def test_round_trips_tool_calls(self, component: Any) -> None:
        meta = StreamMeta(request_id="req-2", model="test-model", created=1_700_000_000, kind="chat")
        chunks = [
            TokenChunk(request_id="req-2", index=0, token_ids=(3,), text="Let me look.",
                       tool_calls=(ToolCallDelta(index=0, id="call_a1", name="get_weather", arguments=""),)),
            TokenChunk(request_id="req-2", index=1, token_ids=(4, 5),
                       tool_calls=(ToolCallDelta(index=0, arguments='{"city": "Zürich"}'),
                                   ToolCallDelta(index=1, id="call_b2", name="add", arguments="{}"))),
            TokenChunk(request_id="req-2", index=3, finish_reason="tool_calls",
                       usage=Usage(prompt_tokens=9, completion_tokens=3)),
        ]
        decoded = [item for item in decode_stream(component.decoder(), encode_stream(component.encoder(),
                                                                                     [meta, *chunks]))
                   if isinstance(item, TokenChunk)]
        assert [d for c in decoded for d in c.tool_calls] == [d for c in chunks for d in c.tool_calls]
        assert "".join(c.text for c in decoded) == "Let me look."
        assert decoded[-1].finish_reason == "tool_calls"

    def test_carries_errors(self, component: Any) -> None:
        items = [*_sample_stream()[:2], StreamError(message="backend died", type="server_error", code="oops")]
        decoded = decode_stream(component.decoder(), encode_stream(component.encoder(), items))
        errors = [item for item in decoded if isinstance(item, StreamError)]
        assert errors and errors[0].message == "backend died"

    def test_rejects_truncated_input(self, component: Any) -> None:
        data = encode_stream(component.encoder(), _sample_stream())
        cut = data[: len(data) - 3]
        with pytest.raises(CodecError):
            decode_stream(component.decoder(), cut)

    def test_rejects_garbage(self, component: Any) -> None:
        rng = random.Random(7)
        with pytest.raises(CodecError):
            decode_stream(component.decoder(), bytes(rng.randrange(256) for _ in range(512)))


async def _drain(stream: AsyncIterator[TokenChunk], limit: int | None = None) -> list[TokenChunk]:
    chunks = []
    try:
        async for chunk in stream:
            chunks.append(chunk)
            if limit is not None and len(chunks) >= limit:
                break
    finally:
        await stream.aclose()  # type: ignore[attr-defined]
    return chunks


class ExecutorContract(ComponentContract):
    """An executor streams indexed chunks ending in one final chunk with exact usage,
    honours ``max_tokens``, and frees everything when a stream is closed early.

    Each test runs the executor's whole life (start, requests, stop) on one event loop, as a
    server does, so an executor may keep connections and background tasks on the loop it
    started on."""

    layer = layers.EXECUTOR
    prompt: ClassVar[str] = "The capital of France is"

    @pytest.fixture
    def loop(self) -> Any:
        loop = asyncio.new_event_loop()
        yield loop
        loop.close()

    @pytest.fixture
    def executor(self, component: Any, loop: asyncio.AbstractEventLoop) -> Any:
        loop.run_until_complete(component.start())
        yield component
        loop.run_until_complete(component.stop())

    def _request(self, executor: Any, max_tokens: int, **kw: Any) -> Request:
        return Request(id="r1", model=executor.model.id, prompt=self.prompt,
                       sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, **kw))

    def test_streams_indexed_chunks_and_exact_usage(self, executor: Any, loop: asyncio.AbstractEventLoop) -> None:
        chunks = loop.run_until_complete(_drain(executor.generate(self._request(executor, 5))))
        assert chunks and chunks[-1].is_final and not any(c.is_final for c in chunks[:-1])
        index = 0
        for chunk in chunks:
            assert chunk.index == index
            index += len(chunk.token_ids)
        usage = chunks[-1].usage
        assert usage is not None and usage.completion_tokens == index == 5
        assert usage.prompt_tokens > 0
        assert chunks[-1].finish_reason == "length"

    def test_close_early_frees_the_request(self, executor: Any, loop: asyncio.AbstractEventLoop) -> None:
        loop.run_until_complete(_drain(executor.generate(self._request(executor, 50)), limit=1))
        state = executor.state()
        assert isinstance(state, BackendState)
        assert state.outstanding_requests == 0 and state.queue_depth == 0

    def test_rejects_what_it_cannot_serve_with_a_lamina_error(self, executor: Any,
                                                              loop: asyncio.AbstractEventLoop) -> None:
        huge = Request(id="r2", model=executor.model.id, prompt_token_ids=[1] * (executor.model.context_length + 1),
                       sampling=SamplingParams(max_tokens=1))
        with pytest.raises(LaminaError):
            loop.run_until_complete(_drain(executor.generate(huge)))


    def test_tokenizes_as_it_serves(self, executor: Any, loop: asyncio.AbstractEventLoop) -> None:
        """An executor that implements `Tokenizes`: ``tokenize`` gives as many ids as ``generate``
        counts prompt tokens, ``detokenize`` gives the prompt's text back, and an id out of
        range is an ``InvalidRequestError``. One that cannot here (what it fronts does not
        tokenize) says so with ``tokenizer_not_available``, and the test is skipped."""
        if not isinstance(executor, Tokenizes):
            pytest.skip("the executor does not implement Tokenizes")
        request = self._request(executor, 1)
        try:
            ids = loop.run_until_complete(executor.tokenize(request))
        except NotFoundError as error:
            if error.code != TokenizerNotAvailableError.CODE:
                raise
            pytest.skip(f"this instance cannot tokenize: {error.message}")
        chunks = loop.run_until_complete(_drain(executor.generate(request)))
        assert chunks[-1].usage is not None and len(ids) == chunks[-1].usage.prompt_tokens > 0
        assert self.prompt in loop.run_until_complete(executor.detokenize(ids))
        with pytest.raises(InvalidRequestError):
            loop.run_until_complete(executor.detokenize([2**40]))


class RateLimiterContract(ComponentContract):
    """A rate limiter admits a fresh key, refuses a hammered key with a positive
    ``retry_after_s``, admits it again after that, and keeps keys independent."""

    layer = layers.RATE_LIMITER

    def test_admits_refuses_and_recovers(self, component: Any) -> None:
        now = 1000.0
        assert component.acquire("a", now).allowed
        for _ in range(100_000):
            decision = component.acquire("a", now)
            if not decision.allowed:
                break
        else:
            pytest.fail("never refused 100,000 requests at one instant")
        assert decision.retry_after_s > 0
        assert component.acquire("b", now).allowed, "keys must be independent"
        assert component.acquire("a", now + decision.retry_after_s + 1e-6).allowed


class AuthenticatorContract(ComponentContract):
    """An authenticator refuses a missing or unknown credential with a 401 that does not
    echo the credential back."""

    layer = layers.AUTHENTICATOR

    @pytest.mark.parametrize("credential", [None, "", "sk-lamina-contract-never-issued-0c4e"])
    def test_refuses_missing_and_unknown_credentials(self, component: Any, credential: str | None) -> None:
        with pytest.raises(AuthenticationError) as info:
            component.authenticate(credential)
        assert info.value.http_status == 401
        if credential:
            assert credential not in info.value.message


class ValidatorContract(ComponentContract):
    """A validator accepts minimal OpenAI bodies and rejects a malformed one with a 400 that
    names the field (``param``) in its message."""

    layer = layers.VALIDATOR

    def test_accepts_minimal_bodies(self, component: Any) -> None:
        assert component.validate("chat", {"model": "m", "messages": [{"role": "user", "content": "hi"}]}) is None
        assert component.validate("completion", {"model": "m", "prompt": "hi"}) is None

    def test_rejects_a_malformed_body_naming_the_field(self, component: Any) -> None:
        with pytest.raises(InvalidRequestError) as info:
            component.validate("chat", {"model": "m", "messages": [{"role": "user", "content": 7}]})
        assert info.value.http_status == 400 and info.value.param
        assert info.value.message.startswith(info.value.param)


class BreakerContract(ComponentContract):
    """A breaker lets a fresh backend through, opens after a long run of failures (for
    that backend only), never reports a negative wait, and closes again after successes."""

    layer = layers.BREAKER

    def test_opens_on_failures_and_recovers(self, component: Any) -> None:
        now = 1000.0
        assert component.retry_after("a", now) is None
        for _ in range(1000):
            if component.retry_after("a", now) is not None:
                break
            component.started("a", now)
            component.record("a", False, now)
            now += 0.001
        wait = component.retry_after("a", now)
        assert wait is not None and wait > 0, "1000 straight failures did not open the circuit"
        assert component.retry_after("b", now) is None, "circuits are per backend"
        for _ in range(100):  # wait it out, then succeed
            now += wait + 1e-3
            component.started("a", now)
            component.record("a", True, now)
            wait = component.retry_after("a", now)
            if wait is None:
                break
            assert wait >= 0
        assert component.retry_after("a", now) is None, "successes after the cool-down did not close it"


class AutoscalerContract(ComponentContract):
    """An autoscaler answers a ``ScaleDecision`` for idle, busy and empty pools, keeps at least
    one replica while there is traffic, and names only existing replicas to drain."""

    layer = layers.AUTOSCALER

    @pytest.mark.parametrize("busy", [0, 1, 50])
    def test_decides(self, component: Any, busy: int) -> None:
        backends = tuple(BackendState(name=f"b{i}", model="m", queue_depth=busy, outstanding_requests=2 * busy)
                         for i in range(2))
        for now in (0.0, 10.0, 20.0, 30.0):
            snapshot = PoolSnapshot(now=now, backends=backends, arrival_rate=float(busy),
                                    ttft_p95_s=0.1 * busy if busy else None, cold_starts_s=(5.0, 6.0))
            decision = component.decide(snapshot)
            assert isinstance(decision, ScaleDecision) and decision.replicas >= 0
            assert set(decision.drain) <= {b.name for b in backends}
            if busy:
                assert decision.target >= 1, "traffic needs a replica"
        assert isinstance(component.decide(PoolSnapshot(now=40.0)), ScaleDecision)


class PrefixCacheContract(ComponentContract):
    """A prefix cache finds whole-block prefixes it was given, only under the same salt,
    never evicts a pinned block, and says which blocks it owns."""

    layer = layers.PREFIX_CACHE

    def test_matches_inserted_prefix_per_salt(self, component: Any) -> None:
        size = component.block_size
        tokens = list(range(3 * size))
        component.insert(tokens, [10, 11, 12], salt=b"t1")
        match = component.match(tokens + [999], salt=b"t1")
        assert match.num_tokens == 3 * size and tuple(match.block_ids) == (10, 11, 12)
        assert component.match(tokens, salt=b"t2").num_tokens == 0
        component.release(match)

    def test_never_evicts_pinned_blocks(self, component: Any) -> None:
        size = component.block_size
        component.insert(list(range(size)), [1], salt=b"s")
        assert component.owns(1), "a stored block belongs to the cache"
        match = component.match(list(range(size)), salt=b"s")
        assert 1 not in component.evict(10)
        component.release(match)
        assert 1 in component.evict(10)
        assert not component.owns(1), "an evicted block is the executor's again"
        assert component.match(list(range(size)), salt=b"s") == PrefixMatch(num_tokens=0)



def _scheduler_states(rng: random.Random, n: int) -> list[SchedulerState]:
    now, states = 100.0, []
    for _ in range(n):
        now += rng.expovariate(20.0)
        states.append(SchedulerState(now=now, waiting=rng.randrange(1, 40), running=rng.randrange(32), max_batch=32,
                                     oldest_wait_s=rng.expovariate(10.0), arrival_rate=rng.uniform(0.0, 200.0)))
    return states


class BatchingPolicyContract(ComponentContract):
    """A batching policy answers a finite, non-negative hold and at least one prefill per step,
    stops holding a request that has waited an hour (whatever feedback it got), and takes time
    only from the state it is given: a copy fed the same calls later answers the same."""

    layer = layers.BATCHING

    def _replay(self, policy: Any, states: list[SchedulerState]) -> list[tuple[float, int]]:
        answers = []
        for i, state in enumerate(states):
            answers.append((policy.wait_s(state), policy.max_prefills(state)))
            if i % 3 == 0:
                policy.observe(state.oldest_wait_s + 0.05 * (i % 7), state)
        return answers

    def test_holds_finitely_and_starts_at_least_one(self, component: Any) -> None:
        for wait, limit in self._replay(component, _scheduler_states(random.Random(5), 400)):
            assert math.isfinite(wait) and wait >= 0
            assert isinstance(limit, int) and limit >= 1

    @pytest.mark.parametrize("latency_s", [0.0, 0.01, 5.0, 120.0])
    def test_never_holds_a_request_for_ever(self, component: Any, latency_s: float) -> None:
        state = SchedulerState(now=10.0, waiting=1, running=0, max_batch=32, arrival_rate=50.0)
        for i in range(500):
            component.observe(latency_s, attrs.evolve(state, now=10.0 + i * 0.01))
        assert component.wait_s(attrs.evolve(state, now=20.0, oldest_wait_s=3600.0)) == 0.0
        assert component.wait_s(attrs.evolve(state, now=20.0, running=5, waiting=3, oldest_wait_s=3600.0)) == 0.0

    def test_takes_time_only_from_the_state(self, component: Any) -> None:
        twin = copy.deepcopy(component)
        states = _scheduler_states(random.Random(9), 200)
        first = self._replay(component, states)
        time.sleep(0.02)
        assert self._replay(twin, states) == first


class PrewarmPolicyContract(ComponentContract):
    """A pre-warm policy wants only prefixes of prompts it saw under the same salt, never a
    prompt seen once among thousands of one-offs, and takes time only from ``now``: a copy
    fed the same calls later answers the same."""

    layer = layers.PREWARM

    @staticmethod
    def _feed(policy: Any, rng: random.Random, now: float = 100.0) -> float:
        """A shared 64-token preamble per salt under 30 prompts each, among one-off prompts."""
        for i in range(60):
            now += 0.5
            salt = b"a" if i % 2 else b"b"
            preamble = list(range(64)) if salt == b"a" else list(range(1000, 1064))
            policy.observe(preamble + [rng.randrange(5000, 9000) for _ in range(40)], salt=salt, now=now)
            policy.observe([rng.randrange(20000, 30000) for _ in range(80)], salt=b"c", now=now)
        return now

    def test_wants_only_prefixes_of_what_it_saw_under_that_salt(self, component: Any) -> None:
        now = self._feed(component, random.Random(1))
        wanted = component.wanted(now)
        assert {w.salt for w in wanted} <= {b"a", b"b"}, "one-off prompts are not a pattern"
        for w in wanted:
            preamble = tuple(range(64)) if w.salt == b"a" else tuple(range(1000, 1064))
            assert w.token_ids and w.token_ids == preamble[:len(w.token_ids)]

    def test_wants_nothing_from_one_off_prompts(self, component: Any) -> None:
        rng = random.Random(2)
        for i in range(3000):
            component.observe([rng.randrange(50000) for _ in range(64)], salt=b"x", now=float(i))
        assert list(component.wanted(3000.0)) == []

    def test_takes_time_only_from_now(self, component: Any) -> None:
        twin = copy.deepcopy(component)
        now = self._feed(component, random.Random(3))
        first = component.wanted(now)
        time.sleep(0.02)
        assert self._feed(twin, random.Random(3)) == now and twin.wanted(now) == first


_TOOLS = (
    Tool(name="get_weather", description="The weather in a city now.",
         parameters=json.dumps({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})),
    Tool(name="add_numbers", parameters=json.dumps({"type": "object", "properties": {"a": {"type": "integer"},
                                                                            "b": {"type": "integer"}}})),
)


def _read(reader: Any, text: str, size: int) -> tuple[str, list[ToolCallDelta]]:
    """``text`` fed to ``reader`` ``size`` characters at a time, then closed: content and calls."""
    content, deltas = [], []
    for at in range(0, len(text), size):
        part, found = reader.feed(text[at:at + size])
        content.append(part)
        deltas += found
    part, found = reader.close()
    return "".join(content) + part, [*deltas, *found]


def _calls(deltas: list[ToolCallDelta]) -> list[tuple[str, Any]]:
    """The calls the fragments make, as (name, parsed arguments), in index order; ids unique."""
    calls: dict[int, list[str]] = {}
    for delta in deltas:
        calls.setdefault(delta.index, [delta.id or "", delta.name or ""]).append(delta.arguments)
    ids = [parts[0] for parts in calls.values()]
    assert all(ids) and len(set(ids)) == len(ids), f"every call needs its own id; got {ids}"
    assert sorted(calls) == list(range(len(calls))), "calls are numbered from 0 in order"
    return [(parts[1], json.loads("".join(parts[2:]))) for _, parts in sorted(calls.items())]


class ToolParserContract(ComponentContract):
    """A tool parser reads back the calls it renders, fed in pieces of any size; passes text that
    calls nothing through unchanged; loses no text of a call it cannot read; and its instructions and
    grammar name the tools."""

    layer = layers.TOOL_PARSER

    @pytest.mark.parametrize("size", [1, 3, 1000])
    def test_reads_back_the_calls_it_renders(self, component: Any, size: int) -> None:
        calls = [ToolCall(id="call_1", name="get_weather", arguments='{"city": "Paris"}')]
        content, deltas = _read(component.stream(_TOOLS), component.render(calls), size)
        assert not content.strip()
        assert _calls(deltas) == [("get_weather", {"city": "Paris"})]

    def test_reads_back_several_calls(self, component: Any) -> None:
        calls = [ToolCall(id="call_1", name="get_weather", arguments='{"city": "Oslo"}'),
                 ToolCall(id="call_2", name="add_numbers", arguments='{"a": 1, "b": 2}')]
        content, deltas = _read(component.stream(_TOOLS), component.render(calls), 2)
        assert not content.strip()
        assert _calls(deltas) == [("get_weather", {"city": "Oslo"}), ("add_numbers", {"a": 1, "b": 2})]

    @pytest.mark.parametrize("size", [1, 4, 1000])
    def test_passes_plain_text_through(self, component: Any, size: int) -> None:
        text = "The weather in Paris is mild: 18 °C, light wind. <b>tag</b> {braces} [1, 2]."
        assert _read(component.stream(_TOOLS), text, size) == (text, [])

    def test_keeps_the_text_of_a_call_it_cannot_read(self, component: Any) -> None:
        calls = [ToolCall(id="call_1", name="get_weather", arguments='{"city": "Paris"}')]
        for text in (component.render(calls)[:-3], component.render(
                [ToolCall(id="call_1", name="not_offered", arguments="{}")])):
            content, deltas = _read(component.stream(_TOOLS), text, 5)
            assert (content, deltas) == (text, []), f"{text!r} is no call of an offered tool: it stays content"

    def test_instructions_and_grammar_name_the_tools(self, component: Any) -> None:
        text = component.instructions(_TOOLS)
        assert all(tool.name in text for tool in _TOOLS)
        for parallel in (False, True):
            constraint = component.constraint(_TOOLS[:1], parallel=parallel)
            assert isinstance(constraint, StructuredOutput) and constraint.kind in STRUCTURED_KINDS
            assert "get_weather" in constraint.spec and "add_numbers" not in constraint.spec


def _observer_manager(observer: Any) -> Any:
    """A plugin manager with Lamina's hook specifications and ``observer`` registered (pluggy checks
    each implementation's name and arguments against them)."""
    import pluggy

    from lamina_hookspecs import hookspecs
    from lamina_hookspecs.markers import PROJECT_NAME

    pm = pluggy.PluginManager(PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    pm.register(observer, name="observer")
    return pm


async def _observe(pm: Any, hook: str, **kwargs: Any) -> None:
    """Call the observer's implementations of ``hook`` directly, so that whatever they raise fails the test."""
    import inspect

    for impl in getattr(pm.hook, hook).get_hookimpls():
        result = impl.function(**{arg: kwargs[arg] for arg in impl.argnames})
        if inspect.isawaitable(result):
            await result


async def _one_request(pm: Any, ctx: Any, outcome: LaminaError | None) -> None:
    """One request's lifecycle as core drives it, wrappers around it; ``outcome`` an error to fail with."""
    from contextlib import AsyncExitStack

    async with AsyncExitStack() as wrappers:
        for impl in pm.hook.lamina_request_wrap.get_hookimpls():
            manager = impl.function(ctx=ctx)
            if manager is not None:
                await wrappers.enter_async_context(manager)
        await _observe(pm, "lamina_request_received", ctx=ctx)
        if outcome is not None:
            await _observe(pm, "lamina_request_failed", ctx=ctx, error=outcome)
            return
        ctx.request = Request(id=ctx.request_id, model="m", prompt="hello", sampling=SamplingParams(max_tokens=2))
        pm.hook.lamina_admit(ctx=ctx, body={"prompt": "hello"})
        await _observe(pm, "lamina_request_admitted", ctx=ctx)
        backends = [BackendState(name="b0", model="m")]
        pm.hook.lamina_route(ctx=ctx, request=ctx.request, backends=backends)
        ctx.backend = "b0"
        await _observe(pm, "lamina_request_routed", ctx=ctx)
        ctx.first_token_at = time.monotonic()
        await _observe(pm, "lamina_request_first_token", ctx=ctx)
        ctx.finished_at, ctx.usage = time.monotonic(), Usage(prompt_tokens=1, completion_tokens=2)
        await _observe(pm, "lamina_request_finished", ctx=ctx, finish_reason="stop")


class _CoreLast:
    """Stands in for core's own ``lamina_admit`` and ``lamina_route``, so an observer's wrappers have a call to wrap."""

    @hookimpl(trylast=True)
    def lamina_admit(self, ctx: Any, body: Any) -> None:
        return None

    @hookimpl(trylast=True)
    def lamina_route(self, ctx: Any, request: Any, backends: Any) -> Any:
        return backends[0]


class ObserverContract(ComponentContract):
    """An observer implements only hooks the specification has (with arguments it names), lives
    through a stack's start, requests that finish and fail, the stack's stop, and then closes."""

    layer = layers.OBSERVER

    @pytest.fixture
    def component(self) -> Any:
        observer = self.build()
        yield observer
        observer.close()

    def test_implements_known_request_and_stack_hooks(self, component: Any) -> None:
        from lamina_hookspecs.hookspecs import OBSERVER_HOOKS

        pm = _observer_manager(component)
        implemented = {caller.name for caller in pm.get_hookcallers(component) or ()}
        assert implemented, "an observer implements at least one lifecycle hook"
        assert implemented <= {*OBSERVER_HOOKS, "lamina_request_wrap", "lamina_admit", "lamina_route"}, (
            f"an observer implements lifecycle hooks only; got {sorted(implemented)}")

    def test_lives_through_a_stack_and_its_requests_then_closes(self) -> None:
        from lamina_hookspecs.types import RequestContext, StackInfo

        component = self.build()
        pm = _observer_manager(component)
        pm.register(_CoreLast(), name="core")
        stack = StackInfo(name="conformance", components={"executor": "echo"})

        async def go() -> None:
            await _observe(pm, "lamina_stack_started", stack=stack)
            await _one_request(pm, RequestContext(request_id="ok", endpoint="completions", tenant="acme"), None)
            failed = RequestContext(request_id="bad", endpoint="chat", tenant="acme")
            await _one_request(pm, failed, InvalidRequestError("bad request", param="messages"))
            await _observe(pm, "lamina_stack_stopping", stack=stack)

        asyncio.run(go())
        component.close()


def _listener(host: str, port: int, marker: str) -> None:
    """Wait until something listens on ``host:port``, or fail the test."""
    import socket

    deadline = time.monotonic() + 60
    while True:
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return
        except OSError:
            if time.monotonic() > deadline:
                pytest.fail(f"the launched replica never listened on {host}:{port} ({marker})")
            time.sleep(0.1)


class ReplicaProviderContract(ComponentContract):
    """A replica provider runs core's command line with the host, port and files directory it
    chose, reports the address it listens on, sees it exit, stops it and closes.

    The command it launches here is a stand-in for ``lamina worker``: a Python one-liner that
    checks its file and listens on its port."""

    layer = layers.REPLICA_PROVIDER

    @pytest.fixture
    def component(self) -> Any:
        provider = self.build()
        yield provider
        provider.close()
    LISTEN = ("-c", "import socket, sys, time\n"
                    "assert open(sys.argv[1]).read() == 'worker stack'\n"
                    "server = socket.create_server((sys.argv[2], int(sys.argv[3])))\n"
                    "time.sleep(600)\n",
              "{files}/stack.json", "{host}", "{port}")

    def test_launches_core_s_command_line_and_stops_it_then_closes(self) -> None:
        from lamina_hookspecs.types import WorkerLaunch

        component = self.build()
        worker = WorkerLaunch(name="replica-0", files={"stack.json": b"worker stack"}, args=self.LISTEN)
        handle = component.launch(worker)
        try:
            host, _, port = handle.address.rpartition(":")
            assert host and port.isdigit(), f"an address is host:port; got {handle.address!r}"
            _listener(host, int(port), "its files or arguments were not the ones given")
            assert handle.exited() is None, "it runs"
        finally:
            handle.stop()
        deadline = time.monotonic() + 30
        while handle.exited() is None and time.monotonic() < deadline:  # exited() may learn it a call later
            time.sleep(0.1)
        assert handle.exited() is not None, "a stopped replica reports an exit status"
        component.close()
