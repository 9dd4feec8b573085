"""Lamina autoscalers (layer 5). Registered through the ``lamina`` entry point ``autoscale``.

* ``static``: a fixed number of replicas.
* ``target``: holds one load metric near a target, Kubernetes HPA's rule with a tolerance band
  and per-direction stabilisation windows.
* ``predictive``: sizes for the arrival rate now and warms replicas one cold start (P90 + 2σ of
  measured cold starts) ahead of the rate's trend.

``lamina autoscale replay`` runs any of them against an arrival trace on a simulated pool.
"""

from __future__ import annotations

from lamina_hookspecs import hookimpl
from lamina_hookspecs.registration import Register
from lamina_autoscale.adaptive_batching import AdaptiveOptions, build_adaptive
from lamina_autoscale.batching import FixedOptions, build_fixed
from lamina_autoscale.predictive import PredictiveOptions, build_predictive
from lamina_autoscale.static import StaticOptions, build_static
from lamina_autoscale.target import TargetOptions, build_target


@hookimpl
def lamina_register_autoscalers(register: Register) -> None:
    register("static", build_static, options=StaticOptions)
    register("target", build_target, options=TargetOptions)
    register("predictive", build_predictive, options=PredictiveOptions)


@hookimpl
def lamina_register_batching_policies(register: Register) -> None:
    register("fixed", build_fixed, options=FixedOptions)
    register("adaptive", build_adaptive, options=AdaptiveOptions)
