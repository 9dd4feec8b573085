"""Tensor parallelism on this machine: a decode step and a prefill chunk over 1, 2 and 4 devices.

The model runner (`lamina_jax.model_runner.ModelRunner`) holds SmolLM2-135M's weights in float32
(``--tiny``: the tiny random test model) over a mesh of N devices (`lamina_jax.sharding.make_mesh`;
one device: no mesh, as the executor runs ``tensor_parallel = 1``). Each N runs in a subprocess of
its own, started with ``XLA_FLAGS=--xla_force_host_platform_device_count=4`` and the native CPU
kernels off (so one device runs the same attention as several). Each compiles its two shapes
first; then rounds alternate between the counts, their order reversed every other round, each
timing a decode step of ``--batch`` rows over 64-position contexts and a prefill call of one
256-token chunk. Reported: median ms per call for each count and its ratio to one device.

On the CPU the devices are fake and share the same cores: the figures are the overhead of
sharding (collectives, smaller products, more dispatches), never a speed-up. On a backend with
several real devices (GPUs, TPUs) the same run reports the scaling.

    uv run python benchmarks/sharding.py                 # SmolLM2, 16 rows, 5 rounds of 10 calls
    uv run python benchmarks/sharding.py --quick --json  # 2 rounds of 5 calls

Progress goes to stderr. Other jobs on the machine skew the figures: compare within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from tqdm import tqdm

from llama_cpp_peer import describe_machine, load_at_start, machine

COUNTS = (1, 2, 4)
BLOCK, CONTEXT, CHUNK = 16, 64, 256
"""Positions per KV block, of each decode row's context, of the prefill chunk."""


def _median_ms(call: Callable[[], object], calls: int) -> float:
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        call()  # the runner returns host values: the step has finished
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def worker(devices: int, tiny: bool, batch: int, calls: int) -> None:
    """One device count: print the backend as a JSON line once compiled, then one line of timings per
    line read from stdin."""
    import jax
    import numpy as np

    from lamina_hookspecs.types import SamplingParams
    from lamina_jax import sharding
    from lamina_jax.model_runner import ModelRunner
    from lamina_jax.scheduler import PrefillWork
    from lamina_jax.sequence import Sequence

    available = jax.devices()
    info: dict[str, Any] = {"platform": available[0].platform, "device_kind": available[0].device_kind,
                            "device_count": len(available)}
    if len(available) < devices:
        print(json.dumps({**info, "skipped": f"{len(available)} {info['platform']} device(s)"}), flush=True)
        return
    if tiny:
        from lamina_jax.testing import random_weights, tiny_config, to_params

        config = tiny_config()
        params = to_params(random_weights(config))
    else:
        from lamina_jax.weights.gguf import load_gguf, smollm2_path

        model = load_gguf(smollm2_path())
        params, config = model.params, model.config
    mesh = sharding.make_mesh(devices) if devices > 1 else None
    per_row = -(-(CONTEXT + 1) // BLOCK)
    runner = ModelRunner(params, config, num_blocks=batch * per_row + CHUNK // BLOCK, block_size=BLOCK,
                         max_batch=batch, max_blocks_per_seq=CHUNK // BLOCK, prefill_chunk=CHUNK, max_prefills=1,
                         mesh=mesh)
    rng = np.random.default_rng(0)
    greedy = SamplingParams(temperature=0.0)

    def sequence(length: int, first_block: int) -> Sequence:
        return Sequence(request_id="bench", prompt_ids=rng.integers(0, config.vocab_size, length).tolist(),
                        sampling=greedy, emit=lambda _: None, key=np.zeros(2, np.uint32),
                        blocks=list(range(first_block, first_block + -(-length // BLOCK))))

    rows = [sequence(CONTEXT + 1, i * per_row) for i in range(batch)]
    for seq in rows:
        seq.num_computed = CONTEXT
    prompt = sequence(CHUNK, batch * per_row)
    chunk = [PrefillWork(prompt, 0, prompt.prompt_ids, last=True)]
    runner.decode(rows)  # compiles both shapes
    runner.prefill(chunk)
    info["attention_split"] = mesh is not None and sharding.heads_split(config, mesh)
    info["model"] = {"layers": config.n_layers, "dim": config.dim, "kv_heads": config.n_kv_heads,
                     "vocab": config.vocab_size}
    print(json.dumps(info), flush=True)
    for _ in sys.stdin:
        print(json.dumps({"decode_ms": _median_ms(lambda: runner.decode(rows), calls),
                          "prefill_ms": _median_ms(lambda: runner.prefill(chunk), calls)}), flush=True)


def _start(devices: int, args: argparse.Namespace, calls: int) -> subprocess.Popen[str]:
    env = {**os.environ, "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=4",
           "LAMINA_CPU_KERNELS": os.devnull}  # not a file: the native kernels stay off
    argv = [sys.executable, __file__, "--worker", str(devices), "--batch", str(args.batch), "--calls", str(calls)]
    return subprocess.Popen([*argv, *(["--tiny"] if args.tiny else [])], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)


def _ask(process: subprocess.Popen[str]) -> dict[str, Any]:
    """One round's timings from a worker."""
    assert process.stdin is not None
    process.stdin.write("round\n")
    process.stdin.flush()
    return _read(process)


def _read(process: subprocess.Popen[str]) -> dict[str, Any]:
    """A worker's next JSON line."""
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line:
        raise RuntimeError(f"a worker exited with status {process.wait()} (its error is above)")
    return json.loads(line)


def run(args: argparse.Namespace) -> dict[str, Any]:
    rounds, calls = (2, 5) if args.quick else (5, 10)
    load = load_at_start()
    workers: dict[int, subprocess.Popen[str]] = {}
    infos: dict[int, dict[str, Any]] = {}
    samples: dict[int, list[dict[str, float]]] = {}
    try:
        for n in tqdm(COUNTS, desc="loading and compiling", file=sys.stderr):
            workers[n] = _start(n, args, calls)
            infos[n] = _read(workers[n])
        counts = [n for n in COUNTS if "skipped" not in infos[n]]
        samples = {n: [] for n in counts}
        for r in tqdm(range(rounds), desc="rounds", file=sys.stderr):
            for n in counts if r % 2 == 0 else reversed(counts):
                samples[n].append(_ask(workers[n]))
    finally:
        for process in workers.values():
            if process.stdin is not None:
                process.stdin.close()
            process.wait(timeout=60)
    info = infos[1]
    real = info["platform"] != "cpu"
    note = (f"{info['device_count']} {info['device_kind']} device(s): the ratios are the scaling" if real else
            f"the CPU devices are fake, sharing this machine's {os.cpu_count()} cores: this measures the overhead "
            "of sharding, not a speed-up")
    results = []
    for n in samples:
        row: dict[str, Any] = {"devices": n, "attention_split": infos[n]["attention_split"]}
        for kind in ("decode_ms", "prefill_ms"):
            row[kind] = statistics.median(s[kind] for s in samples[n])
            row[kind.replace("_ms", "_ratio")] = row[kind] / statistics.median(s[kind] for s in samples[1])
        results.append(row)
    return {"config": {"model": "tiny random" if args.tiny else "SmolLM2-135M float32", "batch": args.batch,
                       "context": CONTEXT, "prefill_chunk": CHUNK, "rounds": rounds, "calls": calls,
                       "quick": args.quick},
            "machine": {**machine(), "load_average_at_start": load},
            "backend": {key: info[key] for key in ("platform", "device_kind", "device_count", "model")},
            "real_devices": real, "note": note,
            "skipped": {str(n): infos[n]["skipped"] for n in COUNTS if "skipped" in infos[n]},
            "results": results, "per_round": {str(n): s for n, s in samples.items()}}


def print_report(r: dict[str, Any]) -> None:
    c, b = r["config"], r["backend"]
    print(describe_machine(r["machine"]))
    print(f"{c['model']} ({b['model']['layers']} layers, dim {b['model']['dim']}, {b['model']['kv_heads']} KV heads): "
          f"decode {c['batch']} rows over {c['context']}-position contexts, prefill one {c['prefill_chunk']}-token "
          f"chunk; medians of {c['rounds']} rounds of {c['calls']} calls")
    print(f"NOTE: {r['note']}\n")
    print(f"{'devices':>7} {'attention':>9} {'decode ms':>10} {'÷ 1 device':>10} {'prefill ms':>11} {'÷ 1 device':>10}")
    for row in r["results"]:
        attention = "-" if row["devices"] == 1 else "split" if row["attention_split"] else "whole"
        print(f"{row['devices']:>7} {attention:>9} {row['decode_ms']:10.2f} "
              f"{row['decode_ratio']:10.2f} {row['prefill_ms']:11.2f} {row['prefill_ratio']:10.2f}")
    for n, why in r["skipped"].items():
        print(f"{n} devices: skipped ({why})")
    print("(attention 'whole': the KV heads do not divide by the device count, so each device holds all of them)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds of 5 calls")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line of stdout")
    parser.add_argument("--tiny", action="store_true", help="the tiny random test model instead of SmolLM2")
    parser.add_argument("--batch", type=int, default=16, help="decode rows (default 16)")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--calls", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        worker(args.worker, args.tiny, args.batch, args.calls)
        return
    result = run(args)
    print_report(result)
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
