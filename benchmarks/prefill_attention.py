"""Prefill attention over the paged KV cache: the native CPU kernel against the JAX form it replaces.

One SmolLM2-135M layer's attention (9 query heads over 3 KV heads, head dim 64, blocks of 16
positions) for one packed prefill call of ``T`` = 256 prompt tokens, as `prefill_packed` makes
them: one prompt's first or second chunk of 256, or several shorter chunks packed one after
another (some after cached positions of their own), each token attending to its own sequence's
positions up to its own, in scattered blocks of float32 pools. Two implementations of the same
math, side by side, in alternating rounds:

- ``jax``: `lamina_jax.model.llama.packed_prefill_attention` with the kernel switched off, a loop
  over chunks of the packed table gathered into new arrays, every token scoring the keys of every
  sequence in the pack before the mask drops them (what ``prefill_packed`` runs where the kernel
  is not built, and on GPUs and TPUs);
- ``kernel``: the same function with the kernel (`lamina_jax.model.attention_kernel.paged_attention`,
  ``csrc/paged_attention.cc``), each token reading only its own sequence's blocks.

Reported: median ms per call (one layer; a prefill call runs it once per layer, 30 times), the
ratio (jax ÷ kernel) and the largest absolute difference between the two. Without the kernel built
(``scripts/kernels/build_cpu_kernels.sh``) only the JAX form is timed.

    uv run python benchmarks/prefill_attention.py            # 5 rounds of 20 calls
    uv run python benchmarks/prefill_attention.py --quick --json
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import statistics
import sys
import time
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from lamina_jax.model import attention_kernel
from lamina_jax.model.config import LlamaConfig
from lamina_jax.model.llama import packed_prefill_attention
from lamina_jax.native import cpu_model

T, HEADS, KV_HEADS, HEAD_DIM, BLOCK = 256, 9, 3, 64, 16
CONFIG = LlamaConfig(vocab_size=49152, dim=576, ffn_dim=1536, n_layers=30, n_heads=HEADS, n_kv_heads=KV_HEADS,
                     head_dim=HEAD_DIM, norm_eps=1e-5, rope_base=100000.0, context_length=8192)
CASES = {"1 x 256 from 0": [(256, 0)], "1 x 256 from 256": [(256, 256)], "2 x 128": [(128, 0)] * 2,
         "8 x 32": [(32, 0)] * 8, "16 x 16": [(16, 0)] * 16, "4 x 64 from 192": [(64, 192)] * 4}
"""Each case's chunks: (tokens, cached positions before them)."""


def timed(fn: object, args: tuple[jax.Array, ...], calls: int) -> float:
    """Median seconds of ``calls`` calls."""
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn(*args).block_until_ready()  # type: ignore[operator]
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def packed(chunks: list[tuple[int, int]], blocks: int, rng: np.random.Generator) -> tuple[jax.Array, ...]:
    """`prefill_packed`'s positions, rows, table, table_rows and starts for ``chunks``, in scattered
    blocks of a pool of ``blocks``."""
    positions, rows, table, table_rows, starts = [], [], [], [], []
    free = iter(rng.permutation(blocks).tolist())
    for row, (length, cached) in enumerate(chunks):
        positions += range(cached, cached + length)
        rows += [row] * length
        owned = -(-(cached + length) // BLOCK)
        starts.append(len(table))
        table += [next(free) for _ in range(owned)]
        table_rows += [row] * owned
    pad = 2 * T // BLOCK - len(table)
    return (jnp.asarray(positions + [0] * (T - len(positions)), jnp.int32),
            jnp.asarray(rows + [-1] * (T - len(rows)), jnp.int32), jnp.asarray(table + [0] * pad, jnp.int32),
            jnp.asarray(table_rows + [-1] * pad, jnp.int32), jnp.asarray(starts, jnp.int32))


def attention(q: jax.Array, k: jax.Array, v: jax.Array, positions: jax.Array, rows: jax.Array, table: jax.Array,
              table_rows: jax.Array, starts: jax.Array) -> jax.Array:
    attend = packed_prefill_attention(CONFIG, BLOCK, positions, rows, table, table_rows, starts)
    return attend(q, (k, v, None, None))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 rounds of 10 calls")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line of stdout")
    args = parser.parse_args()
    rounds, calls = (3, 10) if args.quick else (5, 20)
    rng = np.random.default_rng(0)
    blocks = 2 * T // BLOCK * 4
    k, v = (jnp.asarray(rng.standard_normal((blocks, KV_HEADS, BLOCK, HEAD_DIM)), jnp.float32) for _ in range(2))
    kernel = attention_kernel.usable(HEADS, k)
    if not kernel:
        print("no CPU attention kernel built here (scripts/kernels/build_cpu_kernels.sh): the JAX form alone",
              file=sys.stderr)
    # two wrappers of their own, so that neither reuses the other's trace
    forms = {form: jax.jit(functools.partial(attention)) for form in ("jax", "kernel")[:2 if kernel else 1]}
    results = []
    with tqdm(total=len(CASES) * rounds, desc="prefill attention", file=sys.stderr) as bar:
        for name, chunks in CASES.items():
            call = (jnp.asarray(rng.standard_normal((1, T, HEADS, HEAD_DIM)), jnp.float32), k, v,
                    *packed(chunks, blocks, rng))
            with mock.patch.object(attention_kernel, "usable", lambda *_: False):
                outputs = {"jax": forms["jax"](*call).block_until_ready()}  # traced (and compiled) without it
            if kernel:
                outputs["kernel"] = forms["kernel"](*call).block_until_ready()
            samples: dict[str, list[float]] = {form: [] for form in forms}
            for r in range(rounds):
                for form in (list(forms) if r % 2 == 0 else list(reversed(forms))):
                    samples[form].append(timed(forms[form], call, calls))
                bar.update()
            real = np.asarray(call[4]) >= 0  # rows: padding tokens attend to nothing
            row = {"case": name, "tokens": int(real.sum()), "jax_ms": 1e3 * statistics.median(samples["jax"])}
            if kernel:
                row["kernel_ms"] = 1e3 * statistics.median(samples["kernel"])
                row["ratio_jax_over_kernel"] = row["jax_ms"] / row["kernel_ms"]
                diff = np.abs(np.asarray(outputs["jax"]) - np.asarray(outputs["kernel"]))[0][real]
                row["max_abs_diff"] = float(diff.max())
            results.append(row)
            jax.clear_caches()  # each case's "jax" form is traced anew, with the kernel switched off
    print(f"{cpu_model()} · {platform.machine()} · jax {jax.__version__} on {jax.default_backend()}; one SmolLM2 "
          f"layer's prefill attention ({T} packed tokens, {HEADS} heads / {KV_HEADS} KV heads, blocks of {BLOCK}, "
          f"float32 pools); medians of {rounds} alternating rounds x {calls} calls")
    print(f"{'case':>17} {'jax ms':>8} {'kernel ms':>10} {'ratio':>6} {'max |diff|':>11}")
    for row in results:
        tail = (f"{row['kernel_ms']:>10.2f} {row['ratio_jax_over_kernel']:>6.2f} {row['max_abs_diff']:>11.1e}"
                if kernel else f"{'-':>10} {'-':>6} {'-':>11}")
        print(f"{row['case']:>17} {row['jax_ms']:>8.2f} {tail}")
    if args.json:
        print(json.dumps({"benchmark": "prefill_attention", "quick": args.quick, "kernel": kernel,
                          "cpu": cpu_model(), "results": results}))


if __name__ == "__main__":
    main()
