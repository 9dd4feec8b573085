"""A built stack: one object per layer (or per A/B arm), ready to serve.

``Stack(config, plugins)`` instantiates every component from a validated :class:`StackConfig` and
registers core's own implementations of ``lamina_admit`` and ``lamina_route`` (as
pytest registers its default plugins), so plugins can wrap or override those phases.
The hot path then calls the resolved objects directly.

A stack whose executor runs elsewhere (``[replicas]`` workers, ``[[backends]]``) gets its backends
from a :class:`BackendPool`, which :mod:`lamina.pool` builds (``lamina.pool.build_stack``): the kernel
defines what it needs from one and never imports it.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import attrs
import pluggy
import structlog

from lamina_hookspecs import hookimpl, layers
from lamina_hookspecs.errors import ConfigError, NoBackendError, NotFoundError
from lamina_hookspecs.protocols import Codec, Executor, ToolParser
from lamina_hookspecs.registration import BuildContext
from lamina_hookspecs.types import BackendState, Request, RequestContext, StackInfo
from lamina.kernel.ab import ArmPicker
from lamina.kernel.admission import Admission, Entry
from lamina.kernel.lifecycle import notify
from lamina.kernel.options import build_options
from lamina.kernel.plugins import PluginSet
from lamina.kernel.registry import Component
from lamina.kernel.stack_config import ComponentSpec, Split, StackConfig

CORE_PLUGIN_NAME = "lamina.core"
ROUTE_TREE_KEY = "lamina.route_tree"
"""Where the routing tree's decision lives in ``RequestContext.attributes``."""

log = structlog.get_logger(__name__)


@attrs.frozen(kw_only=True)
class PoolStatus:
    """A backend pool at one moment, for ``/metrics``."""

    serving: int
    starting: int
    draining: int
    target: int | None
    """Replicas the autoscaler last asked for (serving plus warm); None before its first decision."""
    cold_start_s: float | None
    """The latest replica's spawn-to-ready time."""
    actions: Counter[tuple[str, str]]
    """(action, reason) → times taken: spawn, drain, restart, degrade, restore."""


class BackendPool(Protocol):
    """Backends outside this process (worker replicas, remote servers) and the policy that steers
    requests among them while they change."""

    backends: dict[str, Executor]
    """Name → executor, live: the stack routes over this dict, and workers join it once ready."""

    def fallback(self, ctx: RequestContext, request: Request) -> Request:
        """The request, sent to another model while the pool is degraded (else unchanged)."""

    def split(self, ctx: RequestContext, candidates: dict[str, Executor]) -> dict[str, Executor]:
        """The candidates a request may go to while a canary takes its share."""

    def status(self) -> PoolStatus | None:
        """The replicas' state, or None for a pool without replicas."""

    async def start(self, pm: pluggy.PluginManager) -> None:
        """Start every backend; ``pm`` (the stack's plugin manager) lets the pool observe requests."""

    async def stop(self, pm: pluggy.PluginManager) -> None:
        """Stop every backend, draining replicas."""


PoolFactory = Callable[["Stack"], BackendPool]
"""Builds the pool of a stack with ``[replicas]`` or ``[[backends]]``, once its other layers are built."""


@attrs.define
class Arms:
    """The instances of one layer: a single one under the name ``""``, or one per A/B arm."""

    layer: str
    instances: dict[str, Any]
    picker: ArmPicker | None = None
    sticky_by: str = "tenant"

    def pick(self, ctx: RequestContext) -> tuple[str, Any]:
        """The arm name and instance for a request; records the arm on ``ctx.arms``."""
        if self.picker is None:
            return "", self.instances[""]
        request = ctx.request
        key = {"tenant": ctx.tenant, "request": ctx.request_id,
               "user": (request.user if request and request.user else ctx.tenant)}[self.sticky_by]
        arm = ctx.arms.setdefault(self.layer, self.picker.pick(key))
        return arm, self.instances[arm]


def instantiate(spec: ComponentSpec, context: BuildContext) -> Any:
    """Build one component from its validated spec; every failure is a ``ConfigError`` at its path."""
    component = spec.component
    try:
        instance = component.factory(spec.options, context)
    except ConfigError as exc:  # a factory names its own option; say where that option is
        if exc.path.startswith(spec.path):
            raise
        raise ConfigError(f"{spec.path}.{exc.path}" if exc.path else spec.path, exc.problem) from None
    except Exception as exc:
        raise ConfigError(spec.path, f"{component.layer.noun} '{component.name}' (plugin '{component.plugin}') "
                                     f"failed to build: {type(exc).__name__}: {exc}") from exc
    if not isinstance(instance, component.layer.protocol):
        raise ConfigError(spec.path, f"{component.layer.noun} '{component.name}' (plugin '{component.plugin}') "
                                     f"returned {type(instance).__name__}, which is not a "
                                     f"{component.layer.protocol.__name__}")
    return instance


def _default_options(component: Component) -> Any:
    try:
        return build_options(component.options, {}, "codec")
    except ConfigError:  # a codec with required options: the factory will say so
        return None


def _build_arms(layer: str, value: ComponentSpec | Split | None, stack_name: str, **deps: Any) -> Arms:
    if value is None:
        return Arms(layer, {})
    if isinstance(value, ComponentSpec):
        return Arms(layer, {"": instantiate(value, BuildContext(stack_name=stack_name, **deps))})
    instances = {arm.name: instantiate(arm.spec, BuildContext(stack_name=stack_name, arm=arm.name, **deps))
                 for arm in value.arms}
    picker = ArmPicker.from_weights(f"lamina.{layer}", [(arm.name, arm.weight) for arm in value.arms])
    return Arms(layer, instances, picker, value.sticky_by)


class Stack:
    """Everything one deployment runs, built from a stack file."""

    def __init__(self, config: StackConfig, plugins: PluginSet, pool: PoolFactory | None = None) -> None:
        self.config, self.plugins, self.pm = config, plugins, plugins.pm
        name = config.meta.name
        self.batching = _build_arms("batching", config.layers["batching"], name)
        self.prefix_cache = _build_arms("prefix_cache", config.layers["prefix_cache"], name)
        self.prewarm = _build_arms("prewarm", config.layers["prewarm"], name)
        if any(len(arms.instances) > 1 for arms in (self.batching, self.prefix_cache, self.prewarm)):
            raise ConfigError("ab", "splitting batching, prefix_cache or prewarm needs one executor per arm "
                                    "(not yet supported)")
        if config.remote and pool is None:
            raise ConfigError("replicas" if config.replicas.count else "backends",
                              "a stack whose executor runs in workers or remote servers is built with "
                              "lamina.pool.build_stack")
        if config.remote:  # the executor runs in workers or remote servers: the pool's backends
            self.executors = Arms("executor", {})
        else:
            self.executors = _build_arms(
                "executor", config.layers["executor"], name,
                batching=next(iter(self.batching.instances.values()), None),
                prefix_cache=next(iter(self.prefix_cache.instances.values()), None),
                prewarm=next(iter(self.prewarm.instances.values()), None),
            )
        self.routers = _build_arms("router", config.layers["router"], name)
        self.route_tree = None if config.route_tree is None else config.route_tree.map_routers(
            lambda leaf: instantiate(leaf.router, BuildContext(stack_name=name)))
        self.route_leaves = {leaf.name: leaf for leaf in self.route_tree.leaves()} if self.route_tree else {}
        self.codecs = _build_arms("codec", config.layers["codec"], name)
        self.autoscaler = _build_arms("autoscaler", config.layers["autoscaler"], name).instances[""]
        self.tool_parser: ToolParser | None = _build_arms("tool_parser", config.layers["tool_parser"],
                                                          name).instances.get("")
        self.pool: BackendPool | None = pool(self) if config.remote and pool is not None else None
        self.backends: dict[str, Executor] = self.pool.backends if self.pool is not None else {
            (arm or "local"): executor for arm, executor in self.executors.instances.items()
        }
        self.admission = self._build_admission(config.admission, name)
        self.observers = [(f"observer[{i}]:{spec.name}", instantiate(spec, BuildContext(stack_name=name)))
                          for i, spec in enumerate(config.observers)]
        self._core_hooks = _CoreHooks(self)
        self.started = False
        self._codecs_by_type: dict[str, Codec] | None = None

    def _build_admission(self, specs: Sequence[ComponentSpec | Split], name: str) -> Admission:
        entries, breakers = [], []
        for i, value in enumerate(specs):
            arms = _build_arms(f"admission[{i}]", value, name)
            first = value.arms[0].spec if isinstance(value, Split) else value
            kind = first.component.layer
            if kind is layers.BREAKER:
                breakers.append(arms.instances[""])
            else:
                entries.append(Entry(layer=kind, name=first.name if isinstance(value, ComponentSpec) else arms.layer,
                                     pick=lambda ctx, arms=arms: arms.pick(ctx)[1]))
        return Admission(entries, breakers, self._context_length)

    def _context_length(self) -> int:
        return min(executor.model.context_length for executor in self.backends.values())

    @property
    def info(self) -> StackInfo:
        def describe(value: ComponentSpec | Split | None) -> str:
            if value is None:
                return "none"
            if isinstance(value, ComponentSpec):
                return value.name
            return ",".join(f"{arm.name}={arm.spec.name}" for arm in value.arms)

        return StackInfo(name=self.config.meta.name,
                         components={key: describe(value) for key, value in self.config.layers.items()})

    def codec_for(self, media_type: str) -> Codec | None:
        """The codec that speaks ``media_type``: the stack's own (of any arm) first, else any
        installed codec, built once with its default options (clients negotiate with ``Accept``)."""
        if self._codecs_by_type is None:
            self._codecs_by_type = {}
            for component in self.plugins.registry:
                if component.layer is layers.CODEC:
                    spec = ComponentSpec(component=component, options=_default_options(component),
                                         path=f"codec ({component.name})")
                    try:
                        codec = instantiate(spec, BuildContext(stack_name=self.config.meta.name))
                    except ConfigError as exc:
                        log.warning("codec_unavailable", codec=component.name, error=str(exc))
                        continue
                    self._codecs_by_type.setdefault(codec.media_type, codec)
            for codec in self.codecs.instances.values():
                self._codecs_by_type[codec.media_type] = codec
        return self._codecs_by_type.get(media_type)

    def apply_route_tree(self, ctx: RequestContext, request: Request) -> Request:
        """Walk the routing tree (when the stack has one): record the leaf, path and features on
        ``ctx.attributes["lamina.route_tree"]`` and the request's log lines; return the request
        bound to the leaf's pool."""
        if self.route_tree is None:
            return request
        values, leaf, path = self.route_tree.decide(request)
        ctx.attributes[ROUTE_TREE_KEY] = {"leaf": leaf.name, "path": path, "features": attrs.asdict(values)}
        structlog.contextvars.bind_contextvars(route_leaf=leaf.name, route_features=attrs.asdict(values))
        return attrs.evolve(request, model=leaf.pool)

    def apply_fallback(self, ctx: RequestContext, request: Request) -> Request:
        """The request, sent to the pool's fallback model while its replicas heal (else unchanged)."""
        return request if self.pool is None else self.pool.fallback(ctx, request)

    def serving(self, model: str) -> list[Executor]:
        """The backends that serve ``model``; ``NotFoundError`` (404 ``model_not_found``) if none does."""
        serving = [executor for executor in self.backends.values() if executor.model.id == model]
        if not serving:
            served = sorted({executor.model.id for executor in self.backends.values()})
            raise NotFoundError(f"model {model!r} is not served here; available: {', '.join(served)}",
                                param="model", code="model_not_found")
        return serving

    def backend_states(self, request: Request, ctx: RequestContext) -> list[BackendState]:
        """Live state of the backends that may serve this request (its executor arm's, under a split),
        each marked ``circuit_open`` when a breaker holds it closed to new work."""
        if self.executors.picker is not None:
            arm, executor = self.executors.pick(ctx)
            candidates = {arm: executor}
        else:
            candidates = {name: e for name, e in self.backends.items() if e.model.id == request.model}
            if self.pool is not None:
                candidates = self.pool.split(ctx, candidates)
        now = time.monotonic()  # the breakers' clock: the pipeline reports started/finished on it too
        return [attrs.evolve(executor.state(), name=name,
                             circuit_open=self.admission.retry_after(name, now) is not None)
                for name, executor in candidates.items()]

    async def start(self) -> None:
        """Start every executor (or the pool), then tell observers the stack is up."""
        self.pm.register(self._core_hooks, name=CORE_PLUGIN_NAME)
        for plugin_name, observer in self.observers:
            self.pm.register(observer, name=plugin_name)
        if self.pool is not None:
            await self.pool.start(self.pm)
        else:
            await asyncio.gather(*(executor.start() for executor in self.backends.values()))
        self.started = True
        await notify(self.pm, "lamina_stack_started", stack=self.info)

    async def stop(self) -> None:
        """Tell observers, then stop every executor (or the pool)."""
        self.started = False
        await notify(self.pm, "lamina_stack_stopping", stack=self.info)
        if self.pool is not None:
            await self.pool.stop(self.pm)
        else:
            for executor in self.backends.values():
                await executor.stop()
        self.pm.unregister(self._core_hooks)
        for plugin_name, observer in self.observers:
            self.pm.unregister(observer)
            try:
                observer.close()
            except Exception:
                log.exception("observer_close_failed", observer=plugin_name)


class _CoreHooks:
    """Core's own implementations of the phase hooks; they run last so plugins can wrap or override."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack

    @hookimpl(trylast=True)
    def lamina_admit(self, ctx: RequestContext, body: Mapping[str, Any]) -> None:
        self.stack.admission.admit(ctx, body)

    @hookimpl(trylast=True)
    def lamina_route(self, ctx: RequestContext, request: Request, backends: Sequence[BackendState]
                     ) -> BackendState:
        if not backends:
            raise NoBackendError(f"no backend serves model {request.model!r}", code="no_backend")
        if all(b.circuit_open for b in backends):
            now = time.monotonic()
            waits = [self.stack.admission.retry_after(b.name, now) or 0.0 for b in backends]
            raise NoBackendError(f"every backend for model {request.model!r} has its circuit open",
                                 code="circuit_open", retry_after=min(waits))
        decided = ctx.attributes.get(ROUTE_TREE_KEY)
        if decided is not None:
            return self.stack.route_leaves[decided["leaf"]].router.choose(request, backends)
        _, router = self.stack.routers.pick(ctx)
        return router.choose(request, backends)
