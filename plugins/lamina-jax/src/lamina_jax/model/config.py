"""Hyperparameters of a Llama-family decoder."""

import attrs


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
    matmul_dtype: str | None = None
    """The dtype matrix products compute in: ``None``, the weights' own (bfloat16 weights run
    native bf16 dots accumulating in float32); ``"float32"``, low-precision weights converted to
    float32 inside the product (memory-bound products then read half the bytes)."""

    def __attrs_post_init__(self) -> None:
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads ({self.n_heads}) is not a multiple of n_kv_heads ({self.n_kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim ({self.head_dim}) must be even for rotary embeddings")
