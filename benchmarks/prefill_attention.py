"""Prefill attention layouts on XLA:CPU: the executor's ``_attend`` against the heads-first layout it replaced.

One SmolLM2-135M layer's attention shape (9 query heads over 3 KV heads, head dim 64): a chunk of
``T`` = 256 prompt tokens attending over ``L`` cached positions (the block table of a sequence
whose chunk ends near ``L``), causal mask. Two layouts of the same math, side by side, in
alternating rounds:

- ``heads-first`` (the baseline, the executor's layout before this benchmark): scores
  ``[B, H_kv, group, T, L]``, softmax over the last axis;
- ``keys-first`` (``lamina_jax.model.llama._attend`` now): scores ``[B, T, L, H_kv, group]``, keys
  before heads as in the cache, softmax over the key axis.

Since attention over the paged cache became `_paged_attention` (a loop over the blocks in use),
``_attend`` serves only the cache-free ``forward``; this benchmark measures that layout choice.

Reported: median ms per call for each ``L`` and the ratio (baseline ÷ ours), and the largest
absolute difference between the two outputs. A full model prefill call runs this once per
layer (30 layers): multiply the saving by 30 for the per-call figure.

    uv run python benchmarks/prefill_attention.py            # L = 256, 512, 1024, 2048; 5 rounds of 20 calls
    uv run python benchmarks/prefill_attention.py --quick --json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from lamina_jax.model.llama import _MASKED, _attend

T, HEADS, KV_HEADS, HEAD_DIM = 256, 9, 3, 64


def heads_first(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
    """The baseline layout: scores ``[B, H_kv, group, T, L]``."""
    batch, length, n_heads, head_dim = q.shape
    n_kv_heads = k.shape[2]
    q = q.reshape(batch, length, n_kv_heads, n_heads // n_kv_heads, head_dim)
    scores = jnp.einsum("btkgd,blkd->bkgtl", q, k) / math.sqrt(head_dim)
    scores = jnp.where(mask[:, None, None], scores, _MASKED)
    probs = jax.nn.softmax(scores, axis=-1)
    return jnp.einsum("bkgtl,blkd->btkgd", probs, v).reshape(batch, length, n_heads * head_dim)


def timed(fn: object, args: tuple[jax.Array, ...], calls: int) -> float:
    """Median seconds of ``calls`` calls."""
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn(*args).block_until_ready()  # type: ignore[operator]
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="L = 512 and 1024, 3 rounds")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line of stdout")
    args = parser.parse_args()
    lengths, rounds, calls = ((512, 1024), 3, 10) if args.quick else ((256, 512, 1024, 2048), 5, 20)
    layouts = {"heads-first": jax.jit(heads_first), "keys-first": jax.jit(_attend)}
    rng = np.random.default_rng(0)
    results = []
    with tqdm(total=len(lengths) * rounds, desc="attention layouts", file=sys.stderr) as bar:
        for length in lengths:
            q = jnp.asarray(rng.standard_normal((1, T, HEADS, HEAD_DIM)), jnp.float32)
            k, v = (jnp.asarray(rng.standard_normal((1, length, KV_HEADS, HEAD_DIM)), jnp.float32) for _ in range(2))
            mask = jnp.asarray(np.tril(np.ones((T, length), bool), k=length - T)[None])
            outputs = {name: fn(q, k, v, mask).block_until_ready() for name, fn in layouts.items()}  # compiles
            samples: dict[str, list[float]] = {name: [] for name in layouts}
            for r in range(rounds):
                for name in (list(layouts) if r % 2 == 0 else list(reversed(layouts))):
                    samples[name].append(timed(layouts[name], (q, k, v, mask), calls))
                bar.update()
            base, ours = statistics.median(samples["heads-first"]), statistics.median(samples["keys-first"])
            results.append({"T": T, "L": length, "heads_first_ms": 1e3 * base, "keys_first_ms": 1e3 * ours,
                            "ratio_heads_first_over_keys_first": base / ours,
                            "max_abs_diff": float(jnp.abs(outputs["heads-first"] - outputs["keys-first"]).max())})
    print(f"one SmolLM2 layer's prefill attention, T={T} query tokens, {HEADS} heads / {KV_HEADS} KV heads, "
          f"jax {jax.__version__} on {jax.default_backend()}; medians of {rounds} alternating rounds x {calls} calls")
    print(f"{'L':>6} {'heads-first ms':>15} {'keys-first ms':>14} {'ratio':>7} {'max |diff|':>11}")
    for row in results:
        print(f"{row['L']:>6} {row['heads_first_ms']:>15.2f} {row['keys_first_ms']:>14.2f} "
              f"{row['ratio_heads_first_over_keys_first']:>7.2f} {row['max_abs_diff']:>11.1e}")
    if args.json:
        print(json.dumps({"benchmark": "prefill_attention", "quick": args.quick, "results": results}))


if __name__ == "__main__":
    main()
