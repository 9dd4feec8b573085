"""The backend pool of a stack whose executor runs elsewhere: the kernel's :class:`BackendPool`.

Its backends are one executor per ``[[backends]]`` entry (a :class:`RemoteExecutor` for an
address, else the entry's own executor) plus the ``[replicas]`` workers, which join once ready.
While a canary serves, its share of requests (by request id) go to it alone, the rest to the
stable replicas (all to it while no stable one is up, as during a promotion's restarts); the
``canary`` arm records which. While the pool is degraded (see :mod:`lamina.pool.controller`), its
requests go to the fallback model (all of them while no replica serves, else all but the probe
share); the ``fallback`` arm records which.
"""

from __future__ import annotations

import asyncio

import attrs
import pluggy

from lamina_hookspecs.errors import ConfigError
from lamina_hookspecs.protocols import Executor
from lamina_hookspecs.registration import BuildContext
from lamina_hookspecs.types import Request, RequestContext
from lamina.kernel.ab import ArmPicker
from lamina.kernel.stack import PoolStatus, Stack, instantiate
from lamina.pool.controller import PoolController
from lamina.pool.remote import RemoteExecutor
from lamina.pool.replicas import ReplicaSet

TRAFFIC_PLUGIN_NAME = "lamina.pool-traffic"


class Pool:
    """Remote backends and worker replicas, with the controller that scales, heals and judges them."""

    def __init__(self, stack: Stack) -> None:
        config = stack.config
        context = BuildContext(stack_name=config.meta.name)
        self.config = config
        self.backends: dict[str, Executor] = {
            b.name: RemoteExecutor(b.name, b.address) if b.executor is None else instantiate(b.executor, context)
            for b in config.backends}
        self.replicas: ReplicaSet | None = None
        self.controller: PoolController | None = None
        if config.replicas.count:
            provider = None if config.replica_provider is None else instantiate(config.replica_provider, context)
            self.replicas = ReplicaSet(config.replicas, config.raw, self.backends, provider=provider,
                                       drain_timeout_s=config.server.drain_timeout_s)
            self.controller = PoolController(self.replicas, stack.autoscaler, config.replicas, config.canary)
        canary = config.canary.share if config.canary else 0.0
        probe = config.replicas.fallback_probe_share
        self._canary_picker = ArmPicker.from_weights("lamina.canary", [("canary", canary), ("stable", 1 - canary)])
        self._fallback_picker = ArmPicker.from_weights("lamina.fallback", [("pool", probe), ("fallback", 1 - probe)])

    def fallback(self, ctx: RequestContext, request: Request) -> Request:
        controller, replicas = self.controller, self.replicas
        if (controller is None or controller.degraded_at is None or replicas is None
                or request.model != replicas.model):
            return request
        arm = ctx.arms.setdefault("fallback", self._fallback_picker.pick(ctx.request_id)
                                  if replicas.serving else "fallback")
        fallback = self.config.replicas.fallback_model
        return request if arm == "pool" or fallback is None else attrs.evolve(request, model=fallback)

    def split(self, ctx: RequestContext, candidates: dict[str, Executor]) -> dict[str, Executor]:
        canary = self.replicas.canary if self.replicas is not None else None
        if canary is None or not canary.ready or canary.draining or canary.name not in candidates:
            return candidates
        stable = {name: e for name, e in candidates.items() if name != canary.name}
        arm = ctx.arms.setdefault("canary", self._canary_picker.pick(ctx.request_id) if stable else "canary")
        return {canary.name: candidates[canary.name]} if arm == "canary" else stable

    def status(self) -> PoolStatus | None:
        replicas, controller = self.replicas, self.controller
        if replicas is None or controller is None:
            return None
        return PoolStatus(
            serving=len(replicas.serving), starting=len(replicas.starting),
            draining=sum(w.draining and not w.restarting for w in replicas.workers),  # restarting: "starting"
            target=None if controller.last is None else controller.last.target,
            cold_start_s=replicas.cold_starts_s[-1] if replicas.cold_starts_s else None,
            actions=replicas.actions.copy())

    async def start(self, pm: pluggy.PluginManager) -> None:
        await asyncio.gather(*(executor.start() for executor in self.backends.values()),
                             *([self.replicas.start()] if self.replicas is not None else []))
        fallback = self.config.replicas.fallback_model
        served = sorted({executor.model.id for executor in self.backends.values()})
        if fallback is not None and fallback not in served:
            raise ConfigError("replicas.fallback_model", f"no backend serves {fallback!r}; served: {', '.join(served)}")
        if self.controller is not None:
            pm.register(self.controller.traffic, name=TRAFFIC_PLUGIN_NAME)
            self.controller.start()

    async def stop(self, pm: pluggy.PluginManager) -> None:
        if self.controller is not None:
            await self.controller.stop()
            if pm.is_registered(self.controller.traffic):  # not when start failed
                pm.unregister(self.controller.traffic)
        if self.replicas is not None:
            await self.replicas.stop()
        for executor in self.backends.values():
            await executor.stop()
