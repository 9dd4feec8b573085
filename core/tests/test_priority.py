"""The event loop's thread keeps its priority; the process's other threads drop below it."""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = """
import os, threading
from lamina.server.priority import lower_other_threads
ready, stop = threading.Event(), threading.Event()
tids = []
def worker():
    tids.append(threading.get_native_id()); ready.set(); stop.wait()
thread = threading.Thread(target=worker); thread.start(); ready.wait()
before = os.getpriority(os.PRIO_PROCESS, tids[0])
assert lower_other_threads(0) == 0
lowered = lower_other_threads(7)
print(lowered >= 1, os.getpriority(os.PRIO_PROCESS, tids[0]) - before,
      os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == before)
stop.set(); thread.join()
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread priorities are Linux's")
def test_other_threads_are_lowered_and_the_caller_is_not() -> None:
    # in a child process: the lowered priorities would outlast the test in this one
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["True", "7", "True"]
