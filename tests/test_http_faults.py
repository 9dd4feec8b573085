"""Faults: fuzzed bodies, clients that hang up mid-stream or stop reading, and draining on SIGTERM (server and worker)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lamina.tools.bench.servers import free_port
from lamina_jax.testing import write_tiny_gguf
from starlette.testclient import TestClient

from lamina.kernel.plugins import load_plugins
from lamina.server.http import Server
from lamina.wire.proto.lamina.v1 import inference_pb2 as pb
from lamina.wire.proto.lamina.v1 import inference_pb2_grpc as pb_grpc
from lamina.kernel.stack import Stack
from lamina.kernel.stack_config import StackConfig
from lamina.testing.abandon import leave_mid_answer, wait_until_idle

KEYS = ["model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k",
        "seed", "stop", "n", "stream", "stream_options", "logprobs", "top_logprobs", "user", "echo", "tools",
        "presence_penalty", "ignore_eos", "stop_token_ids", "logit_bias", "min_tokens", "repetition_penalty",
        "min_p", "response_format", "structured_outputs", "guided_json", "guided_choice", "surprise"]
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20) | st.integers(0, 300)
    | st.sampled_from(["echo", "user", "assistant", "wizard", ""]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["role", "content", "type", "text", "include_usage", "x"]), inner, max_size=4),
    max_leaves=12)
messages = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "wizard"]) | json_values,
                                           "content": st.text(max_size=30) | json_values}), max_size=3)
bodies = st.fixed_dictionaries(
    {"model": st.just("echo") | json_values},
    optional={**{key: json_values for key in KEYS[1:]}, "messages": messages | json_values,
              "prompt": st.text(max_size=40) | st.lists(st.integers(-5, 60_000), max_size=5) | json_values},
) | json_values


@pytest.fixture(scope="module")
def echo_client() -> Any:
    plugins = load_plugins()
    stack = Stack(StackConfig.from_dict({"executor": {"use": "echo", "context_length": 64}}, plugins.registry),
                  plugins)
    with TestClient(Server(stack).app()) as client:
        asyncio.run(stack.start())
        yield client


@pytest.mark.slow
@settings(max_examples=10_000, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=bodies, chat=st.booleans())
def test_fuzzed_bodies_never_get_a_5xx(echo_client: TestClient, body: Any, chat: bool) -> None:
    response = echo_client.post("/v1/chat/completions" if chat else "/v1/completions", json=body)
    assert response.status_code < 500, (body, response.text)
    if response.status_code >= 400:
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "tiny-llama.gguf", seed=1)


def test_200_streams_cut_off_mid_way_free_every_kv_block(live: Any, tiny_model: Path) -> None:
    server = live({"executor": {"use": "jax", "model": str(tiny_model), "max_model_len": 256, "kv_cache_mb": 1}})
    executor = server.stack.backends["local"]
    body = {"model": "tiny-llama", "prompt": "in the a b c", "max_tokens": 200, "ignore_eos": True,
            "temperature": 0, "stream": True}

    async def cut_one(client: httpx.AsyncClient) -> None:
        async with client.stream("POST", f"{server.url}/v1/completions", json=body) as response:
            assert response.status_code == 200
            async for _ in response.aiter_bytes():
                break  # hang up after the first bytes

    async def cut_all() -> int:
        async with httpx.AsyncClient(timeout=60) as client:
            busy = 0
            for _ in range(10):
                await asyncio.gather(*(cut_one(client) for _ in range(20)))
                busy = max(busy, executor.state().kv_blocks_used)
            return busy

    busy = asyncio.run(cut_all())
    wait_until_idle(executor, within_s=30)
    assert busy > 0, "streams were running when they were cut"
    assert executor.engine.scheduler.running == [] and not executor.engine.scheduler.waiting


    metrics = httpx.get(f"{server.url}/metrics").text
    assert 'lamina_request_aborts_total{reason="client_gone"}' in metrics


def test_non_streamed_requests_whose_clients_leave_are_aborted_within_a_second(live: Any, tiny_model: Path) -> None:
    """Two run at a time, so most of them wait in the queue when their clients leave."""
    server = live({"executor": {"use": "jax", "model": str(tiny_model), "max_model_len": 256, "max_batch": 2}})
    executor = server.stack.backends["local"]
    body = {"model": "tiny-llama", "prompt": "in the a b c", "max_tokens": 240, "ignore_eos": True, "temperature": 0}
    busy = leave_mid_answer(server.url, executor, body, clients=20)
    wait_until_idle(executor, within_s=1.0)
    assert busy > 0, "the requests were running when their clients left"
    assert executor.engine.scheduler.running == [] and not executor.engine.scheduler.waiting
    metrics = httpx.get(f"{server.url}/metrics").text
    assert 'lamina_request_aborts_total{reason="client_gone"} 20.0' in metrics


def test_a_client_that_stops_reading_is_aborted_past_the_stream_buffer_and_slows_no_one(live: Any) -> None:
    """A stream whose client reads nothing (a small receive window) is aborted once the server holds
    ``stream_buffer_bytes`` of it, counted as ``slow_client``, and ends with an error event saying so;
    a stream beside it is not held up."""
    server = live({"executor": {"use": "echo", "context_length": 400_000},
                   "server": {"stream_buffer_bytes": 64 * 1024}})
    executor = server.stack.backends["local"]
    body = orjson.dumps({"model": "echo", "prompt": "a b c", "max_tokens": 300_000, "ignore_eos": True,
                         "stream": True})
    port = int(server.url.rsplit(":", 1)[1])
    with socket.socket() as stalled:
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.connect(("127.0.0.1", port))
        stalled.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                        b"content-length: %d\r\n\r\n%s" % (len(body), body))
        deadline = time.monotonic() + 30
        while 'reason="slow_client"' not in (metrics := httpx.get(f"{server.url}/metrics").text):
            assert time.monotonic() < deadline, "the stalled stream was never aborted"
            time.sleep(0.05)
        assert 'lamina_request_aborts_total{reason="slow_client"} 1.0' in metrics
        started = time.monotonic()
        reply = httpx.post(f"{server.url}/v1/completions", json={"model": "echo", "prompt": "x y", "stream": True})
        assert reply.status_code == 200 and reply.content.endswith(b"data: [DONE]\n\n")
        assert time.monotonic() - started < 2.0
        while executor.state().outstanding_requests:
            assert time.monotonic() < deadline, executor.state()
            time.sleep(0.02)
        stalled.settimeout(10)
        tail = b""
        while b"slow_client" not in tail:  # once the client reads again, the stream ends with an error event
            data = stalled.recv(1 << 16)
            assert data, "the stream ended without saying why"
            tail = tail[-200:] + data


@contextlib.contextmanager
def slow_echo_server(tmp_path: Path, drain_timeout_s: float) -> Iterator[tuple[subprocess.Popen[bytes], str, Path]]:
    """``lamina serve`` of an echo stack at 0.2 s a token in a subprocess, ready: the process, its URL
    and its log file; killed at the end if it is still running."""
    stack = tmp_path / "slow-echo.toml"
    stack.write_text('[executor]\nuse = "echo"\ntoken_delay_s = 0.2\n[server]\n'
                     f'drain_timeout_s = {drain_timeout_s}\ngrpc_port = 0\n')
    port = free_port()
    log_path = tmp_path / "serve.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen([sys.executable, "-m", "lamina.cli", "serve", str(stack), "--port", str(port)],
                                   stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if httpx.get(f"{url}/ready").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline and process.poll() is None, "server did not start"
                time.sleep(0.1)
            yield process, url, log_path
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()


def test_sigterm_drains_in_flight_streams_then_exits_zero(tmp_path: Path) -> None:
    with slow_echo_server(tmp_path, drain_timeout_s=20) as (process, url, _):
        words = " ".join(f"w{i}" for i in range(10))  # 10 tokens x 0.2 s: about 2 s
        with httpx.stream("POST", f"{url}/v1/completions", timeout=30,
                          json={"model": "echo", "prompt": words, "max_tokens": 10, "stream": True}) as response:
            chunks = response.iter_bytes()
            first = next(chunks)
            process.send_signal(signal.SIGTERM)
            time.sleep(0.3)
            refused = httpx.post(f"{url}/v1/completions", json={"model": "echo", "prompt": "late"})
            rest = b"".join(chunks)
        assert b"w0" in first and rest.endswith(b"data: [DONE]\n\n") and b"w9" in rest, "the stream ran to its end"
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "draining"
        assert process.wait(timeout=30) == 0


def test_requests_outlasting_the_drain_are_answered_503_shutdown_in_one_log_line(tmp_path: Path) -> None:
    """drain_timeout_s 0.5 against requests of about 8 s: SIGTERM aborts them when it runs out, the
    stream ends with a ``shutdown`` error event, the non-streamed request gets 503 ``shutdown``, one
    ``drained`` line counts both, no traceback is logged, and the process exits 0."""
    words = " ".join(f"w{i}" for i in range(40))  # 40 tokens x 0.2 s: about 8 s
    body = {"model": "echo", "prompt": words, "max_tokens": 40}
    with slow_echo_server(tmp_path, drain_timeout_s=0.5) as (process, url, log_path):

        async def both() -> tuple[httpx.Response, bytes]:
            async with httpx.AsyncClient(timeout=30) as client:
                whole = asyncio.ensure_future(client.post(f"{url}/v1/completions", json=body))
                async with client.stream("POST", f"{url}/v1/completions", json={**body, "stream": True}) as stream:
                    chunks = stream.aiter_bytes()
                    first = await anext(chunks)
                    process.send_signal(signal.SIGTERM)
                    rest = b"".join([chunk async for chunk in chunks])
                return await whole, first + rest

        started = time.monotonic()
        whole, streamed = asyncio.run(both())
        assert time.monotonic() - started < 5, "the drain did not stop the requests at its timeout"
        assert whole.status_code == 503 and whole.json()["error"]["code"] == "shutdown"
        assert b"w0" in streamed and b'"code":"shutdown"' in streamed.replace(b" ", b"") and b"w39" not in streamed
        assert process.wait(timeout=30) == 0
    text = log_path.read_text()
    drained = [line for line in text.splitlines() if "drained" in line]
    assert len(drained) == 1 and "aborted=2" in drained[0].replace('"', "").replace(": ", "="), text[-3000:]
    assert "Traceback" not in text and "CancelledError" not in text, text


def test_a_worker_outlasted_by_its_requests_drains_them_in_one_log_line_and_exits_zero(tmp_path: Path) -> None:
    """``lamina worker`` on SIGTERM: a gRPC stream longer than ``drain_timeout_s`` is aborted when it runs
    out (the stream ends with ``finish_reason = "abort"``), one ``drained`` line counts it, no
    traceback is logged, and the process exits 0."""
    stack = tmp_path / "slow-echo.toml"
    stack.write_text('[executor]\nuse = "echo"\ntoken_delay_s = 0.2\n[server]\ndrain_timeout_s = 0.5\n')
    port = free_port()
    log_path = tmp_path / "worker.log"
    words = " ".join(f"w{i}" for i in range(40))  # 40 tokens x 0.2 s: about 8 s
    with log_path.open("wb") as log:
        process = subprocess.Popen([sys.executable, "-m", "lamina.cli", "worker", str(stack), "--port", str(port)],
                                   stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            async def stream() -> list[pb.GenerateChunk]:
                async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                    await asyncio.wait_for(channel.channel_ready(), 60)
                    call = pb_grpc.InferenceStub(channel).Generate(pb.GenerateRequest(model="echo", text=words))
                    chunks = [await call.read()]
                    process.send_signal(signal.SIGTERM)
                    while (chunk := await call.read()) is not grpc.aio.EOF:
                        chunks.append(chunk)
                    return chunks

            started = time.monotonic()
            chunks = asyncio.run(stream())
            assert time.monotonic() - started < 60 and process.wait(timeout=30) == 0
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert chunks[0].text.strip() == "w0" and chunks[-1].finish_reason == "abort" and len(chunks) < 40
    text = log_path.read_text()
    drained = [line for line in text.splitlines() if "drained" in line]
    assert len(drained) == 1 and "aborted=1" in drained[0].replace('"', "").replace(": ", "="), text[-3000:]
    assert "Traceback" not in text and "CancelledError" not in text, text
