"""Which dtype the weights are held in for each compiled shape, chosen by measuring this machine.

Decode with a few rows is bound by memory bandwidth, a big batch or a prompt chunk by the
matrix kernels, and which format is faster at which size differs from one CPU to the next
(bfloat16 dots are native on CPUs with AVX-512 BF16, slow on others). With ``weights_dtype =
"auto"`` the executor times one decoder layer's projections in float32 and in bfloat16
(float32 accumulation) at every row count it compiles, and serves each shape with the faster
format; both copies are kept only when both are chosen.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from lamina_jax.model.llama import LayerParams, LlamaParams, linear

FORMATS = ("float32", "bfloat16")
ROUNDS = 5


def cast(params: LlamaParams, dtype: str) -> LlamaParams:
    """``params`` with every array in ``dtype``."""
    return jax.tree.map(lambda a: a.astype(dtype), params)


@jax.jit
def _projections(layer: LayerParams, x: jax.Array) -> jax.Array:
    """The seven matrix products of a decoder layer on ``x [rows, dim]`` (the shapes, not the model)."""
    attn = linear(x, layer.wq) + linear(x, layer.wk).sum() + linear(x, layer.wv).sum()
    h = linear(attn, layer.wo)
    return linear(jax.nn.silu(linear(h, layer.w_gate)) * linear(h, layer.w_up), layer.w_down)


def _seconds(layer: LayerParams, rows: int) -> float:
    """Median time of `_projections` on ``rows`` rows, after one untimed (compiling) call."""
    x = jnp.asarray(np.random.default_rng(0).standard_normal((rows, layer.wq.shape[1]), np.float32))
    _projections(layer, x).block_until_ready()
    times = []
    for _ in range(ROUNDS):
        started = time.perf_counter()
        _projections(layer, x).block_until_ready()
        times.append(time.perf_counter() - started)
    return float(np.median(times))


def measure(params: LlamaParams, row_counts: Sequence[int]) -> dict[int, dict[str, float]]:
    """Seconds per call of one layer's projections, by row count and format."""
    layers = {dtype: cast(params.layers[0], dtype) for dtype in FORMATS}
    return {rows: {dtype: _seconds(layers[dtype], rows) for dtype in FORMATS} for rows in row_counts}


def fastest(timings: dict[int, dict[str, float]]) -> dict[int, str]:
    """The faster format at each row count."""
    return {rows: min(by_format, key=by_format.__getitem__) for rows, by_format in timings.items()}
