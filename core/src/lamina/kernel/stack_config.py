"""Stack files: TOML (stdlib ``tomllib``) into validated attrs config objects.

Every layer section names its implementation with ``use = "..."`` plus that
implementation's options; ``[ab.<layer>]`` splits a layer between weighted arms. All
validation happens here, against the installed plugins' registrations, so ``lamina
check`` catches every mistake without building anything; every error names its dotted
path and, where it can, the closest valid choice.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import attrs

from lamina_hookspecs import layers
from lamina_hookspecs.errors import ConfigError
from lamina_hookspecs.layers import Layer
from lamina.kernel.options import build_options, check_keys
from lamina.kernel.pool_tables import CANARY_TABLES, CanaryConfig, ReplicasConfig
from lamina.kernel.registry import Component, ComponentRegistry
from lamina.kernel.route_tree import RouteTree, parse_tree
from lamina.kernel.slo import SloConfig

DEFAULTS: dict[str, str] = {
    "router": "round-robin",
    "codec": "openai-sse",
    "executor": "jax",
    "autoscaler": "static",
}
"""The implementation a required layer gets when the stack file has no section for it."""
INSTALLED_DEFAULTS: dict[str, str] = {"tool_parser": "hermes"}
"""The implementation an optional layer gets when the stack file has no section for it and that
implementation is installed."""

SPLITTABLE: tuple[Layer, ...] = (layers.ROUTER, layers.CODEC, layers.EXECUTOR, layers.PREFIX_CACHE, layers.BATCHING,
                                 layers.PREWARM)
SINGLE: tuple[Layer, ...] = (layers.AUTOSCALER, layers.TOOL_PARSER)
STICKY_KEYS = ("tenant", "user", "request")
SECTIONS = ("stack", "server", "replicas", "canary", "backends", "route_tree", "admission", "observers", "slo", "ab",
            *(layer.key for layer in SPLITTABLE + SINGLE))


@attrs.frozen(kw_only=True)
class ComponentSpec:
    """One selected implementation with its validated options."""

    component: Component
    options: Any
    path: str

    @property
    def name(self) -> str:
        return self.component.name


@attrs.frozen(kw_only=True)
class Arm:
    """One arm of an A/B split."""

    name: str
    weight: float
    spec: ComponentSpec


@attrs.frozen(kw_only=True)
class Split:
    """A layer split between arms; requests are assigned by hashing ``sticky_by``."""

    arms: tuple[Arm, ...]
    sticky_by: Literal["tenant", "user", "request"]


@attrs.frozen(kw_only=True)
class ServerConfig:
    """Where ``lamina serve`` listens; the command line overrides these."""

    host: str = attrs.field(default="127.0.0.1", metadata={"help": "address to bind"})
    port: int = attrs.field(
        default=8000,
        validator=[attrs.validators.ge(0), attrs.validators.le(65535)],
        metadata={"help": "HTTP port (0 picks a free one)"},
    )
    grpc: bool = attrs.field(default=True, metadata={"help": "also serve the gRPC API (lamina.v1.Inference)"})
    grpc_port: int = attrs.field(
        default=50051,
        validator=[attrs.validators.ge(0), attrs.validators.le(65535)],
        metadata={"help": "gRPC port (0 picks a free one)"},
    )
    drain_timeout_s: float = attrs.field(
        default=30.0, validator=attrs.validators.ge(0.0),
        metadata={"help": "on SIGTERM, how long in-flight requests may run before the server exits"},
    )
    max_body_bytes: int = attrs.field(
        default=1 << 20, validator=attrs.validators.ge(1024), metadata={"help": "largest request body accepted"},
    )
    stream_buffer_bytes: int = attrs.field(
        default=1 << 20, validator=attrs.validators.ge(1024), metadata={
            "help": "most encoded bytes a stream may hold for a client that reads slower than tokens come; "
                    "past it the stream is aborted (counted as slow_client)"},
    )
    strict_fields: bool = attrs.field(default=False, metadata={
        "help": "refuse request fields Lamina does not know with a 400, as OpenAI does; by default they are "
                "ignored, named in one warning log line per request and in the x-lamina-ignored-fields header"})
    compute_nice: int = attrs.field(
        default=10, validator=[attrs.validators.ge(0), attrs.validators.le(19)], metadata={
            "help": "once the model is loaded, how much lower the CPU priority of the process's other threads "
                    "(the engine, XLA's compute pool) is than the event loop's, so that answers and refusals "
                    "do not wait for a core (Linux; 0: the same)"})


@attrs.frozen(kw_only=True)
class RemoteBackend:
    """One ``[[backends]]`` entry: a Lamina server (``lamina worker`` or ``lamina serve``) at a gRPC
    ``address``, or an ``executor`` table built in this process for it (an ``openai-upstream``
    in front of llama-server or vLLM, say); exactly one of the two."""

    name: str = attrs.field(validator=attrs.validators.min_len(1), metadata={"help": "the backend's name"})
    address: str = attrs.field(default="", metadata={"help": "its gRPC address, host:port"})
    executor: ComponentSpec | None = attrs.field(default=None, metadata={
        "help": "instead of an address: the executor serving this backend, as an [executor] table "
                "(use = ..., options)"})


@attrs.frozen(kw_only=True)
class StackMeta:
    """The ``[stack]`` table."""

    name: str = "default"
    description: str = ""


@attrs.frozen(kw_only=True)
class StackConfig:
    """A validated stack file.

    ``layers`` maps each layer key to a :class:`ComponentSpec`, a :class:`Split`, or
    ``None`` for an optional layer the stack leaves out (prefix cache, batching, pre-warm, a tool
    parser when none is installed).
    ``observers`` are the ``[[observers]]`` lifecycle plugins switched on, ``slo`` the
    objectives whose burn rates ``/metrics`` exports. With ``replicas.count`` workers or
    ``[[backends]]`` the executor runs elsewhere and the gateway routes across them. ``raw``
    is the table as read, for the workers' own stack.
    """

    meta: StackMeta
    server: ServerConfig
    layers: dict[str, ComponentSpec | Split | None]
    admission: tuple[ComponentSpec | Split, ...]
    observers: tuple[ComponentSpec, ...] = ()
    slo: SloConfig = SloConfig()
    replicas: ReplicasConfig = ReplicasConfig()
    replica_provider: ComponentSpec | None = None
    canary: CanaryConfig | None = None
    backends: tuple[RemoteBackend, ...] = ()
    route_tree: RouteTree | None = None
    raw: Mapping[str, Any] = attrs.field(factory=dict, repr=False, eq=False)
    source: Path | None = None

    @property
    def remote(self) -> bool:
        """Whether the executor runs in worker processes or remote servers rather than here."""
        return self.replicas.count > 0 or bool(self.backends)

    @classmethod
    def from_toml(cls, path: str | Path, registry: ComponentRegistry) -> StackConfig:
        """Read and validate a stack file (TOML; a ``.json`` file holds the same tables)."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
            data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
        except OSError as exc:
            raise ConfigError("", f"cannot read stack file {path}: {exc.strerror}") from None
        except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
            raise ConfigError("", f"{path} is not valid {path.suffix.lstrip('.').upper() or 'TOML'}: {exc}") from None
        return cls.from_dict(data, registry, source=path)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], registry: ComponentRegistry, *, source: Path | None = None
                  ) -> StackConfig:
        """Validate an already-parsed stack table."""
        check_keys(data, SECTIONS, "", what="section")
        ab = _table(data.get("ab", {}), "ab")
        check_keys(ab, (layer.key for layer in SPLITTABLE), "ab", what="splittable layer")
        resolved: dict[str, ComponentSpec | Split | None] = {}
        replicas_table = _table(data.get("replicas", {}), "replicas")
        # a pool of [[backends]] alone runs no executor of its own: it needs no default one installed
        pool_only = bool(data.get("backends")) and not replicas_table.get("count")
        for layer in SPLITTABLE + SINGLE:
            if layer.key in ab:
                if layer.key in data:
                    raise ConfigError(
                        f"ab.{layer.key}",
                        f"[{layer.key}] and [ab.{layer.key}] are both given; put every implementation in an arm",
                    )
                resolved[layer.key] = _split((layer,), _table(ab[layer.key], f"ab.{layer.key}"), f"ab.{layer.key}",
                                             registry)
            elif layer.key in data:
                resolved[layer.key] = component_spec((layer,), _table(data[layer.key], layer.key), layer.key, registry)
            elif layer.key in DEFAULTS and not (layer is layers.EXECUTOR and pool_only):
                resolved[layer.key] = component_spec((layer,), {"use": DEFAULTS[layer.key]}, layer.key, registry)
            elif INSTALLED_DEFAULTS.get(layer.key) in registry.names(layer):
                resolved[layer.key] = component_spec((layer,), {"use": INSTALLED_DEFAULTS[layer.key]}, layer.key,
                                                     registry)
            else:
                resolved[layer.key] = None
        admission, observers = _array(data, "admission"), _array(data, "observers")
        provider = replicas_table.get("provider")
        replicas = build_options(ReplicasConfig, {k: v for k, v in replicas_table.items() if k != "provider"},
                                 "replicas")
        backends = tuple(_backend(_table(item, f"backends[{i}]"), f"backends[{i}]", registry)
                         for i, item in enumerate(_array(data, "backends")))
        if (replicas.count or backends) and isinstance(resolved["executor"], Split):
            raise ConfigError("ab.executor", "an executor split needs the executors in this process; "
                                             "with [replicas] or [[backends]], split the router instead")
        if replicas.fallback_model is not None and (replicas.heal_error_rate is None or not backends):
            raise ConfigError("replicas.fallback_model", "a fallback pool is used while unhealthy replicas heal: "
                                                         "it needs heal_error_rate and [[backends]] serving that model")
        canary = None if "canary" not in data else _canary(_table(data["canary"], "canary"), replicas, registry)
        names = [f"replica-{i}" for i in range(replicas.count)] + [b.name for b in backends]
        if len(set(names)) < len(names):
            raise ConfigError("backends", f"backend names must be unique; got {', '.join(names)}")
        return cls(
            meta=build_options(StackMeta, _table(data.get("stack", {}), "stack"), "stack"),
            server=build_options(ServerConfig, _table(data.get("server", {}), "server"), "server"),
            layers=resolved,
            admission=tuple(
                _admission_entry(_table(item, f"admission[{i}]"), f"admission[{i}]", registry)
                for i, item in enumerate(admission)
            ),
            observers=tuple(
                component_spec((layers.OBSERVER,), _table(item, f"observers[{i}]"), f"observers[{i}]", registry)
                for i, item in enumerate(observers)
            ),
            slo=build_options(SloConfig, _table(data.get("slo", {}), "slo"), "slo"),
            replicas=replicas,
            canary=canary,
            replica_provider=None if provider is None else component_spec(
                (layers.REPLICA_PROVIDER,), {"use": provider} if isinstance(provider, str)
                else _table(provider, "replicas.provider"), "replicas.provider", registry),
            backends=backends,
            route_tree=None if "route_tree" not in data else parse_tree(
                _table(data["route_tree"], "route_tree"), "route_tree",
                lambda value, path: component_spec((layers.ROUTER,), {"use": value} if isinstance(value, str)
                                          else _table(value, path), path, registry)),
            raw=data,
            source=source,
        )

    def describe(self) -> dict[str, Any]:
        """A plain-data view of the resolved stack, for ``lamina check``."""
        def spec(s: ComponentSpec) -> dict[str, Any]:
            options = attrs.asdict(s.options) if s.options is not None else {}
            return {"use": s.name, "plugin": s.component.plugin, "options": options}

        def entry(value: ComponentSpec | Split | None) -> Any:
            if value is None or isinstance(value, ComponentSpec):
                return value and spec(value)
            return {
                "sticky_by": value.sticky_by,
                "arms": [{"name": a.name, "weight": a.weight, **spec(a.spec)} for a in value.arms],
            }

        return {
            "stack": attrs.asdict(self.meta),
            "server": attrs.asdict(self.server),
            **{key: entry(value) for key, value in self.layers.items()},
            "admission": [entry(s) for s in self.admission],
            "observers": [spec(s) for s in self.observers],
            "slo": attrs.asdict(self.slo),
            "replicas": attrs.asdict(self.replicas),
            "backends": [{"name": b.name, **({"executor": spec(b.executor)} if b.executor else {"address": b.address})}
                         for b in self.backends],
            "route_tree": None if self.route_tree is None else {
                leaf.name: {"pool": leaf.pool, **spec(leaf.router)} for leaf in self.route_tree.leaves()},
            "source": str(self.source) if self.source else None,
        }


def _backend(table: Mapping[str, Any], path: str, registry: ComponentRegistry) -> RemoteBackend:
    """One ``[[backends]]`` entry; its ``executor`` table is checked like an ``[executor]`` section."""
    backend = build_options(RemoteBackend, {k: v for k, v in table.items() if k != "executor"}, path)
    if "executor" in table:
        if backend.address:
            raise ConfigError(path, "give a backend an address or an executor, not both")
        executor = component_spec((layers.EXECUTOR,), _table(table["executor"], f"{path}.executor"),
                                  f"{path}.executor", registry)
        return attrs.evolve(backend, executor=executor)
    if not backend.address:
        raise ConfigError(f"{path}.address", "missing: a backend needs an address (gRPC host:port) or an executor")
    return backend


def _table(value: Any, path: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(path, f"must be a table; got {type(value).__name__}")
    return value


def _canary(table: Mapping[str, Any], replicas: ReplicasConfig, registry: ComponentRegistry) -> CanaryConfig:
    """``[canary]``: its component tables, validated as the stack's own would be, and its rules."""
    if not replicas.count:
        raise ConfigError("canary", "a canary is one more worker replica: it needs [replicas] count >= 1")
    kinds = {"executor": layers.EXECUTOR, "prefix_cache": layers.PREFIX_CACHE, "batching": layers.BATCHING,
             "prewarm": layers.PREWARM}
    check_keys(table, [*CANARY_TABLES, *(f.name for f in attrs.fields(CanaryConfig) if f.name != "tables")],
               "canary", what="key")
    tables = {key: table[key] for key in CANARY_TABLES if key in table}
    if not tables:
        raise ConfigError("canary", f"give the configuration to try: one or more of {', '.join(CANARY_TABLES)}")
    for key, value in tables.items():
        component_spec((kinds[key],), _table(value, f"canary.{key}"), f"canary.{key}", registry)
    rules = {k: v for k, v in table.items() if k not in CANARY_TABLES}
    return attrs.evolve(build_options(CanaryConfig, rules, "canary"), tables=tables)


def _array(data: Mapping[str, Any], key: str) -> list[Any]:
    value = data.get(key, [])
    if not isinstance(value, list):
        raise ConfigError(key, f"must be an array of tables ([[{key}]])")
    return value


def component_spec(kinds: tuple[Layer, ...], table: Mapping[str, Any], path: str, registry: ComponentRegistry
                   ) -> ComponentSpec:
    """A ``use = ...`` table (with that implementation's options) of one of ``kinds``, validated."""
    if "use" not in table:
        raise ConfigError(f"{path}.use", "missing: name the implementation, e.g. use = \"...\"")
    use = table["use"]
    if not isinstance(use, str):
        raise ConfigError(f"{path}.use", f"must be a string; got {use!r}")
    component = registry.get(kinds, use, f"{path}.use")
    options = {k: v for k, v in table.items() if k != "use"}
    return ComponentSpec(component=component, options=build_options(component.options, options, path), path=path)


def _admission_entry(table: Mapping[str, Any], path: str, registry: ComponentRegistry) -> ComponentSpec | Split:
    """One ``[[admission]]`` table: ``use = ...`` with options, or ``arms = [...]`` (same kind in every arm)."""
    if "arms" not in table:
        return component_spec(layers.ADMISSION, table, path, registry)
    split = _split(layers.ADMISSION, table, path, registry)
    kinds = {arm.spec.component.layer for arm in split.arms}
    if len(kinds) > 1:
        raise ConfigError(f"{path}.arms", "every arm must be the same kind of component; got "
                                          + ", ".join(sorted(kind.noun for kind in kinds)))
    if kinds == {layers.BREAKER}:
        raise ConfigError(f"{path}.arms", "a breaker watches backends, not requests: it cannot be split into arms")
    return split


def _split(kinds: tuple[Layer, ...], table: Mapping[str, Any], path: str, registry: ComponentRegistry) -> Split:
    check_keys(table, ("arms", "sticky_by"), path, what="key")
    sticky_by = table.get("sticky_by", "tenant")
    if sticky_by not in STICKY_KEYS:
        raise ConfigError(f"{path}.sticky_by", f"must be one of {', '.join(STICKY_KEYS)}; got {sticky_by!r}")
    raw_arms = table.get("arms")
    if not isinstance(raw_arms, list) or len(raw_arms) < 2:
        raise ConfigError(f"{path}.arms", "must list at least two arms: { name = ..., use = ..., weight = ... }")
    arms, seen = [], set()
    for i, raw in enumerate(raw_arms):
        arm_path = f"{path}.arms[{i}]"
        raw = _table(raw, arm_path)
        name, weight = raw.get("name"), raw.get("weight", 1)
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{arm_path}.name", "missing: every arm needs a name")
        if name in seen:
            raise ConfigError(f"{arm_path}.name", f"arm name {name!r} is used twice")
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or weight <= 0:
            raise ConfigError(f"{arm_path}.weight", f"must be a positive number; got {weight!r}")
        seen.add(name)
        rest = {k: v for k, v in raw.items() if k not in ("name", "weight")}
        arms.append(Arm(name=name, weight=float(weight), spec=component_spec(kinds, rest, arm_path, registry)))
    return Split(arms=tuple(arms), sticky_by=sticky_by)
