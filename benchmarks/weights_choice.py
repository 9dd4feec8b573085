"""Whether ``weights_dtype = "auto"`` picks, at each decode batch size, the format whose real decode step is fastest.

For SmolLM2-135M-Instruct (the GGUF of the default stack), at each row count:

1. `lamina_jax.weight_formats.measure` runs: the start-up measurement of ``auto``. It estimates the
   step's matrix products in each of the ``auto`` formats, and the pick is the fastest estimate.
2. The real decode step (`lamina_jax.model.llama.decode`) runs in each format, on every row at
   position ``--position`` of its own blocks. This is attention, the norms and the output head
   included; sampling is left out. Each format is timed in a block: one untimed call, then
   ``--calls`` timed. The formats take turns over ``--rounds`` rounds, the order reversed every other
   round. The figure is the median.

Printed per row count: the real step's ms in each format, the measurement's estimate, ``auto``'s
pick, the fastest real format, and the pick's cost (its real step over the fastest's; 1.00 is a
right pick).

    uv run python benchmarks/weights_choice.py                 # 1, 2, 4, 8, 16 and 32 rows
    uv run python benchmarks/weights_choice.py --quick --json  # 1, 16 and 32 rows; last line: one JSON object

The q4_1 formats need the CPU kernels (``scripts/kernels/build_cpu_kernels.sh``). Other jobs on the
machine skew the figures.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from statistics import median
from typing import Any

import jax
import jax.numpy as jnp
from tqdm import tqdm

from lamina_jax import weight_formats
from lamina_jax.model import llama
from lamina_jax.weights.gguf import load_gguf, smollm2_path

BLOCK_SIZE = 16


def real_steps(model: Any, formats: tuple[str, ...], rows: int, args: argparse.Namespace) -> dict[str, float]:
    """Median seconds of one real decode step at ``rows`` rows, by format."""
    blocks_per_row = args.position // BLOCK_SIZE + 1
    cache = {"kv": llama.init_cache(model.config, num_blocks=rows * blocks_per_row + 1, block_size=BLOCK_SIZE)}
    tokens = jnp.full((rows,), 100, jnp.int32)
    tables = jnp.arange(rows * blocks_per_row, dtype=jnp.int32).reshape(rows, blocks_per_row)
    positions = jnp.full((rows,), args.position, jnp.int32)
    held = {fmt: (weight_formats.cast(model.params, weight_formats.FORMATS[fmt][0]),
                  weight_formats.configure(model.config, fmt)) for fmt in formats}

    def step(fmt: str) -> None:
        params, config = held[fmt]
        logits, cache["kv"] = llama.decode(params, cache["kv"], tokens, tables, positions, config=config)
        logits.block_until_ready()

    times: dict[str, list[float]] = {fmt: [] for fmt in formats}
    for round_ in range(args.rounds):
        for fmt in formats if round_ % 2 == 0 else formats[::-1]:
            step(fmt)
            for _ in range(args.calls):
                started = time.perf_counter()
                step(fmt)
                times[fmt].append(time.perf_counter() - started)
    return {fmt: median(t) for fmt, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1, 16 and 32 rows")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line of stdout")
    parser.add_argument("--rows", type=lambda s: [int(x) for x in s.split(",")], default=None)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--calls", type=int, default=3, help="timed calls per format per round")
    parser.add_argument("--position", type=int, default=100, help="each row's position (its context length)")
    args = parser.parse_args()
    row_counts = args.rows or ([1, 16, 32] if args.quick else [1, 2, 4, 8, 16, 32])
    model = load_gguf(smollm2_path())
    formats = weight_formats.auto(model.params)
    print(f"formats {', '.join(formats)}; measuring auto's estimates", file=sys.stderr)
    estimates = weight_formats.measure(weight_formats.probe(model.params, model.config), row_counts, formats,
                                       model.config.n_layers)
    picks = weight_formats.fastest(estimates)
    results: dict[int, dict[str, Any]] = {}
    for rows in tqdm(row_counts, desc="real decode steps", file=sys.stderr):
        real = real_steps(model, formats, rows, args)
        best = min(real, key=real.__getitem__)
        results[rows] = {"real_s": real, "estimate_s": estimates[rows], "auto": picks[rows], "fastest": best,
                         "cost": real[picks[rows]] / real[best]}
    print(f"SmolLM2-135M-Instruct, JAX {jax.__version__} ({platform.processor() or platform.machine()}); "
          f"real decode step at position {args.position}, ms (auto's estimate in brackets)")
    for rows, r in results.items():
        cells = "  ".join(f"{fmt} {r['real_s'][fmt] * 1e3:6.1f} ({r['estimate_s'][fmt] * 1e3:6.1f})" for fmt in formats)
        print(f"  {rows:>3} rows: {cells}  auto {r['auto']}, fastest {r['fastest']}, cost {r['cost']:.2f}")
    if args.json:
        print(json.dumps({"benchmark": "weights_choice", "quick": args.quick, "formats": formats,
                          "position": args.position, "results": {str(n): r for n, r in results.items()}}))


if __name__ == "__main__":
    main()
