"""Between the pipeline's value types and ``lamina.v1`` messages, both ways.

The gRPC service writes chunks with :func:`to_proto`; a gateway talking to its workers
(:mod:`lamina.pool.remote`) writes requests with :func:`to_proto_request` and reads chunks back
with :func:`from_proto`. The gateway reads tool calls out of the text itself, so a worker
gets a chat's tools as text (the tool parser's instructions, the calls of earlier turns) and
a required call as its grammar.
"""

from __future__ import annotations

from lamina_hookspecs.types import Request, TokenChunk, ToolCallDelta, TopLogprob, Usage
from lamina.wire.proto.lamina.v1 import inference_pb2 as pb

TENANT_METADATA = "x-lamina-tenant"
"""The tenant a gateway decided, passed to its workers (read only by a ``trust_tenant`` service)."""


def to_proto(request_id: str, chunk: TokenChunk) -> pb.GenerateChunk:
    """One pipeline chunk as a ``GenerateChunk``."""
    usage = chunk.usage
    return pb.GenerateChunk(
        request_id=request_id, index=chunk.index, token_ids=chunk.token_ids, text=chunk.text,
        logprobs=chunk.logprobs or (),
        top_logprobs=[pb.TopLogprobs(alternatives=[pb.TopLogprob(token_id=a.token_id, text=a.text, logprob=a.logprob)
                                                   for a in alternatives])
                      for alternatives in chunk.top_logprobs or ()],
        finish_reason=chunk.finish_reason or "",
        usage=None if usage is None else pb.Usage(prompt_tokens=usage.prompt_tokens,
                                                  completion_tokens=usage.completion_tokens,
                                                  cached_tokens=usage.cached_tokens, queue_s=usage.queue_s),
        tool_calls=[pb.ToolCallDelta(index=d.index, id=d.id, name=d.name, arguments=d.arguments)
                    for d in chunk.tool_calls])


def from_proto(chunk: pb.GenerateChunk) -> TokenChunk:
    """A ``GenerateChunk`` with typed fields back into the pipeline's chunk (the inverse of :func:`to_proto`)."""
    usage = chunk.usage if chunk.HasField("usage") else None
    return TokenChunk(
        request_id=chunk.request_id, index=chunk.index, token_ids=tuple(chunk.token_ids), text=chunk.text,
        logprobs=tuple(chunk.logprobs) if chunk.logprobs else None,
        top_logprobs=tuple(tuple(TopLogprob(token_id=a.token_id, text=a.text, logprob=a.logprob)
                                 for a in entry.alternatives) for entry in chunk.top_logprobs)
        if chunk.top_logprobs else None,
        finish_reason=chunk.finish_reason or None,  # type: ignore[arg-type]
        usage=None if usage is None else Usage(prompt_tokens=usage.prompt_tokens,
                                               completion_tokens=usage.completion_tokens,
                                               cached_tokens=usage.cached_tokens, queue_s=usage.queue_s),
        tool_calls=[ToolCallDelta(index=d.index, id=d.id if d.HasField("id") else None,
                                  name=d.name if d.HasField("name") else None, arguments=d.arguments)
                    for d in chunk.tool_calls])


def to_proto_request(request: Request) -> pb.GenerateRequest:
    """The ``GenerateRequest`` a worker parses back into ``request`` (fields left unset where
    the request left them to the parser's defaults)."""
    s = request.sampling
    sampling = pb.SamplingParams(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, stop=s.stop,
                                 stop_token_ids=s.stop_token_ids, logprobs=s.logprobs,
                                 top_logprobs=s.top_logprobs, ignore_eos=s.ignore_eos,
                                 presence_penalty=s.presence_penalty, frequency_penalty=s.frequency_penalty,
                                 repetition_penalty=s.repetition_penalty, logit_bias=dict(s.logit_bias),
                                 min_p=s.min_p, min_tokens=s.min_tokens)
    if s.max_tokens is not None:
        sampling.max_tokens = s.max_tokens
    if s.seed is not None:
        sampling.seed = s.seed
    if s.structured is not None:
        kind, structured = s.structured.kind, sampling.structured_outputs
        if kind == "choice":
            structured.choice.choices.extend(s.structured.choices)
        elif kind == "json_object":
            structured.json_object = True
        else:
            setattr(structured, kind, s.structured.spec)
    message = pb.GenerateRequest(request_id=request.id, model=request.model, sampling=sampling,
                                 user=request.user or "", fork_of=request.fork_of or "")
    if request.messages is not None:  # tools travel as text: the parser's instructions and the calls made
        message.chat.messages.extend(pb.ChatMessage(role=m["role"], content=m["content"],
                                                    tool_call_id=m.get("tool_call_id", ""))
                                     for m in request.template_messages(template_takes_tools=False))
    elif request.prompt_token_ids is not None:
        message.token_ids.ids.extend(request.prompt_token_ids)
    else:
        message.text = request.prompt or ""
    return message
