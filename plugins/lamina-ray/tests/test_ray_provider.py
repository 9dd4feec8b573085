"""Replicas as Ray actors on a local cluster: scaled up and down by the autoscaler, and a
killed actor replaced by the pool."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest
import ray
from lamina.kernel.pipeline import run_request
from lamina.kernel.plugins import load_plugins
from lamina.pool.replicas import ReplicaSet
from lamina.kernel.stack import Stack
from lamina.pool import build_stack
from lamina.testing.contracts import ReplicaProviderContract
from lamina.kernel.stack_config import StackConfig
from lamina_hookspecs import hookimpl
from lamina_hookspecs.protocols import Executor
from lamina_hookspecs.registration import Register
from lamina_hookspecs.types import PoolSnapshot, Request, RequestContext, SamplingParams, ScaleDecision

# Ray starts its processes by fork+exec; when the whole suite runs, JAX is already loaded in
# this process and warns on every fork (harmless here: the child execs at once).
pytestmark = pytest.mark.filterwarnings("ignore:os.fork\\(\\) was called:RuntimeWarning")


class Scripted:
    """An autoscaler whose answer the test sets."""

    target = 1

    def decide(self, snapshot: PoolSnapshot) -> ScaleDecision:
        return ScaleDecision(replicas=Scripted.target, reason="scripted")


class ScriptedPlugin:
    @hookimpl
    def lamina_register_autoscalers(self, register: Register) -> None:
        register("scripted", lambda options, context: Scripted())


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    ray.init(num_cpus=3, include_dashboard=False)
    yield
    ray.shutdown()


def request(text: str) -> Request:
    return Request(id=text, model="echo", prompt=text, sampling=SamplingParams(max_tokens=4))


async def generate(executor: Executor, text: str) -> str:
    return "".join([chunk.text async for chunk in executor.generate(request(text))])


async def serve(stack: Stack, text: str) -> str:
    def parse(body: Mapping[str, Any]) -> Request:
        return request(body["prompt"])

    ctx = RequestContext(request_id=text, endpoint="completions")
    return "".join([chunk.text async for chunk in run_request(stack, ctx, {"prompt": text}, parse)])


async def until(condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


def actors() -> list[str]:
    return sorted(name for name in ray.util.list_named_actors() if name.startswith("lamina:ray-test:"))


async def scale_and_heal(stack: Stack) -> None:
    pool: ReplicaSet = stack.pool.replicas
    assert await serve(stack, "one replica") == "one replica"
    assert actors() == ["lamina:ray-test:replica-0:1"]

    Scripted.target = 2
    await until(lambda: len(pool.serving) == 2)
    both = {"replica-0": "lamina:ray-test:replica-0:1", "replica-1": "lamina:ray-test:replica-1:2"}
    assert actors() == sorted(both.values())
    assert [await generate(w.executor, f"via {w.name}") for w in pool.serving] == ["via replica-0", "via replica-1"]

    Scripted.target = 1
    await until(lambda: len(pool.workers) == 1)
    (survivor,) = pool.workers
    await until(lambda: len(actors()) == 1)
    assert actors() == [both[survivor.name]]

    handle = survivor.handle
    ray.kill(ray.get_actor(actors()[0]))
    await until(lambda: handle.exited() == -1, timeout_s=10)
    await until(lambda: survivor.handle is not handle and stack.backends.get(survivor.name) is survivor.executor)
    assert pool.actions["restart", "crash"] == 1
    assert actors() == [f"lamina:ray-test:{survivor.name}:3"]
    assert await serve(stack, "after a crash") == "after a crash"
    host, port = handle.address.rsplit(":", 1)
    with pytest.raises(OSError):  # the killed actor's worker went with it
        socket.create_connection((host, int(port)), timeout=1).close()


def test_ray_actors_scale_up_down_and_are_replaced_when_killed(cluster: None) -> None:
    Scripted.target = 1
    plugins = load_plugins(extra=(("scripted", ScriptedPlugin()),))
    config = StackConfig.from_dict({
        "stack": {"name": "ray-test"}, "executor": {"use": "echo"}, "autoscaler": {"use": "scripted"},
        "replicas": {"count": 1, "provider": "ray", "autoscale_interval_s": 0.2, "restart_backoff_s": 0.1,
                     "start_timeout_s": 60},
    }, plugins.registry)
    stack = build_stack(config, plugins)

    async def run() -> None:
        await stack.start()
        try:
            await scale_and_heal(stack)
        finally:
            await stack.stop()

    asyncio.run(run())
    assert actors() == [], "stopping the stack stops its actors"


@pytest.mark.usefixtures("cluster")
class TestRayProviderContract(ReplicaProviderContract):
    registered_name = "ray"
