"""Which format the weights are served in for each compiled shape, chosen by measuring this machine.

A format is the dtype the weights are held in and the dtype their products compute in:
``float32``; ``bfloat16`` (native bf16 dots accumulating in float32); ``bfloat16-f32`` (bfloat16
weights converted to float32 inside the product). Decode with a few rows is bound by memory
bandwidth, a big batch or a prompt chunk by the matrix kernels, and which format is fastest at
which size differs from one CPU to the next (bf16 dots are native on CPUs with AVX-512 BF16,
slow on others). With ``weights_dtype = "auto"`` the executor times one decoder layer's
projections in every format at every row count it compiles and serves each shape in the
fastest; a weight dtype is held only if some shape uses it.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence

import attrs
import jax
import jax.numpy as jnp
import numpy as np

from lamina_jax.model.config import LlamaConfig
from lamina_jax.model.llama import LayerParams, LlamaParams, linear

FORMATS: dict[str, tuple[str, str | None]] = {
    "float32": ("float32", None),
    "bfloat16": ("bfloat16", None),
    "bfloat16-f32": ("bfloat16", "float32"),
}
"""Format name → (dtype the weights are held in, `LlamaConfig.matmul_dtype`)."""
ROUNDS = 5


def cast(params: LlamaParams, dtype: str) -> LlamaParams:
    """``params`` with every array in ``dtype``."""
    return jax.tree.map(lambda a: a.astype(dtype), params)


def configure(config: LlamaConfig, fmt: str) -> LlamaConfig:
    """``config`` with the matrix-product dtype of format ``fmt``."""
    return attrs.evolve(config, matmul_dtype=FORMATS[fmt][1])


@functools.partial(jax.jit, static_argnames=("matmul_dtype",))
def _projections(layer: LayerParams, x: jax.Array, matmul_dtype: str | None) -> jax.Array:
    """The seven matrix products of a decoder layer on ``x [rows, dim]`` (their shapes, not the model)."""
    q, k, v = (linear(x, w, matmul_dtype) for w in (layer.wq, layer.wk, layer.wv))
    h = linear(q, layer.wo, matmul_dtype) + k.sum() + v.sum()
    up = jax.nn.silu(linear(h, layer.w_gate, matmul_dtype)) * linear(h, layer.w_up, matmul_dtype)
    return linear(up, layer.w_down, matmul_dtype)


def _seconds(layer: LayerParams, rows: int, matmul_dtype: str | None) -> float:
    """Median time of `_projections` on ``rows`` rows, after one untimed (compiling) call."""
    x = jnp.asarray(np.random.default_rng(0).standard_normal((rows, layer.wq.shape[1]), np.float32))
    _projections(layer, x, matmul_dtype).block_until_ready()
    times = []
    for _ in range(ROUNDS):
        started = time.perf_counter()
        _projections(layer, x, matmul_dtype).block_until_ready()
        times.append(time.perf_counter() - started)
    return float(np.median(times))


def measure(params: LlamaParams, row_counts: Sequence[int]) -> dict[int, dict[str, float]]:
    """Seconds per call of one layer's projections, by row count and format."""
    layers = {dtype: cast(params.layers[0], dtype) for dtype, _ in FORMATS.values()}
    return {rows: {fmt: _seconds(layers[dtype], rows, mm) for fmt, (dtype, mm) in FORMATS.items()}
            for rows in row_counts}


def fastest(timings: dict[int, dict[str, float]]) -> dict[int, str]:
    """The fastest format at each row count."""
    return {rows: min(by_format, key=by_format.__getitem__) for rows, by_format in timings.items()}
