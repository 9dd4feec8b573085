"""Tensor parallelism: the weights and the KV cache laid out over a one-axis mesh of devices.

The layout is Megatron's, as vLLM and tpu-inference shard a Llama: the Q, K, V projections and the
MLP's gate and up projections split by output features (attention by head), the output and down
projections by input features, so each device computes its heads and its share of the MLP and
one sum across devices closes each half of a block; the embedding and the output head split by
vocabulary entry; the KV cache by KV head. A dimension that does not divide by the device count
stays whole on every device: attention (weights and cache) is replicated when the KV heads do
not divide (SmolLM2's 3 KV heads on 2 or 4 devices), as vLLM replicates KV heads.

The arrays are placed with `NamedSharding` and the steps are ordinary `jax.jit` functions: XLA's
SPMD partitioner propagates the layout through the model and inserts the collectives, so the
model code is the same for one device and for many.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeVar

import attrs
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from lamina_jax.model.config import LlamaConfig
from lamina_jax.model.ggml import GgmlWeight
from lamina_jax.model.llama import Int8Weight, KVCache, LayerParams, LlamaParams, Weight

AXIS = "model"
"""The mesh axis the model is split over."""
_COLUMN = ("w_gate", "w_up")
"""Projections split by output feature (their rows)."""
_ROW = ("w_down",)
"""Projections split by input feature (their columns)."""
_ATTENTION_COLUMN = ("wq", "wk", "wv", "bq", "bk", "bv")
_ATTENTION_ROW = ("wo",)


def make_mesh(tensor_parallel: int, devices: Sequence[int] | None = None) -> Mesh:
    """A mesh of ``tensor_parallel`` devices: ``devices`` (indices into `jax.devices`), or the first ones."""
    available = jax.devices()
    chosen = list(devices) if devices is not None else list(range(tensor_parallel))
    if len(chosen) != tensor_parallel:
        raise ValueError(f"devices names {len(chosen)} devices but tensor_parallel is {tensor_parallel}")
    if len(set(chosen)) != len(chosen) or not all(0 <= i < len(available) for i in chosen):
        raise ValueError(f"devices {chosen} must be distinct indices below {len(available)}: this process has "
                         f"{len(available)} {available[0].platform} device(s)")
    return Mesh(np.array([available[i] for i in chosen]), (AXIS,))


def heads_split(config: LlamaConfig, mesh: Mesh) -> bool:
    """Whether attention is split by KV head over ``mesh`` (else each device holds all of it)."""
    return config.n_kv_heads % mesh.size == 0


def _split(mesh: Mesh, length: int, axis: int, ndim: int) -> NamedSharding:
    """Axis ``axis`` of an array of ``ndim`` dimensions split over the mesh where ``length`` divides."""
    spec = [None] * ndim
    if length % mesh.size == 0:
        spec[axis] = AXIS
    return NamedSharding(mesh, PartitionSpec(*spec))


def _weight(mesh: Mesh, w: Weight | None, axis: int | None) -> object:
    """The sharding of ``w``: split along ``axis`` (0: output features, 1: input features), whole if None."""
    if w is None:
        return None
    if isinstance(w, GgmlWeight):
        raise ValueError("the q4_1 weight formats run a native kernel on one device and cannot be sharded")
    whole = NamedSharding(mesh, PartitionSpec())
    if isinstance(w, Int8Weight):
        if axis is None:
            return Int8Weight(whole, whole, whole)
        scale = _split(mesh, w.shape[axis], 0, 1)
        return Int8Weight(_split(mesh, w.shape[axis], axis, 2), scale if axis == 0 else whole,
                          scale if axis == 1 else whole)
    return whole if axis is None else _split(mesh, w.shape[axis], axis, w.ndim)


def _axis(field: str, split_heads: bool) -> int | None:
    """The axis the weight of `LlamaParams` or `LayerParams` field ``field`` is split along: 0 (output
    features, vocabulary entries), 1 (input features), or None (whole on every device)."""
    if field in ("embed", "lm_head") or field in _COLUMN or (split_heads and field in _ATTENTION_COLUMN):
        return 0
    if field in _ROW or (split_heads and field in _ATTENTION_ROW):
        return 1
    return None


def param_shardings(params: LlamaParams, config: LlamaConfig, mesh: Mesh) -> LlamaParams:
    """A `LlamaParams` of the shardings of ``params``' arrays over ``mesh``."""
    split_heads = heads_split(config, mesh)

    def layer(weights: LayerParams) -> LayerParams:
        return LayerParams(**{f.name: _weight(mesh, getattr(weights, f.name), _axis(f.name, split_heads))
                              for f in attrs.fields(LayerParams)})

    return LlamaParams(embed=_weight(mesh, params.embed, _axis("embed", split_heads)),
                       layers=tuple(layer(weights) for weights in params.layers),
                       norm=_weight(mesh, params.norm, _axis("norm", split_heads)),
                       lm_head=_weight(mesh, params.lm_head, _axis("lm_head", split_heads)))


def place_field(field: str, weight: Weight, *, config: LlamaConfig, mesh: Mesh) -> Weight:
    """One weight, of `LlamaParams` or `LayerParams` field ``field``, laid out over ``mesh`` as
    `param_shardings` lays it out: a loader places each tensor as it reads it, so that no device
    ever holds the whole model."""
    return jax.device_put(weight, _weight(mesh, weight, _axis(field, heads_split(config, mesh))))


def cache_shardings(cache: KVCache, config: LlamaConfig, mesh: Mesh) -> KVCache:
    """A `KVCache` of the shardings of ``cache``'s pools (and scales): split by KV head where attention is."""
    heads = 1 if heads_split(config, mesh) else None

    def pools(arrays: tuple[jax.Array, ...] | None) -> tuple[NamedSharding, ...] | None:
        if arrays is None:
            return None
        return tuple(NamedSharding(mesh, PartitionSpec(*(AXIS if d == heads else None for d in range(a.ndim))))
                     for a in arrays)

    return KVCache(k=pools(cache.k), v=pools(cache.v), k_scale=pools(cache.k_scale), v_scale=pools(cache.v_scale))


def shard_params(params: LlamaParams, config: LlamaConfig, mesh: Mesh) -> LlamaParams:
    """``params`` placed over ``mesh`` (`param_shardings`)."""
    return jax.device_put(params, param_shardings(params, config, mesh))


def replicated(mesh: Mesh) -> NamedSharding:
    """Every device holds the whole array."""
    return NamedSharding(mesh, PartitionSpec())


_Shape = TypeVar("_Shape")


def place_weights(params: LlamaParams, config: LlamaConfig,
                  shape_weights: Mapping[_Shape, tuple[LlamaParams, LlamaConfig]], mesh: Mesh,
                  ) -> tuple[LlamaParams, dict[_Shape, tuple[LlamaParams, LlamaConfig]]]:
    """``params`` and the other formats of ``shape_weights`` laid out over ``mesh``, a set several
    shapes share placed once; arrays already laid out so stay where they are."""
    placed: dict[int, LlamaParams] = {}

    def place(weights: LlamaParams, config: LlamaConfig) -> LlamaParams:
        if id(weights) not in placed:
            placed[id(weights)] = shard_params(weights, config, mesh)
        return placed[id(weights)]

    return place(params, config), {shape: (place(w, c), c) for shape, (w, c) in shape_weights.items()}
