"""OpenAI request bodies to :class:`Request`, and whole (non-streamed) results to OpenAI JSON.

Parsing checks every field it knows with an error that names it
(``temperature: must be a number between 0 and 2``); ``null`` means "not given" for every
optional field. Fields OpenAI defines but Lamina does not support yet, or supports only at one
value (``best_of`` other than ``n``), are refused with a 400 rather than silently ignored. Fields it does not know
are refused too: the HTTP server removes them first unless the stack asks for strict fields
(`unknown_fields`).

A chat's ``tools`` (functions with a JSON-Schema ``parameters``), ``tool_choice`` (``none``,
``auto``, ``required`` or ``{"type": "function", "function": {"name": ...}}``; ``auto`` when there
are tools) and ``parallel_tool_calls`` are read here; history may hold assistant turns with
``tool_calls`` (``content`` then may be ``null``) and ``tool`` turns answering a ``tool_call_id``.
Besides OpenAI's fields, vLLM's sampling extensions are read: ``top_k``, ``min_p``,
``repetition_penalty``, ``min_tokens``, ``ignore_eos`` and ``stop_token_ids``.

Structured output comes as OpenAI's ``response_format`` (``json_object``, or ``json_schema`` with
its ``schema``), as vLLM's ``structured_outputs`` object (one of ``json``, ``json_object``,
``regex``, ``choice``, ``grammar``) or as vLLM's older ``guided_json``, ``guided_regex``,
``guided_choice`` and ``guided_grammar``; at most one constraint per request. Its shape is checked
here; whether a schema, regex or grammar compiles is the executor's to say.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from lamina_hookspecs.errors import InvalidRequestError
from lamina_hookspecs.types import (MAX_CHOICES, MAX_LOGIT_BIAS, MAX_STOPS, MAX_TOP_LOGPROBS, ROLE_ALIASES, ROLES, STRUCTURED_KINDS,
                                    ChatMessage, Completion, Request, SamplingParams, StructuredOutput, TokenChunk,
                                    TOOL_CHOICE_RULE, TOOL_NAME_PATTERN, TOOL_NAME_RULE, Tool, ToolCall, ToolChoice,
                                    Usage)

_COMMON = {"model", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "n", "stream", "stream_options",
           "user", "presence_penalty", "frequency_penalty", "logit_bias", "ignore_eos", "stop_token_ids",
           "repetition_penalty", "min_p", "min_tokens", "response_format", "structured_outputs", "guided_json",
           "guided_regex", "guided_choice", "guided_grammar"}
COMPLETION_FIELDS = _COMMON | {"prompt", "logprobs", "echo", "best_of", "suffix"}
CHAT_FIELDS = _COMMON | {"messages", "max_completion_tokens", "logprobs", "top_logprobs", "parallel_tool_calls",
                         "tools", "tool_choice"}
COMPLETION_MAX_TOKENS = 16
"""A completion's ``max_tokens`` when the body gives none, as OpenAI's legacy completions API has it."""
TOKENIZE_FIELDS = {"model", "prompt", "messages", "add_special_tokens", "add_generation_prompt"}
DETOKENIZE_FIELDS = {"model", "tokens"}
FIELDS = {"completion": COMPLETION_FIELDS, "chat": CHAT_FIELDS, "tokenize": TOKENIZE_FIELDS,
          "detokenize": DETOKENIZE_FIELDS}
"""Every field each endpoint's parser reads, by endpoint."""


def unknown_fields(endpoint: str, body: Mapping[str, Any]) -> list[str]:
    """The top-level fields of ``body`` that ``endpoint``'s parser does not know, sorted."""
    return sorted(set(body) - FIELDS[endpoint])


def _fail(param: str, message: str) -> InvalidRequestError:
    return InvalidRequestError(f"{param}: {message}", param=param)


def _number(body: Mapping[str, Any], key: str, lo: float, hi: float, default: float) -> float:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi:
        raise _fail(key, f"must be a number between {lo:g} and {hi:g}; got {value!r}")
    return float(value)


def _integer(body: Mapping[str, Any], key: str, lo: int, default: int | None) -> int | None:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise _fail(key, f"must be an integer >= {lo}; got {value!r}")
    return value


def _only(body: Mapping[str, Any], key: str, allowed: Callable[[Any], bool], what: str) -> None:
    if key in body and body[key] is not None and not allowed(body[key]):
        raise _fail(key, f"only {what} is supported")


def _check_fields(body: Mapping[str, Any], known: set[str]) -> None:
    if not isinstance(body, Mapping):
        raise InvalidRequestError("the request body must be a JSON object")
    unknown = sorted(set(body) - known)
    if unknown:  # the HTTP server has removed them unless the stack asks for strict fields
        raise _fail(unknown[0], "unrecognized request argument")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _fail("model", "required: the id of a model from GET /v1/models")
    n = _choices(body)
    _only(body, "best_of", lambda v: isinstance(v, int) and not isinstance(v, bool) and v == n,
          "best_of equal to n (every choice generated is returned)")
    _only(body, "suffix", lambda v: False, "no suffix")
    for key in ("stream", "ignore_eos", "parallel_tool_calls", "echo"):
        if body.get(key) is not None and not isinstance(body[key], bool):
            raise _fail(key, f"must be true or false; got {body[key]!r}")
    options = body.get("stream_options")
    if options is not None and (not isinstance(options, Mapping) or set(options) - {"include_usage"}
                                or not isinstance(options.get("include_usage", False), bool)):
        raise _fail("stream_options", "must be an object with a boolean include_usage")


def _choices(body: Mapping[str, Any]) -> int:
    """The number of choices asked for (``n``)."""
    n = _integer(body, "n", 1, 1) or 1
    if n > MAX_CHOICES:
        raise _fail("n", f"must be between 1 and {MAX_CHOICES}; got {n}")
    return n


def _stop(body: Mapping[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or len(stops) > MAX_STOPS or not all(isinstance(s, str) and s for s in stops):
        raise _fail("stop", f"must be a non-empty string or a list of at most {MAX_STOPS} of them")
    return tuple(stops)


def _logit_bias(body: Mapping[str, Any]) -> tuple[tuple[int, float], ...]:
    bias = body.get("logit_bias")
    if bias is None:
        return ()
    if not isinstance(bias, Mapping) or len(bias) > MAX_LOGIT_BIAS:
        raise _fail("logit_bias", f"must be an object of at most {MAX_LOGIT_BIAS} token ids to numbers")
    pairs = []
    for key, value in bias.items():
        if not (isinstance(key, str) and re.fullmatch("[0-9]{1,9}", key)):
            raise _fail("logit_bias", f"keys must be token ids (integers from 0, as strings); got {key!r}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not -100 <= value <= 100:
            raise _fail("logit_bias", f"values must be numbers between -100 and 100; got {value!r} for {key}")
        pairs.append((int(key), float(value)))
    return tuple(pairs)


_GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}
"""vLLM's older structured-output fields, by the `StructuredOutput` kind each gives."""


def _constraint(kind: str, value: Any, param: str) -> StructuredOutput | None:
    """One constraint given as ``value`` for ``kind`` (``None`` for ``json_object: false``)."""
    if kind == "json":
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                raise _fail(param, "must be a JSON schema: an object, or its JSON text") from None
        if not isinstance(value, Mapping):
            raise _fail(param, "must be a JSON schema: an object, or its JSON text")
        return StructuredOutput(kind="json", spec=json.dumps(value), param=param)
    if kind == "json_object":
        if not isinstance(value, bool):
            raise _fail(param, f"must be true or false; got {value!r}")
        return StructuredOutput(kind="json_object", param=param) if value else None
    if kind == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
            raise _fail(param, "must be a non-empty list of non-empty strings")
        return StructuredOutput(kind="choice", choices=tuple(value), param=param)
    if not isinstance(value, str) or not value:
        raise _fail(param, "must be a non-empty string")
    return StructuredOutput(kind=kind, spec=value, param=param)  # type: ignore[arg-type]


def _response_format(value: Any) -> StructuredOutput | None:
    kind = value.get("type") if isinstance(value, Mapping) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutput(kind="json_object", param="response_format")
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, Mapping) or not isinstance(spec.get("schema"), Mapping):
            raise _fail("response_format.json_schema", "required: an object whose schema is the JSON Schema the "
                                                       "reply must match")
        return StructuredOutput(kind="json", spec=json.dumps(spec["schema"]), param="response_format")
    raise _fail("response_format", "must be an object whose type is text, json_object or json_schema")


def _structured(body: Mapping[str, Any]) -> StructuredOutput | None:
    """The request's one structured-output constraint, from whichever field gives it."""
    found: list[StructuredOutput | None] = []
    if body.get("response_format") is not None:
        found.append(_response_format(body["response_format"]))
    given = body.get("structured_outputs")
    if given is not None:
        if not isinstance(given, Mapping):
            raise _fail("structured_outputs", "must be an object")
        for key, value in given.items():
            if key not in STRUCTURED_KINDS:
                raise _fail(f"structured_outputs.{key}", f"not supported; use one of {', '.join(STRUCTURED_KINDS)}")
            if value is not None:
                found.append(_constraint(key, value, f"structured_outputs.{key}"))
    found += [_constraint(kind, body[key], key) for key, kind in _GUIDED.items() if body.get(key) is not None]
    constraints = [c for c in found if c is not None]
    if len(constraints) > 1:
        raise _fail(constraints[1].param, f"a request takes one structured output constraint; {constraints[0].param} "
                                          "gives one already")
    return constraints[0] if constraints else None


def _sampling(body: Mapping[str, Any], max_tokens_key: str, default_max: int | None,
              logprobs: bool, top_logprobs: int) -> SamplingParams:
    max_tokens = _integer(body, max_tokens_key, 1, _integer(body, "max_tokens", 1, default_max))
    top_k = _integer(body, "top_k", -1, 0)
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise _fail("seed", f"must be an integer; got {seed!r}")
    stop_ids = body.get("stop_token_ids")
    stop_ids = [] if stop_ids is None else stop_ids
    if not isinstance(stop_ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in stop_ids):
        raise _fail("stop_token_ids", "must be a list of integers")
    top_p = _number(body, "top_p", 0.0, 1.0, 1.0)
    if top_p == 0:
        raise _fail("top_p", "must be greater than 0")
    repetition = _number(body, "repetition_penalty", 0.0, 10.0, 1.0)
    if repetition == 0:
        raise _fail("repetition_penalty", "must be greater than 0")
    min_tokens = _integer(body, "min_tokens", 0, 0) or 0
    if max_tokens is not None and min_tokens > max_tokens:
        raise _fail("min_tokens", f"must be at most max_tokens ({max_tokens}); got {min_tokens}")
    return SamplingParams(
        max_tokens=max_tokens, temperature=_number(body, "temperature", 0.0, 2.0, 1.0), top_p=top_p,
        top_k=max(top_k or 0, 0), seed=seed, stop=_stop(body), stop_token_ids=tuple(stop_ids),
        logprobs=logprobs, top_logprobs=top_logprobs, ignore_eos=bool(body.get("ignore_eos", False)),
        presence_penalty=_number(body, "presence_penalty", -2.0, 2.0, 0.0),
        frequency_penalty=_number(body, "frequency_penalty", -2.0, 2.0, 0.0), repetition_penalty=repetition,
        logit_bias=_logit_bias(body), min_p=_number(body, "min_p", 0.0, 1.0, 0.0), min_tokens=min_tokens,
        structured=_structured(body),
    )


def parse_completion(body: Mapping[str, Any], request_id: str, tenant: str) -> Request:
    """A ``POST /v1/completions`` body as a :class:`Request`."""
    _check_fields(body, COMPLETION_FIELDS)
    text, ids = _prompt(body)
    logprobs = _integer(body, "logprobs", 0, None)
    if logprobs is not None and logprobs > 5:
        raise _fail("logprobs", f"must be between 0 and 5; got {logprobs}")
    echo = _flag(body, "echo", False)
    if echo and logprobs is not None:
        raise _fail("echo", "with logprobs it needs the prompt's logprobs, which Lamina does not return yet")
    return Request(id=request_id, model=body["model"], prompt=text, prompt_token_ids=ids, tenant=tenant,
                   user=_user(body), stream=bool(body.get("stream", False)), echo=echo, n=_choices(body),
                   sampling=_sampling(body, "max_tokens", COMPLETION_MAX_TOKENS, logprobs is not None,
                                      logprobs or 0))


def _prompt(body: Mapping[str, Any]) -> tuple[str | None, list[int] | None]:
    """A completion body's one prompt: its text, or its token ids."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    text, ids = None, None
    if isinstance(prompt, str) and prompt:
        text = prompt
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                                     for t in prompt):
        ids = prompt
    else:
        raise _fail("prompt", "required: a non-empty string or list of token ids (one prompt per request)")
    return text, ids


def _content(message: Mapping[str, Any], path: str) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, Mapping) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise _fail(f"{path}.content", "must be a string or a list of text parts")


_TOOL_NAME = re.compile(TOOL_NAME_PATTERN)


def _tools(body: Mapping[str, Any]) -> tuple[Tool, ...]:
    tools = body.get("tools")
    if tools is None:
        return ()
    if not isinstance(tools, list):
        raise _fail("tools", "must be a list of {\"type\": \"function\", \"function\": {...}} objects")
    parsed, names = [], set()
    for i, tool in enumerate(tools):
        path = f"tools[{i}]"
        if not isinstance(tool, Mapping) or tool.get("type") != "function" or not isinstance(tool.get("function"),
                                                                                              Mapping):
            raise _fail(path, "must be an object with type \"function\" and a function object")
        function = tool["function"]
        name = function.get("name")
        if not isinstance(name, str) or not _TOOL_NAME.fullmatch(name):
            raise _fail(f"{path}.function.name", TOOL_NAME_RULE)
        if name in names:
            raise _fail(f"{path}.function.name", f"{name!r} is the name of an earlier tool")
        names.add(name)
        description = function.get("description")
        if description is not None and not isinstance(description, str):
            raise _fail(f"{path}.function.description", "must be a string")
        parameters = function.get("parameters")
        if parameters is not None and not isinstance(parameters, Mapping):
            raise _fail(f"{path}.function.parameters", "must be a JSON Schema object")
        parsed.append(Tool(name=name, description=description or "",
                           parameters=json.dumps(parameters if parameters is not None
                                                 else {"type": "object", "properties": {}})))
    return tuple(parsed)


def _tool_choice(body: Mapping[str, Any], tools: tuple[Tool, ...]) -> ToolChoice:
    choice = body.get("tool_choice")
    if choice is None:
        return ToolChoice(mode="auto" if tools else "none")
    if choice in ("none", "auto", "required"):
        if choice == "required" and not tools:
            raise _fail("tool_choice", "required needs tools to call")
        return ToolChoice(mode=choice)
    function = choice.get("function") if isinstance(choice, Mapping) and choice.get("type") == "function" else None
    name = function.get("name") if isinstance(function, Mapping) else None
    if not isinstance(name, str):
        raise _fail("tool_choice", TOOL_CHOICE_RULE)
    if name not in {t.name for t in tools}:
        raise _fail("tool_choice", f"names {name!r}, which is not one of the tools")
    return ToolChoice(mode="function", name=name)


def parse_chat(body: Mapping[str, Any], request_id: str, tenant: str) -> Request:
    """A ``POST /v1/chat/completions`` body as a :class:`Request`."""
    _check_fields(body, CHAT_FIELDS)
    messages = _messages(body)
    logprobs = body.get("logprobs")
    logprobs = False if logprobs is None else logprobs
    if not isinstance(logprobs, bool):
        raise _fail("logprobs", f"must be true or false; got {logprobs!r}")
    top = _integer(body, "top_logprobs", 0, 0) or 0
    if top > MAX_TOP_LOGPROBS or (top and not logprobs):
        raise _fail("top_logprobs", f"must be between 0 and {MAX_TOP_LOGPROBS}, with logprobs = true")
    tools = _tools(body)
    return Request(id=request_id, model=body["model"], messages=messages, tenant=tenant, user=_user(body),
                   stream=bool(body.get("stream", False)), n=_choices(body),
                   sampling=_sampling(body, "max_completion_tokens", None, logprobs, top),
                   tools=tools, tool_choice=_tool_choice(body, tools),
                   parallel_tool_calls=_flag(body, "parallel_tool_calls", True))


def _messages(body: Mapping[str, Any]) -> tuple[ChatMessage, ...]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _fail("messages", "required: a non-empty list of messages")
    parsed = []
    for i, message in enumerate(messages):
        path = f"messages[{i}]"
        if not isinstance(message, Mapping):
            raise _fail(path, "must be an object with role and content")
        role = message.get("role")
        role = ROLE_ALIASES.get(role, role) if isinstance(role, str) else role
        if role not in ROLES:
            raise _fail(f"{path}.role", f"must be one of {', '.join((*ROLES, *ROLE_ALIASES))}")
        calls = _history_calls(message, path) if role == "assistant" else ()
        content = "" if calls and message.get("content") is None else _content(message, path)
        call_id = message.get("tool_call_id")
        if role == "tool" and not isinstance(call_id, str):
            raise _fail(f"{path}.tool_call_id", "required: the id of the call this tool turn answers")
        parsed.append(ChatMessage(role=role, content=content, tool_calls=calls,
                                  tool_call_id=call_id if role == "tool" else None))
    return tuple(parsed)


def _history_calls(message: Mapping[str, Any], path: str) -> tuple[ToolCall, ...]:
    """The ``tool_calls`` an assistant turn of the history made."""
    calls = message.get("tool_calls")
    if calls is None:
        return ()
    if not isinstance(calls, list):
        raise _fail(f"{path}.tool_calls", "must be a list of calls")
    parsed = []
    for i, call in enumerate(calls):
        where = f"{path}.tool_calls[{i}]"
        if not isinstance(call, Mapping):
            raise _fail(where, "must be an object with id and function")
        function = call.get("function")
        if not isinstance(function, Mapping):
            raise _fail(f"{where}.function", "required: an object with name and arguments")
        for key, value in (("id", call.get("id")), ("function.name", function.get("name")),
                           ("function.arguments", function.get("arguments"))):
            if not isinstance(value, str):
                raise _fail(f"{where}.{key}", "required: a string" + " (JSON text)" * (key == "function.arguments"))
        parsed.append(ToolCall(id=call["id"], name=function["name"], arguments=function["arguments"]))
    return tuple(parsed)


def _flag(body: Mapping[str, Any], key: str, default: bool) -> bool:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _fail(key, f"must be true or false; got {value!r}")
    return value


def parse_tokenize(body: Mapping[str, Any], request_id: str, tenant: str) -> tuple[Request, bool, bool]:
    """A ``POST /tokenize`` body (vLLM's: a completion's ``prompt`` or a chat's ``messages``) as the
    :class:`Request` it describes, ``add_special_tokens`` and ``add_generation_prompt``."""
    _check_fields(body, TOKENIZE_FIELDS)
    chat = body.get("messages") is not None
    if chat:
        request = Request(id=request_id, model=body["model"], messages=_messages(body), tenant=tenant)
    else:
        text, ids = _prompt(body)
        request = Request(id=request_id, model=body["model"], prompt=text, prompt_token_ids=ids, tenant=tenant)
    return request, _flag(body, "add_special_tokens", not chat), _flag(body, "add_generation_prompt", True)


def parse_detokenize(body: Mapping[str, Any]) -> list[int]:
    """The ``tokens`` of a ``POST /detokenize`` body."""
    _check_fields(body, DETOKENIZE_FIELDS)
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise _fail("tokens", "required: a list of token ids")
    return tokens


def _user(body: Mapping[str, Any]) -> str | None:
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise _fail("user", "must be a string")
    return user


def join(request_id: str, chunks: Sequence[TokenChunk]) -> Completion:
    """The chunks of one finished request as a :class:`Completion`."""
    final = chunks[-1]
    usage = final.usage or Usage(prompt_tokens=0, completion_tokens=sum(len(c.token_ids) for c in chunks))
    calls: dict[int, list[str]] = {}  # index: id, name, then the arguments' fragments
    for delta in (d for c in chunks for d in c.tool_calls):
        calls.setdefault(delta.index, [delta.id or "", delta.name or ""]).append(delta.arguments)
    return Completion(request_id=request_id, text="".join(c.text for c in chunks),
                      token_ids=tuple(t for c in chunks for t in c.token_ids),
                      finish_reason=final.finish_reason or "stop", usage=usage,
                      tool_calls=[ToolCall(id=parts[0], name=parts[1], arguments="".join(parts[2:]))
                                  for _, parts in sorted(calls.items())])


def _usage(usage: Usage) -> dict[str, Any]:
    return {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.total_tokens, "prompt_tokens_details": {"cached_tokens": usage.cached_tokens}}


def _chat_logprobs(chunks: Sequence[TokenChunk]) -> dict[str, Any]:
    content = []
    for chunk in chunks:
        for i, logprob in enumerate(chunk.logprobs or ()):
            text = chunk.text if i == 0 else ""
            alternatives = chunk.top_logprobs[i] if chunk.top_logprobs else ()
            content.append({"token": text, "logprob": logprob, "bytes": list(text.encode()),
                            "top_logprobs": [{"token": a.text, "logprob": a.logprob, "bytes": list(a.text.encode())}
                                             for a in alternatives]})
    return {"content": content}


def _completion_logprobs(chunks: Sequence[TokenChunk]) -> dict[str, Any]:
    tokens, logprobs, tops, offsets, offset = [], [], [], [], 0
    for chunk in chunks:
        for i, logprob in enumerate(chunk.logprobs or ()):
            text = chunk.text if i == 0 else ""
            tokens.append(text)
            logprobs.append(logprob)
            tops.append({a.text: a.logprob for a in reversed(chunk.top_logprobs[i])} if chunk.top_logprobs else {})
            offsets.append(offset)
            offset += len(text)
    return {"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": tops, "text_offset": offsets}


def completion_body(kind: str, request: Request, chunks: Sequence[TokenChunk]) -> dict[str, Any]:
    """The OpenAI JSON response of a non-streamed request (``kind`` is ``chat`` or ``completion``), from
    its chunks (of every choice, as one stream)."""
    wants_logprobs = request.sampling.logprobs
    final = chunks[-1]
    choices = []
    for index in range(request.n):
        mine = [c for c in chunks if c.choice == index]
        result = join(request.id, mine)
        if kind == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": result.text}
            if result.tool_calls:
                message["content"] = result.text or None
                message["tool_calls"] = [call.to_openai() for call in result.tool_calls]
            choices.append({"index": index, "message": message,
                            "logprobs": _chat_logprobs(mine) if wants_logprobs else None,
                            "finish_reason": result.finish_reason})
        else:
            choices.append({"index": index, "text": result.text,
                            "logprobs": _completion_logprobs(mine) if wants_logprobs else None,
                            "finish_reason": result.finish_reason})
    usage = final.usage or Usage(prompt_tokens=0, completion_tokens=sum(len(c.token_ids) for c in chunks))
    return {"id": request.id, "object": "chat.completion" if kind == "chat" else "text_completion",
            "created": int(time.time()), "model": request.model, "choices": choices, "usage": _usage(usage)}
