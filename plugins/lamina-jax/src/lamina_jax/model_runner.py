"""Device side of the engine: the jitted prefill and decode steps with sampling, in shape buckets.

Every call is padded to a bucket so that a steady workload compiles a bounded set of shapes
once and never again: prefill token counts, block-table lengths and the number of sequences
prefilled together (their chunks packed into one call) to powers of two, decode batches to
powers of two up to ``max_batch``, and the number of top logprobs to 0 or
``MAX_TOP_LOGPROBS``; a decode batch whose rows are all greedy has its own, cheaper variant.
Sampling runs inside the same jitted call as the model, so only the chosen tokens and their
logprobs travel back to the host.

Nothing here is CPU-specific: the same code runs on any JAX backend.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence as Seq

import attrs
import jax
import jax.numpy as jnp
import numpy as np

from lamina_jax.model.config import LlamaConfig
from lamina_jax.model.llama import KVCache, KVDtype, LlamaParams, decode, init_cache, prefill_packed
from lamina_jax.sampling import SampleResult, SamplingBatch, sample
from lamina_jax.scheduler import PrefillWork, Sequence

MAX_TOP_LOGPROBS = 20
"""The most alternatives a request may ask for (OpenAI's limit)."""

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


@functools.partial(jax.jit, static_argnames=("config", "num_top"), donate_argnames=("cache",))
def _prefill_and_sample(params: LlamaParams, cache: KVCache, tokens: jax.Array, positions: jax.Array,
                        rows: jax.Array, table: jax.Array, table_rows: jax.Array, starts: jax.Array,
                        last: jax.Array, batch: SamplingBatch, *, config: LlamaConfig,
                        num_top: int) -> tuple[SampleResult, KVCache]:
    logits, cache = prefill_packed(params, cache, tokens, positions, rows, table, table_rows, starts, last,
                                   config=config)
    return sample(logits, batch, num_top=num_top, max_top_k=SORT_CAP), cache


@functools.partial(jax.jit, static_argnames=("config", "num_top", "all_greedy"), donate_argnames=("cache",))
def _decode_and_sample(params: LlamaParams, cache: KVCache, tokens: jax.Array, tables: jax.Array,
                       positions: jax.Array, batch: SamplingBatch, *, config: LlamaConfig,
                       num_top: int, all_greedy: bool) -> tuple[SampleResult, KVCache]:
    logits, cache = decode(params, cache, tokens, tables, positions, config=config)
    return sample(logits, batch, num_top=num_top, max_top_k=SORT_CAP, all_greedy=all_greedy), cache


class ModelRunner:
    """Holds the weights and the KV block pools; runs packed prefill chunks or one decode batch."""

    def __init__(self, params: LlamaParams, config: LlamaConfig, *, num_blocks: int, block_size: int,
                 max_batch: int, kv_dtype: KVDtype = "float32") -> None:
        self.params, self.config = params, config
        self.num_blocks, self.block_size, self.max_batch = num_blocks, block_size, max_batch
        self.kv_dtype = kv_dtype
        self.cache = init_cache(config, num_blocks=num_blocks, block_size=block_size, dtype=kv_dtype)

    def reset_cache(self) -> None:
        """Fresh pools after a failed call (a donated cache may be gone)."""
        self.cache = init_cache(self.config, num_blocks=self.num_blocks, block_size=self.block_size,
                                dtype=self.kv_dtype)

    def _sampling(self, seqs: Seq[Sequence | None]) -> tuple[SamplingBatch, int]:
        """Per-row parameters (``None`` rows are padding) and the top-logprobs bucket."""
        rows = len(seqs)
        temperature, top_p = np.zeros(rows, np.float32), np.ones(rows, np.float32)
        top_k, steps = np.zeros(rows, np.int32), np.zeros(rows, np.int32)
        keys = np.zeros((rows, 2), np.uint32)
        wants_top = False
        for i, seq in enumerate(seqs):
            if seq is None:
                continue
            params = seq.sampling
            temperature[i], top_k[i], top_p[i] = params.temperature, params.top_k, params.top_p
            steps[i] = len(seq.output_ids)
            keys[i] = seq.key
            wants_top |= params.logprobs and params.top_logprobs > 0
        batch = SamplingBatch(temperature=temperature, top_k=top_k, top_p=top_p, keys=keys, steps=steps)
        return batch, MAX_TOP_LOGPROBS if wants_top else 0

    def prefill(self, works: Seq[PrefillWork]) -> list[SampledRow | None]:
        """Compute K/V for the chunks of ``works`` in one packed call; sample the next token of each
        work that completes its prompt (``None`` for the others)."""
        tokens = np.zeros(bucket(sum(len(w.tokens) for w in works), 16), np.int32)
        positions, rows = np.zeros_like(tokens), np.full_like(tokens, -1)
        table = np.zeros(bucket(sum(len(w.seq.blocks) for w in works), 4), np.int32)
        table_rows = np.full_like(table, -1)
        starts, last = np.zeros(bucket(len(works)), np.int32), np.zeros(bucket(len(works)), np.int32)
        t = b = 0
        for i, work in enumerate(works):
            n, blocks = len(work.tokens), work.seq.blocks
            tokens[t: t + n], rows[t: t + n] = work.tokens, i
            positions[t: t + n] = np.arange(work.start, work.start + n)
            table[b: b + len(blocks)], table_rows[b: b + len(blocks)], starts[i] = blocks, i, b
            last[i] = t + n - 1
            t, b = t + n, b + len(blocks)
        batch, num_top = self._sampling([*(w.seq for w in works), *[None] * (len(starts) - len(works))])
        result, self.cache = _prefill_and_sample(
            self.params, self.cache, tokens, positions, rows, table, table_rows, starts, last, batch,
            config=self.config, num_top=num_top,
        )
        return [row if work.last else None for row, work in zip(self._rows(result, len(works)), works, strict=True)]

    def decode(self, seqs: Seq[Sequence]) -> list[SampledRow]:
        """One token for each sequence (its last token is the input)."""
        rows = bucket(len(seqs))
        width = bucket(max(len(s.blocks) for s in seqs), 4)
        tokens = np.zeros(rows, np.int32)
        positions = np.full(rows, -1, np.int32)
        tables = np.zeros((rows, width), np.int32)
        for i, seq in enumerate(seqs):
            tokens[i], positions[i] = seq.tokens[-1], seq.num_computed
            tables[i, : len(seq.blocks)] = seq.blocks
        batch, num_top = self._sampling([*seqs, *[None] * (rows - len(seqs))])
        all_greedy = bool((batch.temperature <= 0).all())  # a greedy-only batch skips the random path
        result, self.cache = _decode_and_sample(
            self.params, self.cache, tokens, tables, positions, batch, config=self.config, num_top=num_top,
            all_greedy=all_greedy,
        )
        return self._rows(result, len(seqs))

    @staticmethod
    def _rows(result: SampleResult, count: int) -> list[SampledRow]:
        tokens, logprobs = np.asarray(result.tokens), np.asarray(result.logprobs)
        top_ids, top_logprobs = np.asarray(result.top_ids), np.asarray(result.top_logprobs)
        return [SampledRow(int(tokens[i]), float(logprobs[i]), top_ids[i], top_logprobs[i]) for i in range(count)]

