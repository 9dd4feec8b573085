"""Cross-package: every example stack builds from the installed plugins and serves a request."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from lamina.cli import main
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


@pytest.mark.parametrize("path", STACKS, ids=lambda p: p.name)
def test_lamina_check_accepts_the_example_stack(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["check", str(path), "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert json.loads(captured.out)["source"] == str(path)
