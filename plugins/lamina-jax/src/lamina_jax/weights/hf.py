"""Read a Hugging Face model directory: ``config.json`` and ``model.safetensors`` (or shards).

The architectures are ``LlamaForCausalLM``, ``MistralForCausalLM``, ``Qwen2ForCausalLM`` and
``Qwen3ForCausalLM``, all one decoder (`lamina_jax.model.llama`) told apart by their configuration:
Q/K/V biases (``attention_bias``, and always for Qwen2), Q/K head norms (Qwen3), the sliding window
(Mistral's ``sliding_window``) and RoPE scaling (``rope_scaling``, or ``rope_parameters`` as newer
transformers write it). Safetensors files are read with the ``safetensors`` package one tensor at a
time; its ``flax`` framework returns JAX arrays, bfloat16 included, which numpy cannot hold.
Hugging Face row order is the model's own: nothing is permuted.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import jax
import safetensors

from lamina_jax import weight_formats
from lamina_jax.model.config import LlamaConfig
from lamina_jax.model.llama import LayerParams, LlamaParams, Weight
from lamina_jax.model.rope import KINDS, RopeScaling

ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
_BIASED = frozenset({"Qwen2ForCausalLM"})
_HEAD_NORMS = frozenset({"Qwen3ForCausalLM"})

Progress = Callable[[int, int], None]


def is_model_dir(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").is_file()


def read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError as error:
        raise FileNotFoundError(f"{path.parent} has no {path.name}") from error
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON: {error}") from error


def _rope_scaling(config: Mapping[str, Any]) -> RopeScaling:
    scaling = config.get("rope_scaling") or config.get("rope_parameters") or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    kind = "none" if kind == "default" else kind
    if kind not in KINDS:
        raise NotImplementedError(f"config.json rope_scaling type {kind!r} is not supported: supported are "
                                  f"default, {', '.join(KINDS[1:])}")
    if kind == "none":
        return RopeScaling()
    fields = {"factor": "factor", "original_context": "original_max_position_embeddings",
              "low_freq_factor": "low_freq_factor", "high_freq_factor": "high_freq_factor",
              "beta_fast": "beta_fast", "beta_slow": "beta_slow", "attention_factor": "attention_factor"}
    values = {name: scaling[key] for name, key in fields.items() if scaling.get(key) is not None}
    if kind == "yarn" and "original_context" not in values:
        values["original_context"] = config["max_position_embeddings"]
    return RopeScaling(kind=kind, **values)


def architecture(config: Mapping[str, Any]) -> str:
    """The one architecture ``config.json`` names; refused unless it is supported."""
    names = config.get("architectures") or []
    if len(names) != 1 or names[0] not in ARCHITECTURES:
        raise ValueError(f"config.json architectures {names!r} is not supported: supported are "
                         f"{', '.join(ARCHITECTURES)}")
    return names[0]


def read_config(config: Mapping[str, Any]) -> LlamaConfig:
    """The model configuration of a ``config.json``; anything the decoder cannot run is refused by name."""
    arch = architecture(config)
    for key in ("mlp_bias", "use_sliding_window"):
        if config.get(key):
            raise NotImplementedError(f"config.json {key} = true is not supported")
    n_heads = int(config["num_attention_heads"])
    dim = int(config["hidden_size"])
    rope_theta = config.get("rope_theta", (config.get("rope_parameters") or {}).get("rope_theta", 10000.0))
    window = config.get("sliding_window") if arch == "MistralForCausalLM" else None
    return LlamaConfig(
        vocab_size=int(config["vocab_size"]),
        dim=dim,
        ffn_dim=int(config["intermediate_size"]),
        n_layers=int(config["num_hidden_layers"]),
        n_heads=n_heads,
        n_kv_heads=int(config.get("num_key_value_heads") or n_heads),
        head_dim=int(config.get("head_dim") or dim // n_heads),
        norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        rope_base=float(rope_theta),
        context_length=int(config["max_position_embeddings"]),
        rope_scaling=_rope_scaling(config),
        sliding_window=int(window) if window else None,
    )


def _weight_files(directory: Path) -> list[Path]:
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        return [directory / name for name in sorted(set(read_json(index)["weight_map"].values()))]
    single = directory / "model.safetensors"
    if not single.is_file():
        raise FileNotFoundError(f"{directory} has neither model.safetensors nor model.safetensors.index.json")
    return [single]


def _tensors(files: list[Path], keep: Callable[[str], bool]) -> Iterator[tuple[str, jax.Array]]:
    """The tensors of ``files`` whose names ``keep`` takes, read one at a time."""
    for file in files:
        with safetensors.safe_open(str(file), framework="flax") as opened:
            for name in opened.keys():  # noqa: SIM118 (safe_open has no __iter__)
                if keep(name):
                    yield name, opened.get_tensor(name)


def _layer(name: str) -> int | None:
    """The decoder layer a tensor name (``model.layers.{i}.…``) belongs to, if any."""
    parts = name.split(".")
    return int(parts[2]) if parts[:2] == ["model", "layers"] and parts[2].isdigit() else None


def load_params(directory: Path, config: LlamaConfig, hf_config: Mapping[str, Any], *,
                progress: Progress | None = None, dtype: str = "float32",
                place: weight_formats.Place | None = None, layers: int | None = None) -> LlamaParams:
    """Every weight of the directory's safetensors held as ``dtype`` (a held dtype of `weight_formats`),
    converted (and put where ``place`` says) one tensor at a time (`weight_formats.held`); with
    ``layers``, only the first ``layers`` decoder layers' (and the embedding, norm and head)."""
    arch = architecture(hf_config)
    biased = arch in _BIASED or bool(hf_config.get("attention_bias"))
    tied = bool(hf_config.get("tie_word_embeddings", False))
    q_rows, kv_rows = config.n_heads * config.head_dim, config.n_kv_heads * config.head_dim
    layer_shapes = {
        "input_layernorm.weight": ("attn_norm", (config.dim,)),
        "self_attn.q_proj.weight": ("wq", (q_rows, config.dim)),
        "self_attn.k_proj.weight": ("wk", (kv_rows, config.dim)),
        "self_attn.v_proj.weight": ("wv", (kv_rows, config.dim)),
        "self_attn.o_proj.weight": ("wo", (config.dim, q_rows)),
        "post_attention_layernorm.weight": ("ffn_norm", (config.dim,)),
        "mlp.gate_proj.weight": ("w_gate", (config.ffn_dim, config.dim)),
        "mlp.up_proj.weight": ("w_up", (config.ffn_dim, config.dim)),
        "mlp.down_proj.weight": ("w_down", (config.dim, config.ffn_dim)),
    }
    if biased:
        layer_shapes |= {"self_attn.q_proj.bias": ("bq", (q_rows,)), "self_attn.k_proj.bias": ("bk", (kv_rows,)),
                         "self_attn.v_proj.bias": ("bv", (kv_rows,))}
    if arch in _HEAD_NORMS:
        layer_shapes |= {"self_attn.q_norm.weight": ("q_norm", (config.head_dim,)),
                         "self_attn.k_norm.weight": ("k_norm", (config.head_dim,))}
    expected = {"model.embed_tokens.weight": ("embed", (config.vocab_size, config.dim)),
                "model.norm.weight": ("norm", (config.dim,))}
    if not tied:
        expected["lm_head.weight"] = ("lm_head", (config.vocab_size, config.dim))
    n_layers = config.n_layers if layers is None else min(layers, config.n_layers)
    for i in range(n_layers):
        expected |= {f"model.layers.{i}.{name}": (f"{i}.{field}", shape) for name, (field, shape) in
                     layer_shapes.items()}
    loaded: dict[str, Weight] = {}

    def keep(name: str) -> bool:  # every tensor of a whole load, so that an unexpected one is refused
        layer = _layer(name)
        return layers is None or layer is None or layer < n_layers

    for name, tensor in _tensors(_weight_files(directory), keep):
        if name not in expected:
            if name == "lm_head.weight" and tied:
                continue
            if name.endswith("rotary_emb.inv_freq"):
                continue
            raise ValueError(f"{directory}: unexpected tensor {name!r} for {arch}")
        field, shape = expected[name]
        if tuple(tensor.shape) != shape:
            raise ValueError(f"{directory}: tensor {name!r} has shape {tuple(tensor.shape)}, expected {shape}")
        loaded[field] = weight_formats.held(field.rpartition(".")[2], tensor, dtype, place)
        if progress is not None:
            progress(len(loaded), len(expected))
    missing = [name for name, (field, _) in expected.items() if field not in loaded]
    if missing:
        raise ValueError(f"{directory}: missing tensors {', '.join(missing[:4])}{' …' if len(missing) > 4 else ''}")
    decoder = tuple(LayerParams(**{field: loaded[f"{i}.{field}"] for field, _ in layer_shapes.values()})
                    for i in range(n_layers))
    return weight_formats.with_head(LlamaParams(embed=loaded["embed"], layers=decoder, norm=loaded["norm"],
                                                lm_head=loaded.get("lm_head")), dtype)
