"""Canary rollout of a new replica configuration, decided by rule.

::

    [canary]
    executor = { use = "jax", kv_dtype = "int8" }   # the tables that differ from the stable replicas'
    share = 0.05                     # of requests, by a hash of the request id
    min_requests = 200               # canary requests before judging
    evaluate_after_s = 300
    max_error_rate_increase = 0.01   # canary 5xx share - stable's
    max_ttft_p95_ratio = 1.2         # canary TTFT p95 / stable's

One extra replica (``canary-0``) runs the stable workers' stack with the ``[canary]`` tables
(``executor``, ``prefix_cache``, ``batching``, ``prewarm``) in their place, and gets ``share`` of the
requests (their ``canary`` arm is ``"canary"``, the others' ``"stable"``, so every metric and
log line compares them). Once it has served ``min_requests`` and ``evaluate_after_s`` passed,
its 5xx share and TTFT p95 (after its first ``warmup_requests``) are compared with the stable replicas' over the same time: within
both limits it is **promoted** (the stable replicas restart one at a time with its
configuration, then it retires), otherwise **rolled back** (it retires). Either way the
decision is logged with the figures and counted in ``lamina_replica_actions_total``.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from lamina_hookspecs.stats import percentile
from lamina.kernel.pool_tables import CanaryConfig

@attrs.frozen(kw_only=True)
class Verdict:
    promote: bool
    reason: str


def judge(config: CanaryConfig, canary: Sequence[tuple[bool, float | None]],
          stable: Sequence[tuple[bool, float | None]]) -> Verdict | None:
    """Compare outcomes ``(server_error, ttft_s)`` of the canary and of the stable replicas over
    the same period; ``None`` while the canary has too few requests."""
    canary = canary[config.warmup_requests:]
    if len(canary) < config.min_requests or not stable:
        return None
    errors = sum(e for e, _ in canary) / len(canary) - sum(e for e, _ in stable) / len(stable)
    canary_p95 = percentile([t for _, t in canary if t is not None], 95)
    stable_p95 = percentile([t for _, t in stable if t is not None], 95)
    ratio = canary_p95 / stable_p95 if canary_p95 is not None and stable_p95 else 1.0
    figures = (f"5xx share {errors:+.2%} vs stable (limit +{config.max_error_rate_increase:.2%}), "
               f"TTFT p95 x{ratio:.2f} (limit x{config.max_ttft_p95_ratio:g}) over {len(canary)} requests")
    if errors > config.max_error_rate_increase or ratio > config.max_ttft_p95_ratio:
        return Verdict(promote=False, reason=f"rolled back: {figures}")
    return Verdict(promote=True, reason=f"promoted: {figures}")
