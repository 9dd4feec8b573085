"""``openai-upstream`` against fakes of SGLang and TGI that answer what their servers answer outside
a completion: the model list, health, context length and load metrics. The executor must find
each engine's context length and report its load to the routers."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import pytest
from aiohttp import web

from lamina_upstream.executor import KV_SCALE, UpstreamExecutor
from lamina_upstream.options import UpstreamOptions
from lamina_upstream.upstream_load import load_from_metrics

SGLANG_METRICS = """# HELP sglang:num_running_reqs The number of running requests
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="meta-llama/Llama-3.1-8B-Instruct"} 162.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="meta-llama/Llama-3.1-8B-Instruct"} 2826.0
# HELP sglang:token_usage The token usage
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.28
"""
TGI_METRICS = """# TYPE tgi_batch_current_size gauge
tgi_batch_current_size 7
# TYPE tgi_queue_size gauge
tgi_queue_size 3
# TYPE tgi_request_count counter
tgi_request_count 120
"""

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
SGLANG: dict[str, object] = {  # SGLang's ModelCard names its owner and the context
    "/v1/models": {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "sglang",
                                              "max_model_len": 131072}]},
    "/health": "", "/metrics": SGLANG_METRICS}
TGI: dict[str, object] = {  # TGI's ModelInfo gives the model id as its owner; /info the token limits
    "/v1/models": {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": MODEL}]},
    "/info": {"model_id": MODEL, "max_input_tokens": 4095, "max_total_tokens": 4096},
    "/health": "", "/metrics": TGI_METRICS}


async def _serve(routes: Mapping[str, object]) -> tuple[web.AppRunner, str]:
    async def answer(request: web.Request) -> web.Response:
        body = routes[request.path]
        return web.Response(text=body) if isinstance(body, str) else web.json_response(body)

    app = web.Application()
    for path in routes:
        app.router.add_get(path, answer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


def test_sglang_and_tgi_metrics_give_running_waiting_and_kv_usage() -> None:
    """The names in SGLang's production-metrics reference and TGI's router gauges."""
    sglang = load_from_metrics(SGLANG_METRICS, "sglang")
    assert (sglang.running, sglang.waiting, sglang.kv_usage) == (162, 2826, 0.28)
    tgi = load_from_metrics(TGI_METRICS, "tgi")
    assert (tgi.running, tgi.waiting, tgi.kv_usage) == (7, 3, None)


@pytest.mark.parametrize(("routes", "engine", "context", "running", "waiting", "kv_used"), [
    (SGLANG, "auto", 131072, 162, 2826, round(0.28 * KV_SCALE)),
    (TGI, "tgi", 4096, 7, 3, 0),
])
def test_context_length_and_load_come_from_each_engines_own_endpoints(
        routes: Mapping[str, object], engine: str, context: int, running: int, waiting: int, kv_used: int) -> None:
    async def run() -> None:
        runner, url = await _serve(routes)
        executor = UpstreamExecutor(UpstreamOptions(url=url, engine=engine, poll_interval_s=0.05, start_timeout_s=10))
        try:
            await executor.start()
            state = executor.state()
            assert executor.model.context_length == context and state.healthy
            assert state.outstanding_requests == running + waiting and state.queue_depth == waiting
            assert state.kv_blocks_used == kv_used
        finally:
            await executor.stop()
            await runner.cleanup()

    asyncio.run(run())
