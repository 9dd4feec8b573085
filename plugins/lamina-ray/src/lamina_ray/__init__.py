"""Lamina replicas on a Ray cluster: ``[replicas] provider = "ray"``.

Each replica is a Ray actor (:class:`~lamina_ray.actor.WorkerActor`) that runs one ``lamina
worker`` on its node and gives the gateway the node's address. Ray places the actors by the
resources they reserve: ``num_cpus`` (1 by default), ``num_gpus`` (1 for a GPU executor: Ray
picks a node with a free GPU and sets ``CUDA_VISIBLE_DEVICES``) and custom ``resources``.
Core's pool decides the rest as for local workers: the autoscaler's scale-ups and drains, and
the relaunch of a replica whose actor died (actors get ``max_restarts=0``)::

    [replicas]
    count = 2
    provider = { use = "ray", address = "auto", num_gpus = 1 }

With no ``address`` the replicas run on this machine's Ray (started at the first launch and
shut down with the stack). Importing this module stays cheap: Ray loads when a stack builds
the provider. Registered through the ``lamina`` entry point ``ray``.
"""

from __future__ import annotations

from typing import Any

from lamina_hookspecs import hookimpl
from lamina_hookspecs.registration import BuildContext, Register


def _build(options: Any, context: BuildContext) -> Any:
    """Replicas as Ray actors, placed by Ray."""
    from lamina_ray.provider import RayProvider

    return RayProvider(options, context.stack_name)


@hookimpl
def lamina_register_replica_providers(register: Register) -> None:
    from lamina_ray.options import RayOptions

    register("ray", _build, options=RayOptions)
