"""Value types that cross layer boundaries.

All are ``attrs`` frozen, slotted, keyword-only classes: change them with
``attrs.evolve``. :class:`RequestContext` is the one mutable object: core creates it
when a request arrives and fills it in as the request moves through the stack.
"""

from __future__ import annotations

import json
import time
from typing import Any, Literal, get_args

import attrs

from lamina_hookspecs import estimate

FinishReason = Literal["stop", "length", "abort", "tool_calls"]
Role = Literal["system", "user", "assistant", "tool"]
ROLES: tuple[str, ...] = get_args(Role)
"""The chat roles a request may carry."""
ROLE_ALIASES: dict[str, Role] = {"developer": "system"}
"""Roles a client may send that mean one of `ROLES` (``developer`` is OpenAI's newer name for ``system``)."""
MAX_TOP_LOGPROBS = 20
"""The most alternatives per token a request may ask for (OpenAI's limit)."""
MAX_LOGIT_BIAS = 300
"""The most token ids one request's ``logit_bias`` may name."""
MAX_STOPS = 64
"""The most ``stop`` strings one request may give (OpenAI takes 4, vLLM any number; bounded so that
checking the text for them stays cheap)."""
MAX_CHOICES = 128
"""The most choices (``n``) one request may ask for (OpenAI's limit)."""


def _tuple_of_ints(value: object) -> tuple[int, ...]:
    if type(value) is tuple:  # the per-token hot path: codecs and executors pass tuples of ints
        return value
    return tuple(map(int, value))  # type: ignore[call-overload]


StructuredKind = Literal["json", "json_object", "regex", "choice", "grammar"]
STRUCTURED_KINDS: tuple[str, ...] = get_args(StructuredKind)
"""The kinds of `StructuredOutput`, named as the keys of vLLM's ``structured_outputs``."""


@attrs.frozen(kw_only=True)
class StructuredOutput:
    """What the generated text must be (structured output): for ``json`` a JSON document valid
    against the JSON Schema ``spec`` (as JSON text); for ``json_object`` any JSON object; for
    ``regex`` a full match of the regular expression ``spec``; for ``choice`` exactly one of
    ``choices``; for ``grammar`` a sentence of the grammar ``spec`` (Lark when it has a ``start:``
    rule, otherwise GBNF as llama.cpp and vLLM write it). ``param`` is the request field it came from, which errors about it name.
    """

    kind: StructuredKind = attrs.field(validator=attrs.validators.in_(STRUCTURED_KINDS))
    spec: str = ""
    choices: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    param: str = "structured_outputs"


@attrs.frozen(kw_only=True)
class SamplingParams:
    """How to pick tokens. ``temperature == 0`` means greedy; ``top_k == 0`` means off.

    Generation stops at ``max_tokens`` (``None``: at the end of the context window), at the model's end-of-sequence token (unless
    ``ignore_eos``), at any of ``stop_token_ids``, or where the text contains one of ``stop``
    (the stop string itself is not returned). ``top_logprobs`` alternatives are returned
    per token when ``logprobs`` is set.

    The logits are adjusted before any choice, greedy included, as vLLM and OpenAI do:
    ``logit_bias`` (token id, added value) pairs, kept in id order; ``presence_penalty`` and ``frequency_penalty``
    subtracted once per generated token seen, and per time it was generated; ``repetition_penalty``
    dividing (positive) or multiplying (negative) the logit of every token in the prompt or the
    output; ``min_p`` drops tokens less likely than that fraction of the most likely one (after
    temperature); and until ``min_tokens`` tokens are generated, the end-of-sequence and stop tokens
    cannot be chosen and stop strings do not end the output. Logprobs stay those of the model.
    With ``structured``, only tokens that keep the text a prefix of what it allows can be chosen,
    and generation stops once the text is complete and nothing more can follow.
    """

    max_tokens: int | None = attrs.field(
        default=16, validator=attrs.validators.optional(attrs.validators.ge(1))
    )
    temperature: float = attrs.field(default=1.0, validator=attrs.validators.ge(0.0))
    top_p: float = attrs.field(
        default=1.0, validator=[attrs.validators.gt(0.0), attrs.validators.le(1.0)]
    )
    top_k: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    seed: int | None = None
    stop: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    stop_token_ids: tuple[int, ...] = attrs.field(default=(), converter=_tuple_of_ints)
    logprobs: bool = False
    top_logprobs: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    ignore_eos: bool = False
    presence_penalty: float = attrs.field(default=0.0, validator=[attrs.validators.ge(-2.0),
                                                                  attrs.validators.le(2.0)])
    frequency_penalty: float = attrs.field(default=0.0, validator=[attrs.validators.ge(-2.0),
                                                                   attrs.validators.le(2.0)])
    repetition_penalty: float = attrs.field(default=1.0, validator=attrs.validators.gt(0.0))
    logit_bias: tuple[tuple[int, float], ...] = attrs.field(
        default=(), converter=lambda pairs: tuple(sorted((int(t), float(b)) for t, b in pairs)),
        validator=attrs.validators.max_len(MAX_LOGIT_BIAS))
    min_p: float = attrs.field(default=0.0, validator=[attrs.validators.ge(0.0), attrs.validators.le(1.0)])
    min_tokens: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    structured: StructuredOutput | None = None

    @property
    def adjusts_logits(self) -> bool:
        """Whether penalties or a logit bias change the logits (``min_p`` and ``min_tokens`` aside)."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
                    or self.logit_bias)


TOOL_NAME_PATTERN = "^[A-Za-z0-9_-]{1,64}$"
"""What a tool's name may be (OpenAI's rule)."""
TOOL_NAME_RULE = "must be 1 to 64 letters, digits, underscores or dashes"
TOOL_CHOICE_RULE = 'must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}'
"""The wording of the request rules on tools, shared by the OpenAI parser and the admission schema."""


@attrs.frozen(kw_only=True)
class Tool:
    """A function the model may call: its ``name``, ``description`` and the JSON Schema of its
    arguments (``parameters``, as JSON text)."""

    name: str
    description: str = ""
    parameters: str = '{"type": "object", "properties": {}}'

    def to_openai(self) -> dict[str, Any]:
        """The tool as OpenAI's ``tools`` entries write it (what chat templates take)."""
        function = {"name": self.name, "description": self.description, "parameters": json.loads(self.parameters)}
        return {"type": "function", "function": function}


ToolChoiceMode = Literal["none", "auto", "required", "function"]


@attrs.frozen(kw_only=True)
class ToolChoice:
    """Whether the model may call tools: ``none``, ``auto`` (it decides), ``required`` (at least
    one call) or ``function`` (a call of the tool ``name``)."""

    mode: ToolChoiceMode = "auto"
    name: str = ""

    @property
    def forced(self) -> bool:
        """Whether the output must be a call (``required`` or a named function)."""
        return self.mode in ("required", "function")


@attrs.frozen(kw_only=True)
class ToolCall:
    """One call the model made: an ``id`` unique in its conversation, the tool's ``name`` and its
    ``arguments`` as JSON text."""

    id: str
    name: str
    arguments: str

    def to_openai(self) -> dict[str, Any]:
        """The call as OpenAI's ``tool_calls`` entries write it."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}

    def parsed_arguments(self) -> Any:
        """The arguments as the object their JSON text holds (the text itself when it is not JSON)."""
        try:
            return json.loads(self.arguments)
        except ValueError:
            return self.arguments


@attrs.frozen(kw_only=True)
class ToolCallDelta:
    """A fragment of call ``index`` (counting from 0 in one response) in a stream: the first fragment of
    a call carries its ``id`` and ``name``; the ``arguments`` fragments of a call join to its JSON text."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@attrs.frozen(kw_only=True)
class ChatMessage:
    """One chat turn; the executor renders a list of them with the model's chat template.

    An assistant turn may carry the ``tool_calls`` it made (its ``content`` then often empty) and
    ``calls_text``, those calls as the stack's tool parser writes them (core sets it); a ``tool``
    turn answers the call ``tool_call_id``.
    """

    role: Role
    content: str
    tool_calls: tuple[ToolCall, ...] = attrs.field(default=(), converter=tuple)
    tool_call_id: str | None = None
    calls_text: str = ""

    def to_template(self, *, template_takes_tools: bool = True) -> dict[str, Any]:
        """The turn as chat templates read it: for one that renders tools, transformers' convention (a
        call's ``arguments`` as an object, ``content`` ``None`` for a turn that only calls tools); for
        any other, the calls written into the content as ``calls_text``."""
        message: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls and not template_takes_tools:
            message["content"] = "\n".join(t for t in (self.content, self.calls_text) if t)
        elif self.tool_calls:
            if not self.content:
                message["content"] = None
            message["tool_calls"] = [{"id": c.id, "type": "function",
                                      "function": {"name": c.name, "arguments": c.parsed_arguments()}}
                                     for c in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        return message


@attrs.frozen(kw_only=True)
class Request:
    """A generation request, as admitted.

    Exactly one of ``prompt`` (text), ``prompt_token_ids`` or ``messages`` (chat) is set.
    ``tenant`` is the isolation key (from the API key), ``user`` the client's own label.
    ``max_queue_wait_s`` is the longest the client will wait for the request to start (the
    ``X-Lamina-Max-Queue-Wait`` header); an executor that queues holds it to the tighter of
    this and its own bound. With ``echo`` (a completion) the output text starts with the
    prompt's: core prepends it to the first chunk.

    ``tools`` are the functions a chat may call, as ``tool_choice`` allows (``parallel_tool_calls``:
    more than one per reply). Core's tool parser reads the calls from the output and sets
    ``tool_prompt``, its instructions for a chat template that takes no tools: an executor whose
    template renders ``tools`` ignores it, any other puts it first as a system turn.

    A request for ``n`` > 1 choices reaches executors as ``n`` requests of one choice each (core
    forks them, :mod:`lamina.kernel.choices`): the first keeps ``id``, the others have ``fork_of`` set to
    it. Their prompt is the same, so an executor may compute it once and let the others read its
    KV; one that does not serves each on its own.
    """

    id: str
    model: str
    sampling: SamplingParams = attrs.field(factory=SamplingParams)
    prompt: str | None = None
    prompt_token_ids: tuple[int, ...] | None = attrs.field(
        default=None, converter=attrs.converters.optional(_tuple_of_ints)
    )
    messages: tuple[ChatMessage, ...] | None = attrs.field(
        default=None, converter=attrs.converters.optional(tuple)
    )
    tenant: str = "default"
    user: str | None = None
    stream: bool = True
    arrival_time: float = attrs.field(factory=time.monotonic)
    max_queue_wait_s: float | None = None
    echo: bool = False
    tools: tuple[Tool, ...] = attrs.field(default=(), converter=tuple)
    tool_choice: ToolChoice = ToolChoice()
    parallel_tool_calls: bool = True
    tool_prompt: str = ""
    n: int = 1
    fork_of: str | None = None

    def __attrs_post_init__(self) -> None:
        given = [f for f in ("prompt", "prompt_token_ids", "messages") if getattr(self, f) is not None]
        if len(given) != 1:
            raise ValueError(f"exactly one of prompt, prompt_token_ids, messages must be set; got {given}")

    def estimated_prompt_tokens(self) -> int:
        """The prompt's tokens as :mod:`lamina_hookspecs.estimate` counts them before tokenization."""
        return estimate.prompt_tokens(text=self.prompt, token_ids=self.prompt_token_ids,
                                      messages=(m.content for m in self.messages or ()))

    def estimated_tokens(self, context_length: int) -> int:
        """The most tokens the request may cost (:func:`lamina_hookspecs.estimate.request_tokens`)."""
        return estimate.request_tokens(self.estimated_prompt_tokens(), self.sampling.max_tokens, context_length,
                                       self.n)

    def template_messages(self, *, template_takes_tools: bool) -> list[dict[str, Any]]:
        """The chat as a chat template reads it: with ``tool_prompt`` as the first system turn (or
        at the end of the one there is) when the template does not render ``tools`` itself."""
        messages = [m.to_template(template_takes_tools=template_takes_tools) for m in self.messages or ()]
        if self.tool_prompt and not template_takes_tools:
            if messages and messages[0]["role"] == "system":
                messages[0]["content"] = f"{messages[0]['content']}\n\n{self.tool_prompt}"
            else:
                messages.insert(0, {"role": "system", "content": self.tool_prompt})
        return messages


@attrs.frozen(kw_only=True)
class Usage:
    """Token counts of one request; ``cached_tokens`` is the part of the prompt served from cache.

    ``queue_s`` is how long the request waited in the executor before its prefill started
    (0 for executors that do not queue); tracing splits queueing from prefill with it.
    """

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    queue_s: float = 0.0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@attrs.frozen(kw_only=True)
class TopLogprob:
    """One alternative token at a position, with its log-probability."""

    token_id: int
    text: str
    logprob: float


@attrs.frozen(kw_only=True)
class TokenChunk:
    """One or more tokens that became ready together, with the text they complete.

    ``index`` is the position of the first token in the output. The last chunk of a
    stream has ``finish_reason`` and ``usage`` set (and may carry no tokens). An executor that
    knows only text (an upstream that sends no ids) sends chunks of text without ``token_ids``.
    ``tool_calls`` are the fragments of tool calls the text so far completed (the calls' own text
    is then not in ``text``). ``logprobs`` (one per token) and ``top_logprobs`` (one tuple per token) are present
    only when the request asked for them.

    Under ``n`` > 1 the choices' chunks come interleaved in one stream, each naming its ``choice``;
    each choice ends with a chunk that has its ``finish_reason``, and ``more`` is set on such a chunk
    while other choices still run, so only the stream's last chunk is final (it carries the usage of
    them all).
    """

    request_id: str
    index: int
    token_ids: tuple[int, ...] = attrs.field(default=(), converter=_tuple_of_ints)
    text: str = ""
    logprobs: tuple[float, ...] | None = None
    top_logprobs: tuple[tuple[TopLogprob, ...], ...] | None = None
    finish_reason: FinishReason | None = None
    usage: Usage | None = None
    tool_calls: tuple[ToolCallDelta, ...] = attrs.field(default=(), converter=tuple)
    choice: int = 0
    more: bool = False

    @property
    def is_final(self) -> bool:
        """Whether this chunk ends the stream (not only its choice)."""
        return self.finish_reason is not None and not self.more

    @property
    def has_output(self) -> bool:
        """Whether the chunk carries generated output: token ids, or text without them."""
        return bool(self.token_ids or self.text)


@attrs.frozen(kw_only=True)
class StreamMeta:
    """What a stream says once, before its tokens: sent in a codec's header.

    ``include_usage`` is the client's choice of a usage report at the end of the stream
    (OpenAI's ``stream_options.include_usage``); ``None`` leaves it to the codec's default.
    ``choices`` is the request's ``n``: a codec that cannot tell choices apart refuses more than one
    in ``header`` with an ``InvalidRequestError``.
    """

    request_id: str
    model: str
    created: int
    kind: Literal["completion", "chat"] = "completion"
    include_usage: bool | None = None
    choices: int = 1


@attrs.frozen(kw_only=True)
class StreamError:
    """An error carried inside a stream after it started (the HTTP status is already sent)."""

    message: str
    type: str = "server_error"
    code: str | None = None


@attrs.frozen(kw_only=True)
class Completion:
    """A whole, non-streamed result: the chunks of one request joined."""

    request_id: str
    text: str
    token_ids: tuple[int, ...]
    finish_reason: FinishReason
    usage: Usage
    tool_calls: tuple[ToolCall, ...] = attrs.field(default=(), converter=tuple)


@attrs.frozen(kw_only=True)
class ModelInfo:
    """What an executor serves: listed by ``GET /v1/models``."""

    id: str
    context_length: int
    owned_by: str = "lamina"


@attrs.frozen(kw_only=True)
class BackendState:
    """A live snapshot of one backend (replica), as routers and autoscalers see it;
    ``tokens_per_s`` is its recent generation rate (a moving average over seconds),
    ``preemptions`` how many times since it started a running request was preempted for memory
    (to be recomputed later); ``draft_tokens`` how many tokens its speculative decoding drafted
    since it started, ``accepted_draft_tokens`` how many of them the model agreed with."""

    name: str
    model: str
    healthy: bool = True
    draining: bool = False
    outstanding_requests: int = 0
    outstanding_tokens: int = 0
    queue_depth: int = 0
    kv_blocks_used: int = 0
    kv_blocks_total: int = 0
    tokens_per_s: float = 0.0
    circuit_open: bool = False
    preemptions: int = 0
    draft_tokens: int = 0
    accepted_draft_tokens: int = 0

    @property
    def available(self) -> bool:
        """Healthy, not draining and its circuit not open: a router may send new work here."""
        return self.healthy and not self.draining and not self.circuit_open

    @property
    def kv_usage(self) -> float:
        """Fraction of KV blocks in use, 0..1 (0 when unknown)."""
        return self.kv_blocks_used / self.kv_blocks_total if self.kv_blocks_total else 0.0


@attrs.frozen(kw_only=True)
class PoolSnapshot:
    """What an autoscaler sees at each interval: the replica pool and its recent traffic.

    ``backends`` are the serving replicas (draining ones excluded); ``starting`` counts
    replicas started but not ready yet. Rates and percentiles cover the last interval
    (``None`` when no request finished in it). ``cold_starts_s`` are the most recent
    measured start-to-ready times of replicas, oldest first.
    """

    now: float
    backends: tuple[BackendState, ...] = ()
    starting: int = 0
    arrival_rate: float = 0.0
    ttft_p95_s: float | None = None
    itl_p95_s: float | None = None
    error_rate: float = 0.0
    cold_starts_s: tuple[float, ...] = ()

    @property
    def replicas(self) -> int:
        """Replicas serving or about to: ready ones plus those starting."""
        return len(self.backends) + self.starting

    @property
    def queue_depth(self) -> int:
        return sum(b.queue_depth for b in self.backends)

    @property
    def running(self) -> int:
        return sum(max(b.outstanding_requests - b.queue_depth, 0) for b in self.backends)

    @property
    def kv_usage(self) -> float:
        """Mean KV usage over the serving replicas (0 with none)."""
        return sum(b.kv_usage for b in self.backends) / len(self.backends) if self.backends else 0.0


@attrs.frozen(kw_only=True)
class ScaleDecision:
    """An autoscaler's answer: how many replicas should serve, how many more to start ahead
    of need (``warm``: they serve once ready), which replicas to drain first when scaling
    down (the provider picks the least loaded otherwise), and why."""

    replicas: int = attrs.field(validator=attrs.validators.ge(0))
    warm: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    drain: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    reason: str = ""

    @property
    def target(self) -> int:
        """Replicas the provider should have started: ``replicas + warm``."""
        return self.replicas + self.warm


@attrs.frozen(kw_only=True)
class RateDecision:
    """A rate limiter's answer for one request."""

    allowed: bool
    retry_after_s: float = 0.0
    remaining: float | None = None


@attrs.frozen(kw_only=True)
class Principal:
    """Who an authenticated request acts for: its tenant and a non-secret id of its key."""

    tenant: str
    key_id: str


@attrs.frozen(kw_only=True)
class PrefixMatch:
    """The longest cached prefix of a prompt: ``num_tokens`` tokens held in ``block_ids``.

    The blocks are pinned (reference-counted) until the match is released.
    """

    num_tokens: int
    block_ids: tuple[int, ...] = attrs.field(default=(), converter=_tuple_of_ints)


@attrs.frozen
class WarmPrefix:
    """A prompt prefix a pre-warm policy wants cached under ``salt`` (a tenant); ``uses`` is how
    often it recurred (decayed), for ordering and display."""

    token_ids: tuple[int, ...] = attrs.field(converter=_tuple_of_ints)
    salt: bytes = b""
    uses: float = 0.0


@attrs.frozen(kw_only=True)
class SchedulerState:
    """What a batching policy sees when the executor's scheduler asks how long to wait.

    ``now`` is the scheduler's clock (seconds, monotonic); ``waiting`` requests have not started
    their prefill, ``running`` ones are decoding, at most ``max_batch`` together;
    ``oldest_wait_s`` is how long the first waiting one has waited, ``arrival_rate`` the recent
    arrivals per second (a moving average over a few seconds).
    """

    now: float
    waiting: int
    running: int
    max_batch: int
    oldest_wait_s: float = 0.0
    arrival_rate: float = 0.0


@attrs.define(kw_only=True)
class RequestContext:
    """The mutable record of one request as it moves through the stack.

    Core creates it on arrival (``request`` may still be ``None`` before the body is
    parsed) and fills in the rest; observers read it. ``arms`` maps an A/B split layer
    to the arm this request was assigned; ``attributes`` holds plugin-defined data
    (request features, trace ids), keyed by plugin name.

    ``credential`` is the bearer token the client presented: only authenticators read it,
    and core clears it once admission has run; it is left out of ``repr``, so it never
    reaches a log line. ``api_key_id`` is a non-secret id of the key (for limits and logs),
    ``client`` the peer's address.
    """

    request_id: str
    endpoint: str
    tenant: str = "default"
    credential: str | None = attrs.field(default=None, repr=False)
    api_key_id: str | None = None
    client: str | None = None
    request: Request | None = None
    arms: dict[str, str] = attrs.field(factory=dict)
    backend: str | None = None
    received_at: float = attrs.field(factory=time.monotonic)
    first_token_at: float | None = None
    finished_at: float | None = None
    usage: Usage | None = None
    trace_context: dict[str, str] = attrs.field(factory=dict)
    attributes: dict[str, object] = attrs.field(factory=dict)

    @property
    def ttft_s(self) -> float | None:
        """Time to first token, seconds."""
        return None if self.first_token_at is None else self.first_token_at - self.received_at


@attrs.frozen(kw_only=True)
class StackInfo:
    """A built stack as observers see it: its name and, per layer, the implementation
    in use (``"round-robin"``) or, for an A/B split, ``"control=round-robin,treatment=p2c"``."""

    name: str
    components: dict[str, str] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class WorkerLaunch:
    """One replica for a :class:`~lamina_hookspecs.protocols.ReplicaProvider` to start: core's
    ``lamina worker`` command line and the files it reads. The provider places it: it picks the
    host and port, writes ``files`` into a directory of its own, and runs :meth:`argv`."""

    name: str
    """The replica's name in the pool (``replica-0``, ``canary-0``)."""
    files: dict[str, bytes]
    """File name → content (the worker's stack), for the directory ``{files}`` in ``args`` names."""
    args: tuple[str, ...]
    """The arguments after the Python interpreter, with ``{files}``, ``{host}`` and ``{port}`` to fill in."""

    def argv(self, *, python: str, files_dir: str, host: str, port: int) -> list[str]:
        """The command line to run, for the interpreter ``python`` on the worker's machine."""
        return [python, *(arg.format(files=files_dir, host=host, port=port) for arg in self.args)]

    def write_files(self, files_dir: str) -> None:
        """Write :attr:`files` into ``files_dir`` (which exists)."""
        for name, content in self.files.items():
            with open(f"{files_dir}/{name}", "wb") as out:
                out.write(content)
