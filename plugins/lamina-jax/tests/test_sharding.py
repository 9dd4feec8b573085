"""Tensor parallelism: the layout over a mesh, logits as on one device, and the collectives a step runs."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import attrs
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lamina_jax import sharding
from lamina_jax.model.llama import Int8Weight, decode, init_cache, prefill
from lamina_jax.model_runner import ModelRunner
from lamina_jax.options import JaxOptions
from lamina_jax.testing import cpu_kernels_absent, device_counts, random_weights, tiny_config, to_params
from lamina_jax.weight_formats import cast
from lamina_jax.weights.model_files import open_model

CONFIG = attrs.evolve(tiny_config(), vocab_size=260)
"""2 KV heads: split on 2 devices, whole on each of 4; a vocabulary that 2 and 4 divide."""
LOGIT_TOLERANCE = 1e-4


def split(item: object) -> tuple[int, ...]:
    """The dimensions of an array (or a sharding) split over the mesh."""
    spec = getattr(item, "sharding", item).spec
    return tuple(d for d, axis in enumerate(spec) if axis is not None)


def test_options_name_what_cannot_be_split() -> None:
    with pytest.raises(ValueError, match="devices lists 1 devices but tensor_parallel is 2"):
        JaxOptions(tensor_parallel=2, devices=(0,))
    with pytest.raises(ValueError, match=r"devices \[0, 0\] must be distinct indices"):
        sharding.make_mesh(2, (0, 0))


@pytest.mark.skipif(cpu_kernels_absent(), reason="without the ggml kernel the q4_1 formats are refused before that")
def test_the_q4_1_formats_are_not_split() -> None:
    with pytest.raises(ValueError, match="'q4_1-f32' runs a native kernel on one device"):
        JaxOptions(tensor_parallel=2, weights_dtype="q4_1-f32")


@pytest.mark.parametrize("devices", device_counts(2, 4))
def test_heads_split_where_the_kv_heads_divide_and_the_mlp_and_vocabulary_always(devices: int) -> None:
    mesh = sharding.make_mesh(devices)
    params = sharding.shard_params(cast(to_params(random_weights(CONFIG)), "int8"), CONFIG, mesh)
    layer = params.layers[0]
    heads = (0,) if devices == 2 else ()
    assert split(layer.wq.q) == heads and split(layer.wq.row) == heads and split(layer.wk.q) == heads
    assert split(layer.wo.q) == tuple(d + 1 for d in heads) and split(layer.wo.col) == heads
    assert split(layer.w_gate.q) == (0,) and split(layer.w_gate.row) == (0,) and split(layer.w_gate.col) == ()
    assert split(layer.w_down.q) == (1,) and split(layer.w_down.col) == (0,) and split(layer.w_down.row) == ()
    assert split(layer.attn_norm) == () and split(params.embed.q) == (0,) and split(params.lm_head.q) == (0,)
    # each device holds 1/devices of the MLP
    assert layer.w_up.q.addressable_shards[0].data.shape == (CONFIG.ffn_dim // devices, CONFIG.dim)
    cache = sharding.cache_shardings(init_cache(CONFIG, num_blocks=8, block_size=4, dtype="int8"), CONFIG, mesh)
    kv_heads = (1,) if devices == 2 else ()
    assert split(cache.k[0]) == kv_heads and split(cache.v_scale[0]) == kv_heads


@pytest.mark.parametrize("devices", device_counts(2))
def test_a_dimension_that_does_not_divide_stays_whole(devices: int) -> None:
    odd = attrs.evolve(CONFIG, vocab_size=259, ffn_dim=127)
    shardings = sharding.param_shardings(to_params(random_weights(odd)), odd, sharding.make_mesh(devices))
    assert split(shardings.embed) == () and split(shardings.layers[0].w_up) == ()
    assert split(shardings.layers[0].wq) == (0,)


def _steps(params: object, cache: object, config: object) -> np.ndarray:
    """Logits of a 21-token prompt's prefill and of 6 decode steps beside a padding row."""
    prompt = jnp.arange(10, 31, dtype=jnp.int32)
    table = jnp.arange(8, dtype=jnp.int32)
    logits, cache = prefill(params, cache, jnp.pad(prompt, (0, 11)), 21, table, 0, config=config)
    rows, token = [logits], jnp.argmax(logits)
    for step in range(6):
        out, cache = decode(params, cache, jnp.stack([token, 0]).astype(jnp.int32), jnp.stack([table, table]),
                            jnp.array([21 + step, -1], jnp.int32), config=config)
        rows.append(out[0])
        token = jnp.argmax(out[0])
    return np.stack([np.asarray(row) for row in rows])


@pytest.mark.parametrize("devices", device_counts(2, 4))
@pytest.mark.parametrize(("weights", "kv"), [("float32", "float32"), ("bfloat16", "bfloat16"), ("int8", "int8")])
def test_prefill_and_decode_logits_match_one_device(devices: int, weights: str, kv: str) -> None:
    params = cast(to_params(random_weights(CONFIG)), weights)
    one = _steps(params, init_cache(CONFIG, num_blocks=16, block_size=4, dtype=kv), CONFIG)
    mesh = sharding.make_mesh(devices)
    config = attrs.evolve(CONFIG, tensor_parallel=devices)
    cache = jax.device_put(init_cache(CONFIG, num_blocks=16, block_size=4, dtype=kv),
                           sharding.cache_shardings(init_cache(CONFIG, num_blocks=16, block_size=4, dtype=kv),
                                                    CONFIG, mesh))
    split = _steps(sharding.shard_params(params, CONFIG, mesh), cache, config)
    assert np.abs(split - one).max() <= LOGIT_TOLERANCE * max(1.0, np.abs(one).max())
    assert (split.argmax(-1) == one.argmax(-1)).all()


_COLLECTIVE = re.compile(r"= \w+\[([0-9,]*)\][^=\n]* (?:all-gather|all-reduce|all-to-all|reduce-scatter|"
                         r"collective-permute)(?:-start)?\(")


@pytest.mark.parametrize("devices", device_counts(2, 4))
def test_a_decode_step_moves_activations_and_logits_between_devices_never_weights_or_the_cache(devices: int) -> None:
    """Each collective of the compiled step carries at most a batch of logits: a gathered weight
    (the MLP's 128 x 64) or KV pool (64 blocks x 2 heads x 4 x 16) would be larger."""
    config = attrs.evolve(CONFIG, n_layers=1)
    runner = ModelRunner(to_params(random_weights(config)), config, num_blocks=64, block_size=4, max_batch=4,
                         max_blocks_per_seq=16, prefill_chunk=16, max_prefills=2, mesh=sharding.make_mesh(devices))
    batch, greedy, top = runner._sampling([None] * 4)
    text = runner._decode_step.lower(runner.params, runner.cache, np.zeros(4, np.int32),
                                     np.zeros((4, runner.table_width), np.int32), np.full(4, -1, np.int32), batch,
                                     greedy, top, config=runner.config).compile().as_text()
    sizes = [int(np.prod([int(d) for d in dims.split(",") if d])) for dims in _COLLECTIVE.findall(text)]
    assert sizes, "a split model sums its partial products across devices"
    assert max(sizes) <= 4 * config.vocab_size, sorted(sizes)[-5:]
    assert split(runner.cache.k[0]) == ((1,) if devices == 2 else ())


@pytest.mark.parametrize("devices", device_counts(2))
def test_the_runner_keeps_its_layout_across_steps_and_after_a_reset(devices: int) -> None:
    config = CONFIG
    runner = ModelRunner(to_params(random_weights(config)), config, num_blocks=32, block_size=4, max_batch=2,
                         max_blocks_per_seq=16, prefill_chunk=16, max_prefills=2, mesh=sharding.make_mesh(devices))
    layout = jax.tree.map(lambda a: a.sharding, runner.cache)
    runner.precompile()
    assert jax.tree.map(lambda a: a.sharding, runner.cache) == layout
    runner.reset_cache()
    assert jax.tree.map(lambda a: a.sharding, runner.cache) == layout
    assert isinstance(runner.params.layers[0].wq, jax.Array) and not isinstance(runner.params.embed, Int8Weight)


@pytest.mark.parametrize("devices", device_counts(2))
@pytest.mark.parametrize("fmt", ["model.gguf", "hf"])
@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_weights_are_laid_out_tensor_by_tensor_as_they_are_read(devices: int, fmt: str, dtype: str) -> None:
    """Each tensor goes to its place over the mesh as it is read: the layout `param_shardings` gives,
    the arrays of a load on one device."""
    files = open_model(Path(__file__).parent / "data" / "models" / "llama" / fmt)
    mesh = sharding.make_mesh(devices)
    placed = files.load_params(dtype=dtype, place=functools.partial(sharding.place_field, config=files.config,
                                                                     mesh=mesh))
    one = files.load_params(dtype=dtype)
    layout = sharding.param_shardings(one, files.config, mesh)
    assert jax.tree.leaves(jax.tree.map(lambda a: a.sharding, placed)) == jax.tree.leaves(layout)
    assert split(placed.layers[0].w_up.q if dtype == "int8" else placed.layers[0].w_up) == (0,)
    for got, want in zip(jax.tree.leaves(placed), jax.tree.leaves(one), strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
