"""Helpers for tests of this plugin and of code built on it.

A tiny random Llama in numpy, an independent float64 numpy forward pass to check the JAX model
against, the metadata of a tiny byte-level BPE tokenizer, a writer of GGUF files in llama.cpp's
layout (Q/K rows permuted, quantized with ``gguf.quants.quantize``), and `release_compiled_code`
for test processes that compile many models.
"""

import gc
import os
from pathlib import Path
from typing import Any

import gguf
import jax
import jax.numpy as jnp
import numpy as np

from lamina_jax.model.config import LlamaConfig
from lamina_jax.model.llama import LayerParams, LlamaParams

MAP_SHARE = 0.5
"""`release_compiled_code` frees JAX's compiled code once the process holds this share of the
kernel's limit on memory maps."""


def _memory_maps() -> tuple[int, int] | None:
    """The process's memory maps and the kernel's limit on them (``vm.max_map_count``); None off Linux."""
    try:
        limit = int(Path("/proc/sys/vm/max_map_count").read_text())
        with open("/proc/self/maps", "rb") as maps:
            return sum(1 for _ in maps), limit
    except OSError:
        return None


def release_compiled_code() -> bool:
    """Drop JAX's caches of compiled executables (`jax.clear_caches`) when the process nears its
    limit on memory maps; whether it did.

    XLA:CPU maps each executable's code in a few hundred separate maps (a model's prefill or decode
    shape: about 390), and the jit caches keep every executable of every configuration alive. A
    test process that loads dozens of models passes the kernel's default limit of 65,530, and then
    the next compile fails to map its code and the process dies (SIGSEGV or SIGABRT inside
    ``backend_compile_and_load``). A serving process, which loads its models once, stays far below.
    """
    counted = _memory_maps()
    if counted is None or counted[0] < MAP_SHARE * counted[1]:
        return False
    gc.collect()
    jax.clear_caches()
    gc.collect()
    return True


Weights = dict[str, Any]
"""``embed``, ``norm``, ``lm_head`` (``None`` if tied) and ``layers``: dicts keyed as `LayerParams`."""

CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CONTROL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "1 2", "Ã ©", "Ġ Ġ"]
GGUF_NAMES = {
    "attn_norm": "attn_norm", "wq": "attn_q", "wk": "attn_k", "wv": "attn_v", "wo": "attn_output",
    "ffn_norm": "ffn_norm", "w_gate": "ffn_gate", "w_up": "ffn_up", "w_down": "ffn_down",
}  # fmt: skip


def tiny_config(vocab_size: int = 256) -> LlamaConfig:
    """2 layers, dim 64, 4 query heads sharing 2 KV heads of 16 dimensions."""
    return LlamaConfig(
        vocab_size=vocab_size,
        dim=64,
        ffn_dim=128,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        head_dim=16,
        norm_eps=float(np.float32(1e-5)),  # GGUF stores it as float32
        rope_base=10000.0,
        context_length=256,
    )


def random_weights(config: LlamaConfig, *, seed: int = 0, tied: bool = False) -> Weights:
    """Float32 weights in Hugging Face order (``[out, in]``, Q/K rows not permuted)."""
    rng = np.random.default_rng(seed)

    def linear(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    def norm() -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(config.dim)).astype(np.float32)

    q_rows, kv_rows = config.n_heads * config.head_dim, config.n_kv_heads * config.head_dim
    embed = rng.standard_normal((config.vocab_size, config.dim)).astype(np.float32)
    return {
        "embed": embed,
        "layers": [
            {
                "attn_norm": norm(),
                "wq": linear(q_rows, config.dim),
                "wk": linear(kv_rows, config.dim),
                "wv": linear(kv_rows, config.dim),
                "wo": linear(config.dim, q_rows),
                "ffn_norm": norm(),
                "w_gate": linear(config.ffn_dim, config.dim),
                "w_up": linear(config.ffn_dim, config.dim),
                "w_down": linear(config.dim, config.ffn_dim),
            }
            for _ in range(config.n_layers)
        ],
        "norm": norm(),
        "lm_head": None if tied else linear(config.vocab_size, config.dim),
    }


def to_params(weights: Weights) -> LlamaParams:
    """The model's parameters (JAX arrays) from `random_weights`."""
    head = weights["lm_head"]
    return LlamaParams(
        embed=jnp.asarray(weights["embed"]),
        layers=tuple(LayerParams(**{k: jnp.asarray(v) for k, v in layer.items()}) for layer in weights["layers"]),
        norm=jnp.asarray(weights["norm"]),
        lm_head=None if head is None else jnp.asarray(head),
    )


def permute_qk(weight: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's converter (``convert_hf_to_gguf.py``): interleave the two halves of each head's rows."""
    return weight.reshape(n_heads, 2, weight.shape[0] // n_heads // 2, -1).swapaxes(1, 2).reshape(weight.shape)


def _rope(x: np.ndarray, interleaved: bool, base: float) -> np.ndarray:
    """Rotate ``x [T, heads, d]``: NeoX pairs (i, i + d/2), or GPT-J/llama.cpp pairs (2i, 2i + 1)."""
    length, _, d = x.shape
    angles = np.arange(length)[:, None, None] * base ** (-np.arange(0, d, 2) / d)
    cos, sin = np.cos(angles), np.sin(angles)
    if interleaved:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return np.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).reshape(x.shape)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def reference_logits(
    weights: Weights, config: LlamaConfig, tokens: list[int], *, interleaved_rope: bool = False
) -> np.ndarray:
    """Full causal forward pass in float64 numpy, written independently of the JAX model."""

    def rms(x: np.ndarray, g: np.ndarray) -> np.ndarray:
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + config.norm_eps) * g

    length, hd, group = len(tokens), config.head_dim, config.n_heads // config.n_kv_heads
    x = weights["embed"][tokens].astype(np.float64)
    causal = np.tril(np.ones((length, length), dtype=bool))
    for layer in weights["layers"]:
        h = rms(x, layer["attn_norm"])
        q = _rope((h @ layer["wq"].T).reshape(length, config.n_heads, hd), interleaved_rope, config.rope_base)
        k = _rope((h @ layer["wk"].T).reshape(length, config.n_kv_heads, hd), interleaved_rope, config.rope_base)
        v = (h @ layer["wv"].T).reshape(length, config.n_kv_heads, hd)
        k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
        scores = np.einsum("thd,shd->hts", q, k) / np.sqrt(hd)
        scores = np.where(causal, scores, -np.inf)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        x = x + np.einsum("hts,shd->thd", probs, v).reshape(length, -1) @ layer["wo"].T
        h = rms(x, layer["ffn_norm"])
        gate = h @ layer["w_gate"].T
        x = x + (gate / (1 + np.exp(-gate)) * (h @ layer["w_up"].T)) @ layer["w_down"].T
    head = weights["embed"] if weights["lm_head"] is None else weights["lm_head"]
    return rms(x, weights["norm"]) @ head.T


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = [b for b in range(256) if b not in printable]
    codes = printable + [256 + i for i in range(len(extra))]
    return {b: chr(c) for b, c in zip(printable + extra, codes, strict=True)}


def tokenizer_metadata(*, add_bos: bool = False) -> dict[str, Any]:
    """GGUF ``tokenizer.*`` metadata of a tiny byte-level BPE: 3 control tokens, 256 bytes, a few merges."""
    tokens = CONTROL_TOKENS + sorted(_bytes_to_unicode().values()) + [m.replace(" ", "") for m in MERGES]
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "smollm",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [3] * len(CONTROL_TOKENS) + [1] * (len(tokens) - len(CONTROL_TOKENS)),
        "tokenizer.ggml.merges": MERGES,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.add_bos_token": add_bos,
        "tokenizer.chat_template": CHATML_TEMPLATE,
    }


def write_gguf(
    path: Path,
    config: LlamaConfig,
    weights: Weights,
    qtype: gguf.GGMLQuantizationType,
    tokenizer: dict[str, Any],
) -> dict[str, np.ndarray]:
    """Write a llama GGUF the way llama.cpp lays it out; return each tensor as stored (dequantized)."""
    writer = gguf.GGUFWriter(path, "llama")
    for key, value in {
        "block_count": config.n_layers,
        "context_length": config.context_length,
        "embedding_length": config.dim,
        "feed_forward_length": config.ffn_dim,
        "attention.head_count": config.n_heads,
        "attention.head_count_kv": config.n_kv_heads,
        "rope.dimension_count": config.head_dim,
        "vocab_size": config.vocab_size,
    }.items():
        writer.add_uint32(f"llama.{key}", value)
    writer.add_float32("llama.attention.layer_norm_rms_epsilon", config.norm_eps)
    writer.add_float32("llama.rope.freq_base", config.rope_base)
    for key, value in tokenizer.items():
        if isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        elif isinstance(value, str):
            writer.add_string(key, value)
        else:
            writer.add_array(key, value)

    stored: dict[str, np.ndarray] = {}

    def add(name: str, array: np.ndarray) -> None:
        kind = qtype if array.ndim == 2 else gguf.GGMLQuantizationType.F32
        data = gguf.quants.quantize(array, kind)
        writer.add_tensor(name, data, raw_dtype=kind)
        stored[name] = gguf.quants.dequantize(data, kind).reshape(array.shape)

    add("token_embd.weight", weights["embed"])
    for i, layer in enumerate(weights["layers"]):
        for key, gguf_name in GGUF_NAMES.items():
            array = layer[key]
            if key == "wq":
                array = permute_qk(array, config.n_heads)
            elif key == "wk":
                array = permute_qk(array, config.n_kv_heads)
            add(f"blk.{i}.{gguf_name}.weight", array)
    add("output_norm.weight", weights["norm"])
    if weights["lm_head"] is not None:
        add("output.weight", weights["lm_head"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return stored


def stored_weights(stored: dict[str, np.ndarray], config: LlamaConfig) -> Weights:
    """The file-order weights (Q/K still permuted) as a `Weights` dict for `reference_logits`."""
    return {
        "embed": stored["token_embd.weight"],
        "layers": [
            {key: stored[f"blk.{i}.{name}.weight"] for key, name in GGUF_NAMES.items()} for i in range(config.n_layers)
        ],
        "norm": stored["output_norm.weight"],
        "lm_head": stored.get("output.weight"),
    }


def write_tiny_gguf(path: Path, *, seed: int = 7) -> Path:
    """A tiny random Llama with a byte-level BPE tokenizer and a ChatML template, written as a GGUF file."""
    metadata = tokenizer_metadata()
    config = tiny_config(vocab_size=len(metadata["tokenizer.ggml.tokens"]))
    write_gguf(path, config, random_weights(config, seed=seed), gguf.GGMLQuantizationType.F32, metadata)
    return path


def decode_steps(config: LlamaConfig, params: LlamaParams, *, kv_dtype: str, steps: int) -> tuple[list[np.ndarray], Any]:
    """Greedy batched decode steps of the tiny decoder: three prompts (5, 13 and 2 tokens) prefilled
    into blocks of 4, then ``steps`` decode steps with a padding row among them. Returns each step's
    logits of the three real rows and the final cache: what an attention path must leave unchanged."""
    from lamina_jax.model import llama

    rng = np.random.default_rng(2)
    prompts = [rng.integers(0, config.vocab_size, n).tolist() for n in (5, 13, 2)]
    tokens = jnp.asarray(rng.integers(0, config.vocab_size, 4), jnp.int32)
    tables = jnp.asarray([[0, 1, 2, 3, 4], [5, 6, 7, 8, 9], [10, 11, 12, 13, 14], [15, 15, 15, 15, 15]], jnp.int32)
    cache = llama.init_cache(config, num_blocks=16, block_size=4, dtype=kv_dtype)
    for prompt, owned in zip(prompts, tables, strict=False):
        padded = jnp.asarray(prompt + [0] * (16 - len(prompt)), jnp.int32)
        cache = llama.prefill(params, cache, padded, len(prompt), owned, 0, config=config)[1]
    logits_per_step = []
    positions = np.array([len(p) for p in prompts] + [-1], np.int32)
    for _ in range(steps):
        logits, cache = llama.decode(params, cache, tokens, tables, jnp.asarray(positions), config=config)
        tokens = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        logits_per_step.append(np.asarray(logits[:3]))
        positions[:3] += 1
    return logits_per_step, cache


def cpu_kernels_absent() -> bool:
    """Whether tests of the CPU kernels should skip: they are not built here and
    ``LAMINA_REQUIRE_CPU_KERNELS=1`` does not say they must be (the tox ``ggml`` env builds them
    first and sets that, so there they fail instead)."""
    from lamina_jax.model import cpu_kernels

    return os.environ.get("LAMINA_REQUIRE_CPU_KERNELS") != "1" and not cpu_kernels.available()


def device_counts(*counts: int) -> list[Any]:
    """Pytest parameters (``tp1``, ``tp2``, ...) of a test over ``counts`` devices. Those above one
    are marked ``tensor_parallel`` and need as many JAX devices, which on the CPU means
    ``XLA_FLAGS=--xla_force_host_platform_device_count=N`` set before JAX starts, as the tox
    ``tensor-parallel`` env does; they skip where there are fewer, unless ``LAMINA_REQUIRE_DEVICES``
    says the process must have that many (that env sets it, so there they fail instead)."""
    import pytest

    required = int(os.environ.get("LAMINA_REQUIRE_DEVICES", "0"))
    return [pytest.param(n, id=f"tp{n}") if n == 1 else pytest.param(n, id=f"tp{n}", marks=[
        pytest.mark.tensor_parallel,
        pytest.mark.skipif(len(jax.devices()) < n and required < n,
                           reason=f"needs {n} JAX devices (the tox tensor-parallel env fakes 4 CPU devices)")])
            for n in counts]
