"""A replica provider registered by a plugin places a stack's workers."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from lamina.kernel.plugins import load_plugins
from lamina.testing.contracts import ReplicaProviderContract
from lamina.pool.replicas import LocalProcesses
from lamina.kernel.stack import Stack
from lamina.pool import build_stack
from lamina.kernel.stack_config import StackConfig
from lamina_hookspecs import hookimpl
from lamina_hookspecs.errors import ConfigError
from lamina_hookspecs.registration import Register
from lamina_hookspecs.types import WorkerLaunch


class Counting(LocalProcesses):
    """Local processes, counting what it launched; a relaunch takes ``relaunch_s``, as a cluster's may."""

    launched: list[str] = []
    relaunch_s = 0.0

    def launch(self, worker: WorkerLaunch) -> Any:
        if worker.name in Counting.launched:
            time.sleep(Counting.relaunch_s)
        Counting.launched.append(worker.name)
        assert set(json.loads(worker.files[f"{worker.name}.json"])) <= {"stack", "executor", "prefix_cache", "batching"}
        assert worker.argv(python="py", files_dir="/d", host="h", port=7)[1:] == \
            ["-m", "lamina.cli", "worker", f"/d/{worker.name}.json", "--host", "h", "--port", "7"]
        return super().launch(worker)


class Plugin:
    @hookimpl
    def lamina_register_replica_providers(self, register: Register) -> None:
        register("counting", lambda options, context: Counting("127.0.0.1", 0))


def test_workers_are_launched_through_the_configured_provider() -> None:
    Counting.launched = []
    plugins = load_plugins(extra=(("counting", Plugin()),))
    config = StackConfig.from_dict({"executor": {"use": "echo"}, "replicas": {"count": 2, "provider": "counting"}},
                                   plugins.registry)
    stack = build_stack(config, plugins)

    async def run() -> list[str]:
        await stack.start()
        try:
            return sorted(stack.backends)
        finally:
            await stack.stop()

    assert asyncio.run(run()) == ["replica-0", "replica-1"]
    assert sorted(Counting.launched) == ["replica-0", "replica-1"]


def test_a_crashed_worker_is_relaunched_once_while_its_launch_takes_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Counting, "launched", [])
    monkeypatch.setattr(Counting, "relaunch_s", 1.5)  # three watch intervals
    plugins = load_plugins(extra=(("counting", Plugin()),))
    config = StackConfig.from_dict({"executor": {"use": "echo"},
                                    "replicas": {"count": 1, "provider": "counting", "restart_backoff_s": 0}},
                                   plugins.registry)
    stack = build_stack(config, plugins)

    async def run() -> int:
        await stack.start()
        try:
            worker, deadline = stack.pool.replicas.workers[0], time.monotonic() + 30
            crashed = worker.handle
            crashed.process.kill()
            while worker.handle is crashed or stack.backends["replica-0"] is not worker.executor:
                assert time.monotonic() < deadline, "not relaunched"
                await asyncio.sleep(0.05)
            await asyncio.sleep(1.0)
            return worker.restarts
        finally:
            await stack.stop()

    assert asyncio.run(run()) == 1
    assert Counting.launched == ["replica-0", "replica-0"]


def test_an_unknown_provider_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as info:
        StackConfig.from_dict({"executor": {"use": "echo"}, "replicas": {"count": 1, "provider": "kubernetes"}},
                              load_plugins().registry)
    assert info.value.path == "replicas.provider.use" and "no replica provider named 'kubernetes'" in str(info.value)


def test_the_kernel_alone_refuses_a_stack_whose_executor_runs_elsewhere() -> None:
    plugins = load_plugins()
    config = StackConfig.from_dict({"executor": {"use": "echo"}, "replicas": {"count": 1}}, plugins.registry)
    with pytest.raises(ConfigError, match="lamina.pool.build_stack") as raised:
        Stack(config, plugins)
    assert raised.value.path == "replicas"


class TestLocalProcesses(ReplicaProviderContract):
    def build(self) -> LocalProcesses:
        return LocalProcesses("127.0.0.1", 0)
