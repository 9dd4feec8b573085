"""The llama.cpp peer of the benchmarks: where its native binaries are, what this machine is,
and parsers for the output of ``llama-bench`` and ``llama-batched-bench``.

The binaries (``llama-server``, ``llama-bench``, ``llama-batched-bench``) are built natively, once
per machine, by ``bash scripts/peers/build_llama_cpp.sh`` into
``${LAMINA_PEERS_CACHE:-~/.cache/lamina/peers}/llama.cpp-<major version>-<CPU model>/bin``
(about 25 minutes on 2 cores: run it in the background, and never beside a benchmark).
:func:`find_peer` only looks for them; it never builds. ``$LAMINA_LLAMA_CPP_DIR`` overrides it.

Imported by ``executor_throughput.py``, ``serving_vs_llama_cpp.py`` and ``upstream_overhead.py`` as a sibling module
(a script's own folder is on ``sys.path``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lamina.tools.bench.servers import ServerProcess, free_port
from lamina_jax.native import cpu_key, cpu_model, cpuinfo, lscpu

BINARIES = ("llama-server", "llama-bench", "llama-batched-bench")
FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni")
BUILD_HINT = ("build it with `bash scripts/peers/build_llama_cpp.sh` (about 25 minutes on 2 cores; "
              "run it in the background, and never beside a benchmark), or set LAMINA_LLAMA_CPP_DIR "
              "to a folder holding " + ", ".join(BINARIES))


# -- this machine ----------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    """The CPU model, the core count (``os.cpu_count``) and which of :data:`FLAGS` the CPU has."""
    flags_text = lscpu().get("Flags") or cpuinfo().get("flags") or ""
    flags = set(flags_text.split())
    return {"cpu_model": cpu_model(), "cores": os.cpu_count(),
            "flags": {flag: flag in flags for flag in FLAGS},
            "platform": platform.platform(), "python": platform.python_version()}


def describe_machine(m: dict[str, Any]) -> str:
    """One line: model, cores and the flags present."""
    present = [f for f, have in m["flags"].items() if have]
    return f"{m['cpu_model']} · {m['cores']} cores · flags: {', '.join(present) or 'none of ' + ', '.join(FLAGS)}"


def load_at_start() -> list[float]:
    """The 1, 5 and 15-minute load averages; warns on stderr when the machine looks busy (the
    comparisons need an idle machine: other jobs skew both engines, llama.cpp's threads most)."""
    load = list(os.getloadavg())
    cores = os.cpu_count() or 1
    if load[0] > 0.5 * cores:
        print(f"warning: load average {load[0]:.2f} on {cores} cores: something else is running; "
              "the figures will be skewed (run on an idle machine)", file=sys.stderr)
    return load


# -- the binaries ----------------------------------------------------------------------------


def cache_root() -> Path:
    return Path(os.environ.get("LAMINA_PEERS_CACHE") or Path.home() / ".cache" / "lamina" / "peers").expanduser()


def _has_all(folder: Path) -> bool:
    return all(os.access(folder / name, os.X_OK) and (folder / name).is_file() for name in BINARIES)


def _version_of(folder: Path) -> int:
    match = re.match(r"llama\.cpp-(\d+)-", folder.parent.name)
    return int(match.group(1)) if match else -1


def find_peer(*, quiet: bool = False) -> Path | None:
    """The folder holding llama.cpp's three binaries: ``$LAMINA_LLAMA_CPP_DIR`` if set, else the
    newest ``llama.cpp-*-<this CPU>[-noamx]/bin`` under :func:`cache_root` holding all three; None (and,
    unless ``quiet``, how to build it, on stderr) when there is none. Never builds."""
    override = os.environ.get("LAMINA_LLAMA_CPP_DIR")
    if override:
        folder = Path(override).expanduser()
        if _has_all(folder):
            return folder
        if not quiet:
            print(f"llama.cpp: LAMINA_LLAMA_CPP_DIR={override} does not hold all of {', '.join(BINARIES)}",
                  file=sys.stderr)
        return None
    root = cache_root()
    found = [bin_ for pattern in (cpu_key(), f"{cpu_key()}-noamx")  # -noamx: see the build script
             for bin_ in root.glob(f"llama.cpp-*-{pattern}/bin") if _has_all(bin_)]
    if found:
        return max(found, key=lambda p: (_version_of(p), p.stat().st_mtime))
    if not quiet:
        print(f"llama.cpp: no native build for this CPU ({cpu_model()}) under {root}; {BUILD_HINT}",
              file=sys.stderr)
    return None


def add_peer_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--peer", default="auto", metavar="auto|none|PATH",
                        help="llama.cpp binaries: auto (find the native build; default), none (skip the peer), "
                             "or a folder holding " + ", ".join(BINARIES))


def resolve_peer(value: str) -> Path | None:
    """The folder ``--peer`` names: ``auto`` → :func:`find_peer`, ``none`` → None, else a path (a
    folder holding the binaries, or one of them); exits with a message when a path lacks them."""
    if value == "none":
        return None
    if value == "auto":
        return find_peer()
    folder = Path(value).expanduser()
    if folder.is_file():
        folder = folder.parent
    if not _has_all(folder):
        raise SystemExit(f"--peer {value}: not a folder holding {', '.join(BINARIES)}")
    return folder


def peer_version(folder: Path) -> str | None:
    """``llama-server --version``'s first line (``version: N (commit)``), or None."""
    try:
        done = subprocess.run([str(folder / "llama-server"), "--version"], capture_output=True, text=True,
                              timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    for line in (done.stdout + "\n" + done.stderr).splitlines():
        if line.startswith("version:"):
            return line.partition(":")[2].strip()
    return None


def peer_info(folder: Path | None) -> dict[str, Any]:
    """What is known of the peer: its folder, the build's name (``llama.cpp-<version>-<CPU>``, the
    version being llama.cpp's release number) and ``llama-server --version``'s first line."""
    if folder is None:
        return {"folder": None, "build": None, "version": None}
    return {"folder": str(folder), "build": folder.parent.name if folder.name == "bin" else folder.name,
            "version": peer_version(folder)}


# Runs argv[2:] as a grandchild and prints its peak RSS after the tag argv[1]: a child forked
# from this (large) process would inherit the parent's high-water mark at exec.
_MAXRSS = """import os, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.argv[2], sys.argv[2:])
_, status, usage = os.wait4(pid, 0)
sys.stderr.write(f"\\n{sys.argv[1]}={usage.ru_maxrss}\\n")
sys.exit(os.waitstatus_to_exitcode(status))
"""
_MAXRSS_TAG = "__peer_maxrss_kib__"


def run_tool(folder: Path, name: str, args: list[str], *,
             timeout_s: float = 900.0) -> tuple[list[str], str, int | None]:
    """Run ``folder/name args``: its argv, its stdout and stderr together, and its peak RSS in
    bytes (None if unknown). Raises with the output's tail if it fails."""
    argv = [str(folder / name), *args]
    done = subprocess.run([sys.executable, "-c", _MAXRSS, _MAXRSS_TAG, *argv], capture_output=True, text=True,
                          timeout=timeout_s, check=False)
    output = done.stdout + "\n" + done.stderr
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited with {done.returncode}:\n{output[-3000:]}")
    match = re.search(rf"^{_MAXRSS_TAG}=(\d+)$", done.stderr, re.MULTILINE)
    return argv, output, int(match.group(1)) * 1024 if match else None  # KiB on Linux


# -- parsing the tools' output --------------------------------------------------------------

_MD_TS = re.compile(r"([0-9]*\.?[0-9]+)\s*(?:±\s*([0-9]*\.?[0-9]+))?")


def parse_llama_bench(output: str) -> list[dict[str, Any]]:
    """The tests ``llama-bench`` reported — ``-o json`` (an array), ``-o jsonl`` or its markdown
    table — each as ``{"n_prompt", "n_gen", "avg_ts", "stddev_ts", ...}``."""
    start = output.find("[")
    while start != -1:  # -o json: the array (log lines may surround it)
        try:
            tests, _ = json.JSONDecoder().raw_decode(output, start)
        except json.JSONDecodeError:
            start = output.find("[", start + 1)
            continue
        if isinstance(tests, list) and tests and all(isinstance(t, dict) and "avg_ts" in t for t in tests):
            return tests
        start = output.find("[", start + 1)
    tests = _json_lines(output, "avg_ts")  # -o jsonl
    if tests:
        return tests
    header: list[str] | None = None
    for line in output.splitlines():  # markdown: | model | size | params | backend | threads | test | t/s |
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if "test" in cells and "t/s" in cells:
            header = cells
            continue
        if header is None or len(cells) != len(header) or set(cells[0]) <= set("-: "):
            continue
        row = dict(zip(header, cells, strict=True))
        test, speed = row["test"], _MD_TS.match(row["t/s"])
        pp, tg = re.search(r"pp(\d+)", test), re.search(r"tg(\d+)", test)
        if speed is None or not (pp or tg):
            continue
        tests.append({"n_prompt": int(pp.group(1)) if pp else 0, "n_gen": int(tg.group(1)) if tg else 0,
                      "avg_ts": float(speed.group(1)),
                      "stddev_ts": float(speed.group(2)) if speed.group(2) else None, "test": test})
    if not tests:
        raise ValueError(f"no results in llama-bench's output:\n{output[-2000:]}")
    return tests


def _json_lines(output: str, key: str) -> list[dict[str, Any]]:
    """The lines of ``output`` that are JSON objects holding ``key`` (the tools' jsonl output)."""
    rows = []
    for line in output.splitlines():
        line = line.strip()
        if line.startswith("{") and f'"{key}"' in line:
            with contextlib.suppress(json.JSONDecodeError):
                rows.append(json.loads(line))
    return rows


_BATCHED_COLUMNS = {"PP": "pp", "TG": "tg", "B": "pl", "N_KV": "n_kv", "T_PP s": "t_pp", "S_PP t/s": "speed_pp",
                    "T_TG s": "t_tg", "S_TG t/s": "speed_tg", "T s": "t", "S t/s": "speed"}


def parse_batched_bench(output: str) -> list[dict[str, Any]]:
    """The rows ``llama-batched-bench`` reported — ``--output-format jsonl`` or its markdown table —
    each as ``{"pp", "tg", "pl", "speed_pp", "speed_tg", "t_pp", "t_tg", ...}`` (``speed_tg`` is
    the table's S_TG t/s: all streams' generated tokens over the generation time)."""
    rows = _json_lines(output, "speed_tg")
    if rows:
        return rows
    header: list[str] | None = None
    for line in output.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if "S_TG t/s" in cells:
            header = cells
            continue
        if header is None or len(cells) != len(header) or set(cells[0]) <= set("-: "):
            continue
        try:
            values = [float(c) for c in cells]
        except ValueError:
            continue
        row = {_BATCHED_COLUMNS.get(h, h): v for h, v in zip(header, values, strict=True)}
        rows.append({k: int(v) if k in ("pp", "tg", "pl", "n_kv") else v for k, v in row.items()})
    if not rows:
        raise ValueError(f"no results in llama-batched-bench's output:\n{output[-2000:]}")
    return rows


class LlamaServer(ServerProcess):
    """``llama-server`` on a free loopback port with ``concurrency`` slots; ``url`` once /health is 200."""

    def __init__(self, folder: Path, gguf: Path, *, threads: int, concurrency: int, ctx_per_slot: int,
                 extra_args: Sequence[str] = (), ready_timeout_s: float = 300.0) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [str(folder / "llama-server"), "-m", str(gguf), "-t", str(threads), "-tb", str(threads),
                "-np", str(concurrency), "-c", str(concurrency * ctx_per_slot),
                "--host", "127.0.0.1", "--port", str(self.port), *extra_args]
        super().__init__("llama-server", argv, f"{self.url}/health", ready_timeout_s=ready_timeout_s)
