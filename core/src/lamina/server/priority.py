"""The event loop ahead of compute: once the stack has started, the process's other threads (the
executor's engine thread, XLA's compute pool, loaders) run at a lower CPU priority.

On a machine with few cores the compute threads keep every core busy, and the event loop, which
reads requests, refuses what cannot be served and writes tokens, waits for one. With the others
at a higher ``nice`` the scheduler runs the loop first whenever it has work, which is short, so
compute loses little. Threads those threads start later inherit their priority; threads the
loop's thread starts (``asyncio.to_thread``) do not. Per-thread priorities are Linux's; elsewhere
nothing changes.
"""

from __future__ import annotations

import os
import sys
import threading


def lower_other_threads(nice: int) -> int:
    """Add ``nice`` (capped at 19) to the niceness of every thread of this process but the calling
    one; how many threads it lowered."""
    tasks = "/proc/self/task"
    if nice <= 0 or not sys.platform.startswith("linux") or not os.path.isdir(tasks):
        return 0
    me, lowered = threading.get_native_id(), 0
    for entry in os.listdir(tasks):
        tid = int(entry)
        if tid == me:
            continue
        try:
            os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))
        except (ProcessLookupError, PermissionError):  # it ended meanwhile, or the system forbids it
            continue
        lowered += 1
    return lowered
