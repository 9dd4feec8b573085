"""Device side of the engine: the jitted prefill and decode steps with sampling, in few shapes.

Every call has one of a small, fixed set of shapes, so that all of them can be compiled before
the server reports ready (`ModelRunner.precompile`) and serving compiles nothing:

- decode: the batch padded to a power of two up to ``max_batch``; block tables always as wide as
  the longest sequence may need (attention loops over the blocks in use, so width costs nothing);
- prefill: the packed chunk tokens padded to a power of two from 16 up to ``prefill_chunk``; the
  packed block table always ``table_capacity`` entries and the sequences always ``max_prefills``
  rows (the scheduler keeps within both).

Sampling runs inside the same jitted call as the model, so only the chosen tokens and their
logprobs travel back to the host. Whether a batch is all greedy and whether any row wants top
logprobs are traced flags chosen by ``lax.cond``, not compiled variants.

Nothing here is CPU-specific: the same code runs on any JAX backend.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from collections.abc import Sequence as Seq

import attrs
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh

from lamina_hookspecs.types import MAX_TOP_LOGPROBS
from lamina_jax import sharding
from lamina_jax.model.config import LlamaConfig
from lamina_jax.model.llama import ATTENTION_CHUNK, KVCache, KVDtype, LlamaParams, decode, init_cache, prefill_packed
from lamina_jax.sampling import SampleResult, SamplingBatch, sample, unadjusted
from lamina_jax.scheduler import PrefillWork
from lamina_jax.sequence import Sequence
from lamina_jax.structured_output import fill_mask


SORT_CAP = 256
"""Random rows whose candidates fit in the first ``SORT_CAP`` skip the full-vocabulary sort."""


def bucket(n: int, minimum: int = 1) -> int:
    """The smallest power of two ``>= max(n, minimum)``."""
    return max(minimum, 1 << max(n - 1, 0).bit_length())


@attrs.frozen
class SampledRow:
    """One sampled token on the host, with its logprob and the top alternatives."""

    token: int
    logprob: float
    top_ids: np.ndarray
    top_logprobs: np.ndarray


def _sample(logits: jax.Array, batch: SamplingBatch, all_greedy: jax.Array, want_top: jax.Array) -> SampleResult:
    """`sample` with the greedy-only shortcut and the top logprobs chosen at run time."""
    chosen = lax.cond(all_greedy,
                      lambda: sample(logits, batch, num_top=0, max_top_k=SORT_CAP, all_greedy=True),
                      lambda: sample(logits, batch, num_top=0, max_top_k=SORT_CAP))
    rows = logits.shape[0]
    top_logprobs, top_ids = lax.cond(
        want_top, lambda: tuple(lax.top_k(jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1), MAX_TOP_LOGPROBS)),
        lambda: (jnp.zeros((rows, MAX_TOP_LOGPROBS), jnp.float32), jnp.zeros((rows, MAX_TOP_LOGPROBS), jnp.int32)))
    return attrs.evolve(chosen, top_ids=top_ids, top_logprobs=top_logprobs)


def _prefill_and_sample(params: LlamaParams, cache: KVCache, tokens: jax.Array, positions: jax.Array,
                        rows: jax.Array, table: jax.Array, table_rows: jax.Array, starts: jax.Array,
                        last: jax.Array, batch: SamplingBatch, all_greedy: jax.Array, want_top: jax.Array, *,
                        config: LlamaConfig) -> tuple[SampleResult, KVCache]:
    logits, cache = prefill_packed(params, cache, tokens, positions, rows, table, table_rows, starts, last,
                                   config=config)
    return _sample(logits, batch, all_greedy, want_top), cache


def _decode_and_sample(params: LlamaParams, cache: KVCache, tokens: jax.Array, tables: jax.Array,
                       positions: jax.Array, batch: SamplingBatch, all_greedy: jax.Array, want_top: jax.Array, *,
                       config: LlamaConfig) -> tuple[SampleResult, KVCache]:
    logits, cache = decode(params, cache, tokens, tables, positions, config=config)
    return _sample(logits, batch, all_greedy, want_top), cache


_Step = Callable[..., tuple[SampleResult, KVCache]]


def _jit_step(step: _Step, out_shardings: object = None) -> _Step:
    """``step`` jitted with its configuration static and its cache donated (updated in place)."""
    return jax.jit(step, static_argnames=("config",), donate_argnames=("cache",), out_shardings=out_shardings)


_PREFILL, _DECODE = _jit_step(_prefill_and_sample), _jit_step(_decode_and_sample)
"""The steps on one device; a runner over a mesh jits its own, its outputs laid out as its inputs."""


def pow2_buckets(low: int, high: int) -> list[int]:
    """Every `bucket` value from ``bucket(low)`` up to ``bucket(high)``."""
    sizes = [bucket(low)]
    while sizes[-1] < bucket(high):
        sizes.append(sizes[-1] * 2)
    return sizes


def _adjust_row(adjust: dict[str, np.ndarray], i: int, seq: Sequence, held: Iterable[int]) -> None:
    """Fill row ``i`` of `unadjusted`'s arrays with ``seq``'s penalties and bias, and ``-inf`` for
    the ``held`` ids it may not end on yet."""
    params = seq.sampling
    adjust["adjust"] = np.bool_(True)
    if params.presence_penalty or params.frequency_penalty or params.repetition_penalty != 1.0:
        tokens = seq.tokens
        adjust["history"][i, :len(tokens)] = tokens
        adjust["output_from"][i] = len(seq.prompt_ids)
        adjust["presence"][i], adjust["frequency"][i] = params.presence_penalty, params.frequency_penalty
        adjust["repetition"][i] = params.repetition_penalty
    entries = [*params.logit_bias, *((token, -np.inf) for token in held)]
    adjust["bias_ids"][i, :len(entries)] = [token for token, _ in entries]
    adjust["bias_values"][i, :len(entries)] = [bias for _, bias in entries]


class ModelRunner:
    """Holds the weights and the KV block pools; runs packed prefill chunks or one decode batch.

    :param max_blocks_per_seq: the most blocks one sequence can own (its longest context).
    :param prefill_chunk: the most prompt tokens one prefill call carries.
    :param max_prefills: the most sequences one prefill call carries.
    :param shape_weights: weights and configuration (another format of ``params``, see
        `weight_formats`) for some of the `shapes`.
    :param mesh: devices to split the weights and the KV cache over (`sharding`); ``None``: JAX's
        default device.
    """

    def __init__(self, params: LlamaParams, config: LlamaConfig, *, num_blocks: int, block_size: int,
                 max_batch: int, max_blocks_per_seq: int, prefill_chunk: int, max_prefills: int,
                 kv_dtype: KVDtype = "float32",
                 shape_weights: Mapping[tuple[str, int], tuple[LlamaParams, LlamaConfig]] | None = None,
                 mesh: Mesh | None = None) -> None:
        self.mesh = mesh
        self.devices = 1 if mesh is None else mesh.size
        shape_weights = dict(shape_weights or {})
        if mesh is not None:
            params, shape_weights = sharding.place_weights(params, config, shape_weights, mesh)
        self.params, self.config = params, attrs.evolve(config, tensor_parallel=self.devices)
        self.shape_weights = {shape: (weights, attrs.evolve(cfg, tensor_parallel=self.devices))
                              for shape, (weights, cfg) in shape_weights.items()}
        self.num_blocks, self.block_size, self.max_batch = num_blocks, block_size, max_batch
        self.prefill_chunk, self.max_prefills = prefill_chunk, max_prefills
        self.kv_dtype = kv_dtype
        self._unadjusted: dict[int, dict[str, np.ndarray]] = {}
        """`unadjusted` arrays by row count, built once: a step where no row adjusts sends them as they are."""
        self.table_width = -(-max_blocks_per_seq // ATTENTION_CHUNK) * ATTENTION_CHUNK
        self.table_capacity = 2 * self.table_width
        """Entries of the packed prefill block table: the scheduler packs sequences owning at most this many blocks."""
        self._prefill_step, self._decode_step = _PREFILL, _DECODE
        self.cache = self._new_cache()
        if mesh is not None:
            out_shardings = (sharding.replicated(mesh), sharding.cache_shardings(self.cache, self.config, mesh))
            self._prefill_step = _jit_step(_prefill_and_sample, out_shardings)
            self._decode_step = _jit_step(_decode_and_sample, out_shardings)

    def _new_cache(self) -> KVCache:
        """Zeroed pools, created where they live (split over the mesh, if any)."""
        make = functools.partial(init_cache, self.config, num_blocks=self.num_blocks, block_size=self.block_size,
                                 dtype=self.kv_dtype)
        if self.mesh is None:
            return make()
        return jax.jit(make, out_shardings=sharding.cache_shardings(jax.eval_shape(make), self.config, self.mesh))()

    def reset_cache(self) -> None:
        """Fresh pools after a failed call (a donated cache may be gone)."""
        self.cache = self._new_cache()

    @staticmethod
    def shapes_for(*, max_batch: int, prefill_chunk: int) -> list[tuple[str, int]]:
        """Every (call, padded size) serving can use: decode batch sizes and prefill token counts."""
        return ([("decode", rows) for rows in pow2_buckets(1, max_batch)]
                + [("prefill", tokens) for tokens in pow2_buckets(16, prefill_chunk)])

    def shapes(self) -> list[tuple[str, int]]:
        """`shapes_for` this runner."""
        return self.shapes_for(max_batch=self.max_batch, prefill_chunk=self.prefill_chunk)

    def precompile(self, progress: Callable[[int, int], None] | None = None) -> None:
        """Compile every shape of `shapes` by running it on padding only (which writes nothing to
        the cache); ``progress(done, total)`` after each."""
        shapes = self.shapes()
        for done, (kind, size) in enumerate(shapes, 1):
            if kind == "decode":
                self._decode_call(np.zeros(size, np.int32), np.zeros((size, self.table_width), np.int32),
                                  np.full(size, -1, np.int32), [None] * size)
            else:
                self._prefill_call(self._prefill_arrays(size), [None] * self.max_prefills)
            if progress is not None:
                progress(done, len(shapes))

    def weights_for(self, kind: str, size: int) -> tuple[LlamaParams, LlamaConfig]:
        """The weights and configuration the shape ``(kind, size)`` runs with."""
        return self.shape_weights.get((kind, size), (self.params, self.config))

    def _sampling(self, seqs: Seq[Sequence | None], ahead: Seq[int] = ()) -> tuple[SamplingBatch, np.bool_, bool]:
        """Per-row parameters (``None`` rows are padding; row ``i`` samples its sequence's token ``ahead[i]``
        (default 0) places after the next), whether all rows are greedy, whether any wants top logprobs."""
        rows = len(seqs)
        temperature, top_p, min_p = np.zeros(rows, np.float32), np.ones(rows, np.float32), np.zeros(rows, np.float32)
        top_k, steps = np.zeros(rows, np.int32), np.zeros(rows, np.int32)
        keys = np.zeros((rows, 2), np.uint32)
        adjust = self._unadjusted.setdefault(
            rows, unadjusted(rows, self.table_width * self.block_size, self.config.vocab_size))
        copied = False
        wants_top = False
        for i, seq in enumerate(seqs):
            if seq is None:
                continue
            params = seq.sampling
            temperature[i], top_k[i], top_p[i], min_p[i] = params.temperature, params.top_k, params.top_p, params.min_p
            steps[i] = len(seq.output_ids) + (ahead[i] if ahead else 0)
            keys[i] = seq.key
            wants_top |= params.logprobs and params.top_logprobs > 0
            held = seq.end_ids if len(seq.output_ids) < params.min_tokens else ()
            if params.adjusts_logits or held or seq.matcher is not None:
                if not copied:  # the shared "no adjustment" arrays stay untouched
                    adjust, copied = {key: np.array(value) for key, value in adjust.items()}, True
                if params.adjusts_logits or held:
                    _adjust_row(adjust, i, seq, held)
                if seq.matcher is not None:
                    fill_mask(seq.matcher, adjust["allowed"], i)
                    adjust["guided"] = np.bool_(True)
        batch = SamplingBatch(temperature=temperature, top_k=top_k, top_p=top_p, keys=keys, steps=steps, min_p=min_p,
                              **adjust)
        return batch, (temperature <= 0).all(), wants_top

    def _prefill_arrays(self, num_tokens: int) -> dict[str, np.ndarray]:
        """Padding-only inputs of a prefill call over ``bucket(num_tokens)`` tokens."""
        tokens = np.zeros(bucket(num_tokens, 16), np.int32)
        return {"tokens": tokens, "positions": np.zeros_like(tokens), "rows": np.full_like(tokens, -1),
                "table": np.zeros(self.table_capacity, np.int32),
                "table_rows": np.full(self.table_capacity, -1, np.int32),
                "starts": np.zeros(self.max_prefills, np.int32), "last": np.zeros(self.max_prefills, np.int32)}

    def _prefill_call(self, arrays: dict[str, np.ndarray], seqs: Seq[Sequence | None]) -> SampleResult:
        batch, all_greedy, want_top = self._sampling(seqs)
        params, config = self.weights_for("prefill", len(arrays["tokens"]))
        result, self.cache = self._prefill_step(params, self.cache, batch=batch, all_greedy=all_greedy,
                                                 want_top=want_top, config=config, **arrays)
        return result

    def _decode_call(self, tokens: np.ndarray, tables: np.ndarray, positions: np.ndarray,
                     seqs: Seq[Sequence | None], ahead: Seq[int] = ()) -> SampleResult:
        batch, all_greedy, want_top = self._sampling(seqs, ahead)
        params, config = self.weights_for("decode", len(tokens))
        result, self.cache = self._decode_step(params, self.cache, tokens, tables, positions, batch,
                                                all_greedy, want_top, config=config)
        return result

    def prefill(self, works: Seq[PrefillWork]) -> list[SampledRow | None]:
        """Compute K/V for the chunks of ``works`` in one packed call; sample the next token of each
        work that completes its prompt (``None`` for the others)."""
        if len(works) > self.max_prefills or sum(len(w.seq.blocks) for w in works) > self.table_capacity:
            raise ValueError(f"a prefill call takes at most {self.max_prefills} sequences owning "
                             f"{self.table_capacity} blocks")
        arrays = self._prefill_arrays(sum(len(w.tokens) for w in works))
        t = b = 0
        for i, work in enumerate(works):
            n, blocks = len(work.tokens), work.seq.blocks
            arrays["tokens"][t: t + n], arrays["rows"][t: t + n] = work.tokens, i
            arrays["positions"][t: t + n] = np.arange(work.start, work.start + n)
            arrays["table"][b: b + len(blocks)], arrays["table_rows"][b: b + len(blocks)] = blocks, i
            arrays["starts"][i], arrays["last"][i] = b, t + n - 1
            t, b = t + n, b + len(blocks)
        result = self._prefill_call(arrays, [*(w.seq for w in works), *[None] * (self.max_prefills - len(works))])
        return [row if work.last else None for row, work in zip(self._rows(result, len(works)), works, strict=True)]

    def decode(self, seqs: Seq[Sequence], drafts: Seq[Seq[int]] | None = None) -> list[list[SampledRow]]:
        """The next token of each sequence (its last token is the input) and, for each token drafted
        for it (``drafts``, `speculation`), the token after that draft: one row per input token, each at
        its own position over the sequence's blocks, so a row sees the K/V its sequence's earlier rows
        write in the same call. The rows go in order of position, so that each attention segment
        (`llama.DECODE_SEGMENT_ROWS`) loops only about as far as each of its rows needs; sampling
        follows the sequence, not the row, and a row ``j`` drafted tokens ahead draws with the key of
        the output token it samples, as plain decoding would. Returns each sequence's rows in order."""
        drafts = drafts or [()] * len(seqs)
        inputs = sorted(((seq.num_computed + j, i, j, token) for i, seq in enumerate(seqs)
                         for j, token in enumerate([seq.tokens[-1], *drafts[i]])), key=lambda row: row[0])
        rows = bucket(len(inputs))
        tokens = np.zeros(rows, np.int32)
        positions = np.full(rows, -1, np.int32)
        tables = np.zeros((rows, self.table_width), np.int32)
        for row, (position, i, _, token) in enumerate(inputs):
            tokens[row], positions[row] = token, position
            tables[row, : len(seqs[i].blocks)] = seqs[i].blocks
        padding = [None] * (rows - len(inputs))
        result = self._decode_call(tokens, tables, positions, [*(seqs[i] for _, i, _, _ in inputs), *padding],
                                   [j for _, _, j, _ in inputs])
        sampled = self._rows(result, len(inputs))
        by_seq: list[list[SampledRow]] = [[] for _ in seqs]
        for (_, i, _, _), row in zip(inputs, sampled, strict=True):
            by_seq[i].append(row)
        return by_seq

    @staticmethod
    def _rows(result: SampleResult, count: int) -> list[SampledRow]:
        tokens, logprobs = np.asarray(result.tokens), np.asarray(result.logprobs)
        top_ids, top_logprobs = np.asarray(result.top_ids), np.asarray(result.top_logprobs)
        return [SampledRow(int(tokens[i]), float(logprobs[i]), top_ids[i], top_logprobs[i]) for i in range(count)]
