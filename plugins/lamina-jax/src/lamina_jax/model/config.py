"""Hyperparameters of a Llama-family decoder."""

import attrs

from lamina_jax.model.rope import RopeScaling


@attrs.frozen(kw_only=True)
class LlamaConfig:
    """Shape and numeric constants of a Llama decoder; hashable, so it can be a static jit argument."""

    vocab_size: int
    dim: int
    ffn_dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    norm_eps: float
    rope_base: float
    context_length: int
    rope_scaling: RopeScaling = RopeScaling()
    sliding_window: int | None = None
    """Keys a query sees, itself included (Mistral's sliding-window attention); ``None``: all before it."""
    matmul_dtype: str | None = None
    """The dtype matrix products compute in: ``None``, the weights' own (bfloat16 weights run
    native bf16 dots accumulating in float32); ``"float32"``, low-precision weights converted to
    float32 inside the product (memory-bound products then read half the bytes)."""
    tensor_parallel: int = 1
    """Devices the weights and the KV cache are split over (`lamina_jax.sharding`); above one, decode
    attention runs in JAX, which XLA partitions, rather than in the native kernel, which it cannot."""

    def __attrs_post_init__(self) -> None:
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads ({self.n_heads}) is not a multiple of n_kv_heads ({self.n_kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim ({self.head_dim}) must be even for rotary embeddings")
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"sliding_window ({self.sliding_window}) must be at least 1")
