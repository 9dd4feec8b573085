"""A Lamina :class:`~lamina_hookspecs.types.Request` as the body of an upstream OpenAI call.

Every request is streamed from the upstream (a non-streamed client is served from the
stream by Lamina's transport), with ``stream_options.include_usage`` for exact counts.
Each engine is asked for the token ids of what it generates in its own way:

- ``lamina`` writes them in every chunk (``choices[].token_ids``);
- ``vllm`` does with ``return_token_ids``;
- ``llama-server`` gives them only inside logprobs (``logprobs.content[].id``), so at least
  one alternative is always requested from it (and dropped when the client did not ask). When
  the client did not ask, they are its cheap post-sampling probabilities, and a greedy request
  is sent as ``top_k`` 1 (the same tokens): the probabilities of the full vocabulary, sorted
  for every token, cost llama-server a quarter of its throughput at 16 streams.

llama-server's sampler defaults differ from OpenAI's (``top_k`` 40, ``min_p`` 0.05), so it
gets both explicitly, ``0`` meaning off as in Lamina. Its repetition penalty is ``repeat_penalty``
over the last ``repeat_last_n`` tokens, sent as the whole context (``-1``) as vLLM's is; it has no
``min_tokens`` or ``stop_token_ids``, so a request using either gets a 400 naming the field.

Structured output goes to Lamina and vLLM as ``structured_outputs``; llama-server takes a JSON
Schema as ``json_schema`` and a GBNF grammar as ``grammar``, and has no regex, choice or Lark
constraint (a 400 naming the field).

A text-only upstream (``sglang``, ``tgi``, ``generic``: :data:`~lamina_upstream.options.TEXT_ONLY`)
is asked for text alone: a request for logprobs gets a 400 (they would come without the ids
Lamina's chunks carry); the other sampling fields go under vLLM's names, which SGLang shares (a
server that refuses one answers a 400, passed on); structured output goes as OpenAI's
``response_format`` (a JSON Schema or any JSON object; other constraints get a 400).
"""

from __future__ import annotations

import json
import re
from typing import Any

from lamina_hookspecs.errors import InvalidRequestError
from lamina_hookspecs.types import Request, StructuredOutput
from lamina_upstream.options import TEXT_ONLY, Engine

CHAT_PATH = "/v1/chat/completions"
COMPLETION_PATH = "/v1/completions"


def upstream_messages(request: Request) -> list[dict[str, Any]]:
    """``request``'s chat messages as OpenAI JSON. Lamina's tool parser reads the calls out of the
    reply, so tools go as text: its instructions and the calls of earlier turns."""
    return request.template_messages(template_takes_tools=False)


def upstream_call(request: Request, model: str, engine: Engine) -> tuple[str, dict[str, Any]]:
    """The path to POST and the JSON body that asks the upstream for ``request``."""
    sampling = request.sampling
    body: dict[str, Any] = {"model": model, "stream": True, "stream_options": {"include_usage": True},
                            "temperature": sampling.temperature, "top_p": sampling.top_p}
    if request.messages is not None:
        path = CHAT_PATH
        body["messages"] = upstream_messages(request)
    else:
        path = COMPLETION_PATH
        body["prompt"] = request.prompt if request.prompt is not None else list(request.prompt_token_ids or ())
    if sampling.max_tokens is not None:
        body["max_tokens"] = sampling.max_tokens
    if sampling.seed is not None:
        body["seed"] = sampling.seed
    if sampling.stop:
        body["stop"] = list(sampling.stop)
    if sampling.ignore_eos:
        body["ignore_eos"] = True
    if request.user is not None:
        body["user"] = request.user
    for field in ("stop_token_ids", "min_tokens"):
        if getattr(sampling, field) and engine == "llama-server":
            raise InvalidRequestError(f"{field} is not supported by this model's upstream (llama-server)", param=field)
    if sampling.stop_token_ids:
        body["stop_token_ids"] = list(sampling.stop_token_ids)
    if sampling.min_tokens:
        body["min_tokens"] = sampling.min_tokens
    for field in ("presence_penalty", "frequency_penalty"):
        if getattr(sampling, field):
            body[field] = getattr(sampling, field)
    if sampling.logit_bias:
        body["logit_bias"] = {str(token): bias for token, bias in sampling.logit_bias}
    if sampling.repetition_penalty != 1.0:
        if engine == "llama-server":
            body["repeat_penalty"], body["repeat_last_n"] = sampling.repetition_penalty, -1
        else:
            body["repetition_penalty"] = sampling.repetition_penalty
    if sampling.min_p and engine != "llama-server":
        body["min_p"] = sampling.min_p
    if sampling.structured is not None:
        body.update(_structured(sampling.structured, engine))
    top = sampling.top_logprobs if sampling.logprobs else None
    if top is not None and engine in TEXT_ONLY:
        raise InvalidRequestError(f"logprobs are not supported by this model's upstream ({engine}, read for text "
                                  "alone, without token ids)", param="logprobs")
    if engine == "llama-server":
        greedy_ids_only = top is None and sampling.temperature == 0
        body["top_k"], body["min_p"] = 1 if greedy_ids_only else sampling.top_k, sampling.min_p
        if top is None:
            body["post_sampling_probs"] = True
        top = max(top or 0, 1)
    elif sampling.top_k:
        body["top_k"] = sampling.top_k
    if engine == "vllm":
        body["return_token_ids"] = True
    if top is not None:
        if path == CHAT_PATH:
            body["logprobs"], body["top_logprobs"] = True, top
        else:
            body["logprobs"] = top
    return path, body


def _structured(structured: StructuredOutput, engine: Engine) -> dict[str, Any]:
    """The body fields that ask ``engine`` for ``structured``."""
    kind = structured.kind
    if engine in TEXT_ONLY and kind in ("json", "json_object"):
        return {"response_format": {"type": "json_schema", "json_schema": {
            "name": "response", "schema": json.loads(structured.spec), "strict": True}} if kind == "json"
            else {"type": "json_object"}}
    if engine in TEXT_ONLY:
        raise InvalidRequestError(f"{structured.param}: a {kind} constraint is not supported by this model's upstream "
                                  f"({engine}, asked for OpenAI's response_format, which takes JSON Schemas)",
                                  param=structured.param)
    if engine != "llama-server":
        value = {"json": lambda: json.loads(structured.spec), "json_object": lambda: True,
                 "choice": lambda: list(structured.choices)}.get(kind, lambda: structured.spec)()
        return {"structured_outputs": {kind: value}}
    if kind in ("json", "json_object"):
        return {"json_schema": json.loads(structured.spec) if kind == "json" else {"type": "object"}}
    if kind == "grammar" and not _is_lark(structured.spec):
        return {"grammar": structured.spec}
    what = "a Lark grammar" if kind == "grammar" else f"a {kind} constraint"
    raise InvalidRequestError(f"{structured.param}: {what} is not supported by this model's upstream (llama-server, "
                              "which takes JSON Schemas and GBNF grammars)", param=structured.param)


def _is_lark(grammar: str) -> bool:
    """Whether ``grammar`` is Lark (it has a ``start:`` rule) rather than GBNF, as llguidance tells them apart."""
    return re.search(r"(?m)^\s*(%llguidance\b|start\s*:)", grammar) is not None
