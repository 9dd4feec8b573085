"""Cross-package: every example stack builds from the installed plugins and serves a request."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from lamina.kernel.pipeline import run_request
from lamina.kernel.plugins import load_plugins
from lamina.pool import build_stack
from lamina.kernel.stack_config import StackConfig
from lamina_hookspecs.types import Request, RequestContext, SamplingParams

STACKS = sorted((Path(__file__).resolve().parents[1] / "examples" / "stacks").glob("*.toml"))


@pytest.mark.parametrize("path", STACKS, ids=lambda p: p.name)
def test_example_stack_serves_a_request(path: Path) -> None:
    plugins = load_plugins()
    stack = build_stack(StackConfig.from_toml(path, plugins.registry), plugins)

    def parse(body: dict) -> Request:
        model = next(iter(stack.backends.values())).model.id  # known once started (workers report it)
        return Request(id="r", model=model, prompt=body["prompt"], sampling=SamplingParams(max_tokens=8))

    async def go() -> str:
        await stack.start()
        try:
            ctx = RequestContext(request_id="r", endpoint="completions", tenant="acme")
            return "".join([c.text async for c in run_request(stack, ctx, {"prompt": "hello lamina"}, parse)])
        finally:
            await stack.stop()

    assert asyncio.run(go()) == "hello lamina"
