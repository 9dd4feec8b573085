"""Decode attention over the paged KV cache: the backend's kernel against the JAX form it replaces.

One SmolLM2-135M layer's decode attention (9 query heads over 3 KV heads, head dim 64, blocks of
16 positions): ``B`` rows, one query each, over contexts of 48 positions (``short``) or drawn
from 50–600 (``sharegpt``, the spread of ShareGPT chat prompts), in scattered blocks, with float32
and bfloat16 pools. Two implementations of the same math, side by side, in alternating rounds:

- ``jax``: `lamina_jax.model.llama.jax_decode_attention`, a loop over chunks of blocks gathered into
  new arrays, in segments of rows (what ``decode`` runs where the kernel is not built);
- ``kernel``: on the CPU `lamina_jax.model.attention_kernel.decode_attention` (``csrc/paged_attention.cc``),
  on a GPU or TPU `lamina_jax.model.pallas_attention.decode_attention` (Pallas), each reading every
  row's blocks where they lie.

Reported: median ms per call (one layer; a decode step runs it once per layer, 30 times), the
ratio (jax ÷ kernel) and the largest absolute difference between the two. Without a kernel (on the
CPU, ``scripts/kernels/build_cpu_kernels.sh`` not run) only the JAX form is timed.

    uv run python benchmarks/decode_attention.py            # B = 16, 32; 5 rounds of 20 calls
    uv run python benchmarks/decode_attention.py --quick --json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from lamina_jax.model import attention_kernel, pallas_attention
from lamina_jax.model.llama import jax_decode_attention
from lamina_jax.native import cpu_model
from prefill_attention import timed

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 9, 3, 64, 16
WIDTH = 40
"""Blocks per row's table: 640 positions, more than the longest context."""


def contexts(kind: str, rows: int, rng: np.random.Generator) -> np.ndarray:
    return np.full(rows, 48) if kind == "short" else np.sort(rng.integers(50, 601, rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="B = 32 only, 3 rounds of 10 calls")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line of stdout")
    args = parser.parse_args()
    batches, rounds, calls = ((32,), 3, 10) if args.quick else ((16, 32), 5, 20)
    rng = np.random.default_rng(0)
    pools_by_dtype = {}
    blocks = max(batches) * WIDTH
    for dtype in ("float32", "bfloat16"):
        shape = (blocks, KV_HEADS, BLOCK, HEAD_DIM)
        pools_by_dtype[dtype] = tuple(jnp.asarray(rng.standard_normal(shape), dtype) for _ in range(2))
    module = next((m for m in (attention_kernel, pallas_attention) if m.usable(HEADS, pools_by_dtype["float32"][0])),
                  None)
    kernel = module is not None
    if module is None:
        print(f"no decode-attention kernel on {jax.default_backend()} here (on the CPU: "
              "scripts/kernels/build_cpu_kernels.sh): the JAX form alone", file=sys.stderr)

    def jax_form(q: jax.Array, k: jax.Array, v: jax.Array, tables: jax.Array, lengths: jax.Array) -> jax.Array:
        return jax_decode_attention(q, (k, v, None, None), tables, lengths - 1)

    forms = {"jax": jax.jit(jax_form)}
    if module is not None:
        forms["kernel"] = jax.jit(module.decode_attention)
    cases = [(b, kind, dtype) for b in batches for kind in ("short", "sharegpt") for dtype in pools_by_dtype]
    results = []
    with tqdm(total=len(cases) * rounds, desc="decode attention", file=sys.stderr) as bar:
        for rows, kind, dtype in cases:
            k, v = pools_by_dtype[dtype]
            lengths = jnp.asarray(contexts(kind, rows, rng), jnp.int32)
            tables = jnp.asarray(rng.permutation(blocks)[:rows * WIDTH].reshape(rows, WIDTH), jnp.int32)
            q = jnp.asarray(rng.standard_normal((rows, HEADS, HEAD_DIM)), jnp.float32)
            call = (q, k, v, tables, lengths)
            outputs = {name: fn(*call).block_until_ready() for name, fn in forms.items()}  # compiles
            samples: dict[str, list[float]] = {name: [] for name in forms}
            for r in range(rounds):
                for name in (list(forms) if r % 2 == 0 else list(reversed(forms))):
                    samples[name].append(timed(forms[name], call, calls))
                bar.update()
            row = {"B": rows, "contexts": kind, "positions": int(lengths.sum()), "pool_dtype": dtype,
                   "jax_ms": 1e3 * statistics.median(samples["jax"])}
            if kernel:
                row["kernel_ms"] = 1e3 * statistics.median(samples["kernel"])
                row["ratio_jax_over_kernel"] = row["jax_ms"] / row["kernel_ms"]
                row["max_abs_diff"] = float(jnp.abs(outputs["jax"] - outputs["kernel"]).max())
            results.append(row)
    print(f"{cpu_model()} · {platform.machine()} · jax {jax.__version__} on {jax.default_backend()}; one SmolLM2 "
          f"layer's decode attention ({HEADS} heads / {KV_HEADS} KV heads, blocks of {BLOCK}); medians of "
          f"{rounds} alternating rounds x {calls} calls; kernel: {module.__name__ if module else 'none'}")
    print(f"{'B':>3} {'contexts':>9} {'positions':>9} {'pools':>9} {'jax ms':>8} {'kernel ms':>10} {'ratio':>6} "
          f"{'max |diff|':>11}")
    for row in results:
        tail = (f"{row['kernel_ms']:>10.2f} {row['ratio_jax_over_kernel']:>6.2f} {row['max_abs_diff']:>11.1e}"
                if kernel else f"{'-':>10} {'-':>6} {'-':>11}")
        print(f"{row['B']:>3} {row['contexts']:>9} {row['positions']:>9} {row['pool_dtype']:>9} "
              f"{row['jax_ms']:>8.2f} {tail}")
    if args.json:
        print(json.dumps({"benchmark": "decode_attention", "quick": args.quick, "kernel": kernel,
                          "kernel_module": None if module is None else module.__name__,
                          "backend": jax.default_backend(), "cpu": cpu_model(), "results": results}))


if __name__ == "__main__":
    main()
