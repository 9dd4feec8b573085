"""The ray provider's options (no Ray import: the stack file is checked without it)."""

from __future__ import annotations

from typing import Any

import attrs


@attrs.frozen(kw_only=True)
class RayOptions:
    """The options of ``[replicas] provider = { use = "ray", ... }``."""

    address: str | None = attrs.field(default=None, metadata={
        "help": "cluster to join: 'auto' (the one `ray start` made here), 'host:port' or 'ray://host:port'; "
                "unset: Ray on this machine (this process's session, or a new local one)"})
    num_cpus: float = attrs.field(default=1.0, validator=attrs.validators.ge(0.0),
                                  metadata={"help": "CPUs each replica reserves"})
    num_gpus: float = attrs.field(default=0.0, validator=attrs.validators.ge(0.0), metadata={
        "help": "GPUs each replica reserves (1 for a GPU executor: Ray picks a node with one free)"})
    resources: dict[str, float] = attrs.field(factory=dict, metadata={
        "help": "custom Ray resources each replica reserves, e.g. { h100 = 1 }"})
    runtime_env: dict[str, Any] = attrs.field(factory=dict, metadata={
        "help": "Ray runtime_env of each replica (pip, env_vars, ...); with no address, replicas run this Python"})
    start_timeout_s: float = attrs.field(default=300.0, validator=attrs.validators.gt(0.0), metadata={
        "help": "how long a replica may wait to be placed (a cluster autoscaler may be adding a node)"})
