"""Which format the weights are served in for each compiled shape, chosen by measuring this machine.

A format is the dtype the weights are held in and the dtype their products compute in:
``float32``; ``bfloat16`` (native bf16 dots accumulating in float32); ``bfloat16-f32`` (bfloat16
weights converted to float32 inside the product); ``int8`` (`Int8Weight`: int8 with row and column
scales, converted to float32 inside the product, which reads a quarter of float32's bytes in a
one-row decode); ``q4_1`` (`GgmlWeight`: the decoder's matrices in ggml's Q4_1 blocks and the
output head in Q8_0, the formats of the SmolLM2 GGUF, multiplied by ggml's own kernels, which
round the activations to 8 bits as llama.cpp does); ``q4_1-f32`` (the same blocks against float32
activations, decoded inside the product: for a model whose matrices are such blocks, a GGUF's own,
its products are float32's up to the order of the sums). Both need the natively built kernel, see
`lamina_jax.model.ggml`. Decode with a few rows is bound by memory
bandwidth, a big batch or a prompt chunk by the matrix kernels, and which format is fastest at
which size differs from one CPU to the next (bf16 dots are native on CPUs with AVX-512 BF16,
slow on others). With ``weights_dtype = "auto"`` the executor reads a probe of the model (its
first decoder layers, `probe_layers`, and its head) in float32, times their projections in each
of the `auto` formats at every row count it compiles (`measure`), and then reads the model once
in each weight dtype some shape's fastest format holds. ``int8`` is left out of ``auto``: it passes the perplexity gate but changes far more greedy tokens than the bfloat16
formats (``benchmarks/weights_dtype.py``), so it is served only when a stack file asks for it.
So is ``q4_1``: its perplexity is within the gate (its weights are the GGUF's own; only the
activations are rounded to 8 bits, as llama.cpp does) but about as few greedy continuations as
int8's match float32's. ``auto`` times ``q4_1-f32`` only for a model whose matrices the blocks hold
exactly (`exact_in_blocks` on the probe, and a file that stores the rest in such blocks), so it
changes no number.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import attrs
import jax
import jax.numpy as jnp
import numpy as np

from lamina_jax.model import cpu_kernels, ggml
from lamina_jax.model.config import LlamaConfig
from lamina_jax.model.llama import Int8Weight, LayerParams, LlamaParams, Weight, linear, quantize_int8, rms_norm

FORMATS: dict[str, tuple[str, str | None]] = {
    "float32": ("float32", None),
    "bfloat16": ("bfloat16", None),
    "bfloat16-f32": ("bfloat16", "float32"),
    "int8": ("int8", None),
    "q4_1": ("q4_1", None),
    "q4_1-f32": ("q4_1", "float32"),
}
"""Format name → (dtype the weights are held in, `LlamaConfig.matmul_dtype`)."""
NOT_AUTO = ("int8", "q4_1")
"""Formats ``weights_dtype = "auto"`` never chooses."""


_P = TypeVar("_P", LlamaParams, LayerParams)


def servable(params: LlamaParams, fmt: str) -> bool:
    """Whether ``params`` can be served in ``fmt`` here: the ``q4_1`` formats need their kernel (loaded
    only when asked about) and matrices whose rows split into its blocks."""
    return FORMATS[fmt][0] != "q4_1" or (cpu_kernels.available()
                                         and all(ggml.quantizable(w) for w in _matrices(params)))


def exact_in_blocks(params: LlamaParams) -> bool:
    """Whether the ``q4_1`` formats' blocks hold ``params``' matrices exactly (`ggml.lossless`): a GGUF's
    decoder matrices are Q4_1 and its output head Q8_0."""
    return (ggml.lossless(params.head, "q8_0")
            and all(ggml.lossless(w, "q4_1") for layer in params.layers for w in _matrices(layer)))


def _matrices(params: LlamaParams | LayerParams) -> list[jax.Array]:
    return [w for w in jax.tree.leaves(params) if w.ndim == 2]


def usable(params: LlamaParams) -> tuple[str, ...]:
    """The formats ``params`` can be served in here."""
    return tuple(fmt for fmt in FORMATS if servable(params, fmt))


def auto(params: LlamaParams, stored_in_blocks: bool = True) -> tuple[str, ...]:
    """The formats ``weights_dtype = "auto"`` times for ``params`` (a model or a probe of one, whose
    file ``stored_in_blocks`` or not): ``q4_1-f32`` only where it is exact."""
    return tuple(fmt for fmt in FORMATS if fmt not in NOT_AUTO and servable(params, fmt)
                 and (fmt != "q4_1-f32" or (stored_in_blocks and exact_in_blocks(params))))


def cast(params: _P, dtype: str) -> _P:
    """``params`` with every array in ``dtype``, each as `held` converts it, the tied output head
    made its own where ``dtype`` holds it apart (`with_head`)."""
    if isinstance(params, LayerParams):
        return _cast_fields(params, dtype)
    head = None if params.lm_head is None else held("lm_head", params.lm_head, dtype)
    return with_head(LlamaParams(embed=held("embed", params.embed, dtype), norm=held("norm", params.norm, dtype),
                                 lm_head=head, layers=tuple(_cast_fields(layer, dtype) for layer in params.layers)),
                     dtype)


def _cast_fields(layer: LayerParams, dtype: str) -> LayerParams:
    return LayerParams(**{f.name: None if (a := getattr(layer, f.name)) is None else held(f.name, a, dtype)
                          for f in attrs.fields(LayerParams)})


Place = Callable[[str, Weight], Weight]
"""Where a loader puts a weight it holds: ``(field, weight) → the weight placed`` (see
`lamina_jax.sharding.place_field`)."""


def held(field: str, array: jax.Array | np.ndarray, dtype: str, place: Place | None = None) -> Weight:
    """One weight, the `LlamaParams` or `LayerParams` field ``field``, as ``dtype`` holds it: a loader
    converts each tensor as it reads it, so no float32 copy of the whole model is made first.
    ``int8``: every matrix quantized (`quantize_int8`), the norms and biases kept in float32;
    ``q4_1``: the decoder's matrices in Q4_1 blocks and an untied output head in Q8_0, the
    embedding table (only gathered from) and the vectors kept as they are; otherwise ``dtype``.
    Then ``place(field, weight)``, where given."""
    weight = _held(field, array, dtype)
    return weight if place is None else place(field, weight)


def _held(field: str, array: jax.Array | np.ndarray, dtype: str) -> Weight:
    if dtype in ("int8", "q4_1"):
        array = jnp.asarray(array, jnp.float32)
        if array.ndim != 2 or (dtype == "q4_1" and field == "embed"):
            return array
        if dtype == "int8":
            return quantize_int8(array)
        return ggml.quantize(array, "q8_0" if field == "lm_head" else "q4_1")
    return jnp.asarray(array, dtype)


def with_head(params: LlamaParams, dtype: str) -> LlamaParams:
    """``params``, held as ``dtype``, with the tied output head made its own where ``q4_1`` keeps the
    embedding table as it is and the head in Q8_0 blocks."""
    if dtype == "q4_1" and params.lm_head is None:
        return attrs.evolve(params, lm_head=ggml.quantize(params.embed, "q8_0"))
    return params


def name(params: LlamaParams, config: LlamaConfig) -> str:
    """The format ``params`` (held by `cast`) and ``config`` (by `configure`) serve in."""
    head = params.head
    held = "q4_1" if isinstance(head, ggml.GgmlWeight) else "int8" if isinstance(head, Int8Weight) else str(head.dtype)
    return next(fmt for fmt, pair in FORMATS.items() if pair == (held, config.matmul_dtype))


def configure(config: LlamaConfig, fmt: str) -> LlamaConfig:
    """``config`` with the matrix-product dtype of format ``fmt``."""
    return attrs.evolve(config, matmul_dtype=FORMATS[fmt][1])


PROBE_BYTES = 96 * 2**20
"""Float32 bytes of decoder-layer matrices `measure` times together: more than the CPU's caches
hold, as when serving, with the cost of a call spread over them (one small layer at one row would
time mostly the call). Eight of SmolLM2-135M's layers; one of a 7B model's."""


def probe_layers(config: LlamaConfig) -> int:
    """The decoder layers a probe holds: the fewest (at least one) whose matrices make `PROBE_BYTES`."""
    attention = config.dim * config.head_dim * 2 * (config.n_heads + config.n_kv_heads)
    per_layer = 4 * (attention + 3 * config.dim * config.ffn_dim)
    return min(config.n_layers, -(-PROBE_BYTES // per_layer))


def probe(params: LlamaParams, config: LlamaConfig) -> LlamaParams:
    """``params`` cut to the layers a probe holds (`probe_layers`), as `measure` takes them."""
    return attrs.evolve(params, layers=params.layers[:probe_layers(config)])


ROUNDS = 3
"""Rounds of timing; the order of the formats is reversed every other round."""
CALLS = 2
"""Timed calls of a format in a round, after one untimed call: a call right after another
format's runs slow (the other's weights fill the caches), so a format's calls are timed together."""
DROP_BEHIND = 2.0
"""A format this many times slower than the fastest after a round is not timed again at that row count."""


@functools.partial(jax.jit, static_argnames=("matmul_dtype",))
def _layer_products(layers: tuple[LayerParams, ...], x: jax.Array, matmul_dtype: str | None) -> jax.Array:
    """The seven matrix products of each decoder layer on ``x [rows, dim]``, one layer after another
    (their shapes, not the model: no attention, and an unweighted RMS norm after each half layer
    keeps the values those of a real model's, whatever the depth)."""
    for layer in layers:
        q, k, v = (linear(x, w, matmul_dtype) for w in (layer.wq, layer.wk, layer.wv))
        h = rms_norm(linear(q, layer.wo, matmul_dtype) + k.sum() + v.sum(), 1.0, 1e-6)
        up = jax.nn.silu(linear(h, layer.w_gate, matmul_dtype)) * linear(h, layer.w_up, matmul_dtype)
        x = rms_norm(linear(up, layer.w_down, matmul_dtype), 1.0, 1e-6)
    return x


@functools.partial(jax.jit, static_argnames=("matmul_dtype",))
def _head_product(head: jax.Array, x: jax.Array, matmul_dtype: str | None) -> jax.Array:
    return linear(x, head, matmul_dtype)


def _seconds(call: Callable[[], jax.Array]) -> list[float]:
    """`CALLS` timings of ``call``, after one untimed call."""
    call().block_until_ready()
    times = []
    for _ in range(CALLS):
        started = time.perf_counter()
        call().block_until_ready()
        times.append(time.perf_counter() - started)
    return times


def _time_format(held: LlamaParams, x: jax.Array, matmul_dtype: str | None) -> tuple[list[float], list[float]]:
    """`_seconds` of ``held``'s layers' products on ``x``, then of its head's."""
    return (_seconds(lambda: _layer_products(held.layers, x, matmul_dtype)),
            _seconds(lambda: _head_product(held.head, x, matmul_dtype)))


def measure(probe: LlamaParams, row_counts: Sequence[int], formats: Sequence[str],
            n_layers: int) -> dict[int, dict[str, float]]:
    """Estimated seconds of one step's matrix products, by row count and format: the median time of
    the products of ``probe``'s layers (the first of a model's, `probe`) scaled to the model's
    ``n_layers``, plus the output head's. Each
    round times every format in turn, `CALLS` calls at a time (`_seconds`), in the reverse order
    of the round before, so that a drift of the machine's speed meets all of them alike; a format
    far behind after a round (`DROP_BEHIND`) is not timed again at that row count."""
    depth = n_layers / len(probe.layers)
    held = {FORMATS[fmt][0]: cast(probe, FORMATS[fmt][0]) for fmt in formats}
    timings: dict[int, dict[str, float]] = {}
    for rows in row_counts:
        x = jnp.asarray(np.random.default_rng(0).standard_normal((rows, probe.embed.shape[1]), np.float32))
        times: dict[str, tuple[list[float], list[float]]] = {fmt: ([], []) for fmt in formats}
        estimate: dict[str, float] = {}
        racing = list(formats)
        for round_ in range(ROUNDS):
            for fmt in racing if round_ % 2 == 0 else racing[::-1]:
                layer_times, head_times = _time_format(held[FORMATS[fmt][0]], x, FORMATS[fmt][1])
                times[fmt][0].extend(layer_times)
                times[fmt][1].extend(head_times)
            estimate = {fmt: float(np.median(times[fmt][0]) * depth + np.median(times[fmt][1]))
                        for fmt in formats}
            best = min(estimate[fmt] for fmt in racing)
            racing = [fmt for fmt in racing if estimate[fmt] <= DROP_BEHIND * best]
        timings[rows] = estimate
    return timings


def fastest(timings: dict[int, dict[str, float]]) -> dict[int, str]:
    """The fastest format at each row count."""
    return {rows: min(by_format, key=by_format.__getitem__) for rows, by_format in timings.items()}
