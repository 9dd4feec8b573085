"""This CPU, as the scripts that build native code for it name it, and the code built for it
(importable without JAX)."""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
from pathlib import Path


def _fields(text: str) -> dict[str, str]:
    """``key: value`` lines, the first of each key."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() not in out:
            out[key.strip()] = value.strip()
    return out


def lscpu() -> dict[str, str]:
    """``lscpu``'s fields (empty when it is missing)."""
    if shutil.which("lscpu") is None:
        return {}
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10, check=False,
                              env={**os.environ, "LC_ALL": "C"}).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    return _fields(text)


def cpuinfo() -> dict[str, str]:
    """The first processor's fields in ``/proc/cpuinfo`` (empty when unreadable)."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return {}
    return _fields(text)


def cpu_model() -> str:
    """The CPU's model name as ``lscpu`` prints it (``/proc/cpuinfo`` or ``platform`` otherwise)."""
    return (lscpu().get("Model name") or cpuinfo().get("model name") or platform.processor()
            or platform.machine() or "unknown")


def cpu_key(model: str | None = None) -> str:
    """The CPU model as the build scripts write it in their cache folders' names (see
    ``scripts/llama_cpp_sdist.sh``): a native build is only valid on the CPU it was built for."""
    return re.sub(r"[^A-Za-z0-9.-]", "_", model if model is not None else cpu_model())


CPU_KERNELS_BUILD_HINT = "build it with `uv run bash scripts/kernels/build_cpu_kernels.sh` (about 2 minutes)"


def cpu_kernels_library() -> Path | None:
    """The CPU kernels (`lamina_jax.model.cpu_kernels`): ``$LAMINA_CPU_KERNELS``, else the newest library
    built for this CPU under ``${LAMINA_KERNELS_CACHE:-~/.cache/lamina/kernels}``; None if neither is
    a file."""
    override = os.environ.get("LAMINA_CPU_KERNELS")
    if override:
        path = Path(override).expanduser()
        return path if path.is_file() else None
    root = Path(os.environ.get("LAMINA_KERNELS_CACHE", Path.home() / ".cache" / "lamina" / "kernels"))
    built = [lib for pattern in (cpu_key(), f"{cpu_key()}-noamx")  # -noamx: see scripts/llama_cpp_sdist.sh
             for lib in root.glob(f"cpu-kernels-*-{pattern}/liblamina_cpu_kernels.so")]
    return max(built, key=lambda p: p.stat().st_mtime) if built else None
