"""What Lamina's gateway costs: streamed tokens through its HTTP and gRPC APIs vs bare endpoints.

Lamina serves a stack whose ``echo`` executor emits tokens as fast as it can (no model), so
everything measured is the framework: admission, routing, lifecycle hooks, codec, transport.
A bare Starlette/uvicorn app in its own process streams the very same SSE bytes with no
Lamina logic, and a bare ``grpc.aio`` server streams the very same chunk messages. Each pair
is driven by the same client in alternating rounds (A B A B ...), at 1, 16 and 64 concurrent
streams, and the script prints aggregate streamed tokens/s, requests/s
and the p50/p99 latency per token (a request's time from sending to its last byte, divided
by its tokens) for each, with the ratio Lamina/bare and the latency Lamina adds per token.

    uv run python benchmarks/gateway_overhead.py            # 3 rounds, 1/16/64 streams
    uv run python benchmarks/gateway_overhead.py --quick    # 1 round, 1/16 streams
    uv run python benchmarks/gateway_overhead.py --json     # last stdout line: one JSON object
    uv run python benchmarks/gateway_overhead.py --tracing  # OpenTelemetry off vs on (100%, 1%)

``--tracing`` instead compares Lamina with tracing off against the same stack with the
``otel`` observer sampling 100% and 1% of requests, exporting OTLP/HTTP to a local sink
process that accepts and drops the spans (so export cost is included, not a collector's).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable
from pathlib import Path

import grpc
import httpx
from tqdm import tqdm

from lamina.tools.bench.servers import free_port
from lamina.wire.proto.lamina.v1 import inference_pb2 as pb
from lamina.wire.proto.lamina.v1 import inference_pb2_grpc as pb_grpc

TOKENS = 64
PROMPT = " ".join(f"w{i}" for i in range(TOKENS))
BODY = {"model": "echo", "prompt": PROMPT, "max_tokens": TOKENS, "stream": True}

BARE_GRPC = '''
import asyncio, os, sys
import grpc
from lamina.wire.proto.lamina.v1 import inference_pb2 as pb, inference_pb2_grpc as pb_grpc

CHUNKS = [pb.GenerateChunk.FromString(bytes.fromhex(line)) for line in open(os.environ["BARE_CHUNKS_FILE"])]

class Bare(pb_grpc.InferenceServicer):
    async def Generate(self, request, context):
        for chunk in CHUNKS:
            await context.write(chunk)

async def main():
    server = grpc.aio.server()
    pb_grpc.add_InferenceServicer_to_server(Bare(), server)
    server.add_insecure_port("127.0.0.1:" + sys.argv[1])
    await server.start()
    await server.wait_for_termination()

asyncio.run(main())
'''

BARE_APP = '''
import os
from starlette.applications import Starlette
from starlette.responses import StreamingResponse
from starlette.routing import Route

EVENTS = open(os.environ["BARE_EVENTS_FILE"], "rb").read().split(b"\\n\\n")[:-1]

async def stream(request):
    await request.body()
    async def events():
        for event in EVENTS:
            yield event + b"\\n\\n"
    return StreamingResponse(events(), media_type="text/event-stream")

app = Starlette(routes=[Route("/v1/completions", stream, methods=["POST"])])
'''

SINK_APP = '''
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route

async def traces(request):
    await request.body()
    return Response(b"", media_type="application/x-protobuf")

app = Starlette(routes=[Route("/v1/traces", traces, methods=["POST"])])
'''


def wait_ready(url: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server {url} exited with {process.returncode}")
        try:
            httpx.post(f"{url}/v1/completions", json={**BODY, "stream": False}, timeout=5)
            return
        except httpx.TransportError:
            time.sleep(0.1)
    raise RuntimeError(f"server {url} did not start")


async def one_stream(client: httpx.AsyncClient, url: str, per_token: list[float]) -> int:
    tokens = -1  # the finish event carries no token
    start = time.perf_counter()
    async with client.stream("POST", f"{url}/v1/completions", json=BODY) as response:
        async for line in response.aiter_lines():
            tokens += line.startswith("data: {")
    per_token.append((time.perf_counter() - start) / tokens)
    return tokens


def grpc_request() -> pb.GenerateRequest:
    return pb.GenerateRequest(model="echo", text=PROMPT, sampling=pb.SamplingParams(max_tokens=TOKENS))


async def one_grpc_stream(stub: pb_grpc.InferenceStub, per_token: list[float]) -> int:
    start, tokens = time.perf_counter(), 0
    async for chunk in stub.Generate(grpc_request()):
        tokens += len(chunk.token_ids)
    per_token.append((time.perf_counter() - start) / tokens)
    return tokens


async def run_level(url: str, concurrency: int, requests: int) -> dict[str, float]:
    """``requests`` streams over ``concurrency`` workers, to an ``http://`` or ``grpc://`` target."""
    per_token: list[float] = []
    queue = list(range(requests))
    async with contextlib.AsyncExitStack() as stack:
        if url.startswith("grpc://"):
            channel = await stack.enter_async_context(grpc.aio.insecure_channel(url.removeprefix("grpc://")))
            stub = pb_grpc.InferenceStub(channel)

            def stream() -> Awaitable[int]:
                return one_grpc_stream(stub, per_token)
        else:
            limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
            client = await stack.enter_async_context(httpx.AsyncClient(timeout=60, limits=limits))

            def stream() -> Awaitable[int]:
                return one_stream(client, url, per_token)

        async def worker() -> int:
            done = 0
            while queue:
                queue.pop()
                done += await stream()
            return done

        start = time.perf_counter()
        tokens = sum(await asyncio.gather(*(worker() for _ in range(concurrency))))
        elapsed = time.perf_counter() - start
    per_token.sort()
    return {"tokens_per_s": tokens / elapsed, "requests_per_s": requests / elapsed,
            "token_p50_ms": 1000 * per_token[len(per_token) // 2],
            "token_p99_ms": 1000 * per_token[int(len(per_token) * 0.99)]}


async def wait_grpc(url: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            await _grpc_chunks(url.removeprefix("grpc://"))
            return
        except grpc.aio.AioRpcError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"bare gRPC server {url} did not start") from None
            await asyncio.sleep(0.1)


ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


def start_lamina(workdir: Path, name: str, grpc_port: int, extra_toml: str = "") -> tuple[str, subprocess.Popen[bytes]]:
    """``lamina serve`` of the echo stack (plus ``extra_toml``) in its own process, once it answers."""
    stack, port = workdir / f"{name}.toml", free_port()
    stack.write_text(f'[stack]\nname = "overhead"\n[executor]\nuse = "echo"\n[server]\ngrpc_port = {grpc_port}\n'
                     + extra_toml)
    log = (workdir / f"{name}.log").open("wb")
    process = subprocess.Popen([sys.executable, "-m", "lamina.cli", "serve", str(stack), "--port", str(port)],
                               stdout=log, stderr=subprocess.STDOUT, env=ENV)
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, process)
    return url, process


def start_servers(workdir: Path) -> tuple[dict[str, str], list[subprocess.Popen[bytes]]]:
    bare_port, lamina_grpc, bare_grpc = free_port(), free_port(), free_port()
    env, log = ENV, (workdir / "servers.log").open("wb")
    lamina_url, lamina = start_lamina(workdir, "lamina", lamina_grpc)
    urls = {"lamina": lamina_url}
    events = httpx.post(f"{urls['lamina']}/v1/completions", json=BODY, timeout=30).content
    (workdir / "events.sse").write_bytes(events)
    (workdir / "bare_app.py").write_text(BARE_APP)
    bare = subprocess.Popen([sys.executable, "-m", "uvicorn", "--app-dir", str(workdir), "bare_app:app",
                             "--port", str(bare_port), "--log-level", "warning", "--no-access-log"],
                            stdout=log, stderr=subprocess.STDOUT, cwd=workdir,
                            env={**env, "BARE_EVENTS_FILE": str(workdir / "events.sse")})
    urls["bare"] = f"http://127.0.0.1:{bare_port}"
    chunks = asyncio.run(_grpc_chunks(f"127.0.0.1:{lamina_grpc}"))
    (workdir / "chunks.hex").write_text("".join(c.SerializeToString().hex() + "\n" for c in chunks))
    (workdir / "bare_grpc.py").write_text(BARE_GRPC)
    bare_g = subprocess.Popen([sys.executable, str(workdir / "bare_grpc.py"), str(bare_grpc)], stdout=log,
                              stderr=subprocess.STDOUT, env={**env, "BARE_CHUNKS_FILE": str(workdir / "chunks.hex")})
    urls["lamina-grpc"], urls["bare-grpc"] = f"grpc://127.0.0.1:{lamina_grpc}", f"grpc://127.0.0.1:{bare_grpc}"
    return urls, [lamina, bare, bare_g]


def start_tracing_servers(workdir: Path) -> tuple[dict[str, str], list[subprocess.Popen[bytes]]]:
    """Tracing off, on at 100% and on at 1%, exporting to a local OTLP/HTTP sink."""
    sink_port = free_port()
    (workdir / "sink_app.py").write_text(SINK_APP)
    sink = subprocess.Popen([sys.executable, "-m", "uvicorn", "--app-dir", str(workdir), "sink_app:app",
                             "--port", str(sink_port), "--log-level", "warning", "--no-access-log"],
                            stdout=(workdir / "sink.log").open("wb"), stderr=subprocess.STDOUT, env=ENV)
    urls, processes = {}, [sink]
    for name, ratio in (("off", None), ("otel-100%", 1.0), ("otel-1%", 0.01)):
        extra = "" if ratio is None else (f'[[observers]]\nuse = "otel"\nsample_ratio = {ratio}\n'
                                          f'endpoint = "http://127.0.0.1:{sink_port}/v1/traces"\n')
        urls[name], process = start_lamina(workdir, name, free_port(), extra)
        processes.append(process)
    return urls, processes


def measure(urls: dict[str, str], levels: list[int], rounds: int, quick: bool
            ) -> dict[str, dict[str, list[dict[str, float]]]]:
    """Alternating rounds (one per server in turn) at each concurrency level, after an untimed warm-up."""
    results: dict[str, dict[str, list[dict[str, float]]]] = {name: {} for name in urls}
    steps = tqdm(total=len(levels) * rounds * len(urls), desc="rounds", file=sys.stderr)
    for concurrency in levels:
        requests = max(100, concurrency * 6) if quick else max(300, concurrency * 10)
        for name in urls:  # warm-up, untimed
            asyncio.run(run_level(urls[name], concurrency, concurrency))
        for _ in range(rounds):
            for name in urls:
                results[name].setdefault(str(concurrency), []).append(
                    asyncio.run(run_level(urls[name], concurrency, requests)))
                steps.update()
    steps.close()
    return results


def medians(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(run[key] for run in runs) for key in runs[0]}


def print_row(concurrency: int, name: str, row: dict[str, float]) -> None:
    print(f"{concurrency:>7} {name:>11} {row['tokens_per_s']:>9.0f} {row['requests_per_s']:>8.1f} "
          f"{row['token_p50_ms']:>13.3f} {row['token_p99_ms']:>13.3f}")


HEADER = f"{'streams':>7} {'server':>11} {'tok/s':>9} {'req/s':>8} {'ms/token p50':>13} {'ms/token p99':>13}"


def tracing_report(results: dict[str, dict[str, list[dict[str, float]]]], levels: list[int]) -> dict[str, object]:
    """Each tracing setting against tracing off: throughput ratio and latency added per request."""
    summary: dict[str, object] = {"tokens_per_request": TOKENS, "levels": {}}
    print(HEADER)
    for concurrency in levels:
        level = {name: medians(runs[str(concurrency)]) for name, runs in results.items()}
        entry: dict[str, object] = dict(level)
        for name, row in level.items():
            print_row(concurrency, name, row)
        for name in ("otel-100%", "otel-1%"):
            ratio = level[name]["requests_per_s"] / level["off"]["requests_per_s"]
            added = (level[name]["token_p50_ms"] - level["off"]["token_p50_ms"]) * TOKENS
            print(f"{'':>7} {name:>11} {ratio:>5.3f}   of tracing-off requests/s; added per request p50 "
                  f"{added:.3f} ms")
            entry[name + " vs off"] = {"requests_per_s_ratio": ratio, "added_ms_per_request_p50": added}
        summary["levels"][str(concurrency)] = entry  # type: ignore[index]
    return summary


async def _grpc_chunks(target: str) -> list[pb.GenerateChunk]:
    async with grpc.aio.insecure_channel(target) as channel:
        return [chunk async for chunk in pb_grpc.InferenceStub(channel).Generate(grpc_request())]


def overhead_report(results: dict[str, dict[str, list[dict[str, float]]]], levels: list[int], rounds: int
                    ) -> dict[str, object]:
    """Lamina against the bare servers, per transport: throughput ratio and latency added per token."""
    summary: dict[str, object] = {"tokens_per_request": TOKENS, "rounds": rounds, "levels": {}}
    print(HEADER)
    for concurrency in levels:
        level = {name: medians(runs[str(concurrency)]) for name, runs in results.items()}
        for name, row in level.items():
            print_row(concurrency, name, row)
        entry: dict[str, object] = dict(level)
        for transport, ours, bare in (("http", "lamina", "bare"), ("grpc", "lamina-grpc", "bare-grpc")):
            ratio = level[ours]["tokens_per_s"] / level[bare]["tokens_per_s"]
            added = level[ours]["token_p50_ms"] - level[bare]["token_p50_ms"]
            added99 = level[ours]["token_p99_ms"] - level[bare]["token_p99_ms"]
            print(f"{'':>7} {transport + ' ratio':>11} {ratio:>5.2f}   lamina/bare tokens/s; added per token "
                  f"p50 {added:.3f} ms, p99 {added99:.3f} ms")
            entry[transport] = {"lamina_over_bare_tokens_per_s": ratio, "added_ms_per_token_p50": added,
                                "added_ms_per_token_p99": added99}
        summary["levels"][str(concurrency)] = entry  # type: ignore[index]
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 round at 1 and 16 streams")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    parser.add_argument("--rounds", type=int, help="alternating rounds per level (default 3, quick 1)")
    parser.add_argument("--tracing", action="store_true", help="tracing off vs otel at 100%% and 1%% sampling")
    args = parser.parse_args()
    levels = [1, 16] if args.quick else [1, 16, 64]
    rounds = args.rounds or (1 if args.quick else 3)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        urls, processes = (start_tracing_servers if args.tracing else start_servers)(workdir)
        try:
            if not args.tracing:
                wait_ready(urls["bare"], processes[1])
                asyncio.run(wait_grpc(urls["bare-grpc"], processes[2]))
            results = measure(urls, levels, rounds, args.quick)
        finally:
            for process in processes:
                process.terminate()
                process.wait(timeout=30)
    summary = tracing_report(results, levels) if args.tracing else overhead_report(results, levels, rounds)
    if args.json:
        print(json.dumps(summary))


if __name__ == "__main__":
    main()
