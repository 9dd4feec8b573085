"""How the CPU is named for the natively built code's cache folders."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from lamina_jax import native


@pytest.mark.skipif(not Path("/proc/cpuinfo").is_file(), reason="needs /proc/cpuinfo")
def test_without_lscpu_the_model_comes_from_the_first_processor_in_proc_cpuinfo(
        monkeypatch: pytest.MonkeyPatch) -> None:
    first = Path("/proc/cpuinfo").read_text().split("\n\n", 1)[0]
    expected = next(line.partition(":")[2].strip() for line in first.splitlines() if line.startswith("model name"))
    monkeypatch.setattr(native.shutil, "which", lambda name: None)
    assert native.lscpu() == {}
    assert native.cpu_model() == expected
    assert native.cpuinfo()["processor"] == "0"


def test_the_cache_key_keeps_only_safe_characters() -> None:
    assert native.cpu_key("AMD EPYC 9B14 (96-Core)") == "AMD_EPYC_9B14__96-Core_"
    assert sys.platform != "linux" or native.cpu_key() == native.cpu_key(native.cpu_model())
