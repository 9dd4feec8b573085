"""The worker pool: backends outside the gateway's process, and the policy that runs them.

``remote`` (the gRPC client executor), ``replicas`` (worker processes, started, watched,
restarted, scaled and drained), ``controller`` (the autoscaler's loop, self-healing and the
fallback pool), ``canary`` (the rule that promotes or rolls back a canary) and ``backends`` (the
kernel's ``BackendPool`` built from them). It imports the kernel and ``lamina.wire``; the kernel
never imports it: :func:`build_stack` hands the kernel's ``Stack`` the pool to use.
"""

from __future__ import annotations

from lamina.kernel.plugins import PluginSet
from lamina.kernel.stack import Stack
from lamina.kernel.stack_config import StackConfig
from lamina.pool.backends import Pool


def build_stack(config: StackConfig, plugins: PluginSet) -> Stack:
    """The stack of any stack file: one whose executor runs in workers or remote servers gets a :class:`Pool`."""
    return Stack(config, plugins, pool=Pool)
