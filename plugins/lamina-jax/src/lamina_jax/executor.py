"""The ``jax`` executor: the Executor protocol over the engine thread.

``generate`` tokenizes on the event loop (the chat template for messages), checks the request
against the context window, the KV pool and the queue's bounds (its length, and with a
``max_queue_wait_s``, the option's or the tighter one the request carries, the wait the queue
ahead already means), and returns an async iterator fed by the engine thread through an
``asyncio.Queue``; before its first chunk, that iterator compiles a structured output's grammar
(`structured_output`) on a worker thread (a 400 when it does not compile). Closing it early aborts the
request in the engine, which frees its KV blocks at the next step boundary.
"""

from __future__ import annotations

import asyncio
import functools
import time
import collections.abc
from collections.abc import AsyncIterator, Mapping, Sequence as Seq
from pathlib import Path

import attrs
import jax
import structlog
from jax.sharding import Mesh
from tqdm import tqdm

from lamina_hookspecs.errors import ContextLengthError, InvalidRequestError, LaminaError, ServiceUnavailableError
from lamina_hookspecs.protocols import BatchingPolicy, PrefixCache, PrewarmPolicy
from lamina_hookspecs.registration import BuildContext
from lamina_hookspecs.types import BackendState, ModelInfo, Request, SamplingParams, TokenChunk
from lamina_jax.engine import Engine
from lamina_jax.block_manager import BlockAllocator, BlockManager, blocks_for
from lamina_jax import sharding, weight_formats
from lamina_jax.model.config import LlamaConfig
from lamina_jax.model.llama import LlamaParams, kv_bytes_per_position
from lamina_jax.model_runner import ModelRunner
from lamina_jax.options import BUILTIN_MODEL, KV_CACHE_MB, JaxOptions
from lamina_jax.sampling import BIAS_ENTRIES, request_key
from lamina_jax.scheduler import Scheduler
from lamina_jax.sequence import Sequence
from lamina_jax.structured_output import Grammars
from lamina_jax.chat_template import ChatTemplateError
from lamina_jax.tokenizer import Tokenizer
from lamina_jax.weights.gguf import smollm2_path
from lamina_jax.weights.model_files import ModelFiles, open_model
from lamina_jax.weights.served import load_weights

log = structlog.get_logger(__name__)

ACCELERATOR_KV_FRACTION = 0.9
"""The share of a GPU's or TPU's free memory the KV cache takes where neither ``kv_cache_mb`` nor
``kv_memory_fraction`` is set."""


def kv_budget(stats: Seq[Mapping[str, int] | None], fraction: float) -> int | None:
    """Bytes each device gives the KV cache: ``fraction`` of the memory the fullest of them has free
    (`jax.Device.memory_stats`: ``bytes_limit`` less ``bytes_in_use``); None where one reports none."""
    free = [s["bytes_limit"] - s["bytes_in_use"] for s in stats if s is not None]
    if not free or len(free) < len(stats):
        return None
    return int(fraction * max(0, min(free)))


class JaxExecutor:
    """A Llama-family model from a GGUF file or a Hugging Face directory, served with continuous batching."""

    def __init__(self, options: JaxOptions, prefix_cache: PrefixCache | None = None,
                 batching: BatchingPolicy | None = None, prewarm: PrewarmPolicy | None = None) -> None:
        if prefix_cache is not None and prefix_cache.block_size != options.block_size:
            raise ValueError(f"the prefix cache's block_size ({prefix_cache.block_size}) must equal the "
                             f"executor's ({options.block_size})")
        if prewarm is not None and prefix_cache is None:
            raise ValueError("a [prewarm] policy needs a [prefix_cache] to keep what it wants")
        self.options = options
        self.prefix_cache = prefix_cache
        self.batching = batching
        self.prewarm = prewarm
        path = smollm2_path() if options.model == BUILTIN_MODEL else Path(options.model).expanduser()
        self.path = path
        name = options.served_name or (BUILTIN_MODEL if options.model == BUILTIN_MODEL
                                       else path.name if path.is_dir() else path.stem)
        self.model = ModelInfo(id=name, context_length=options.max_model_len)
        self.engine: Engine | None = None
        self.tokenizer: Tokenizer | None = None
        self.grammars: Grammars | None = None
        self._outstanding = 0
        self._outstanding_tokens = 0
        self._live: dict[str, Sequence] = {}
        """The submitted sequences still streaming, by request id (a forked choice finds its parent here)."""

    async def start(self) -> None:
        if self.engine is None:
            self.engine = await asyncio.to_thread(self._load)
            self.engine.start()

    def _load(self) -> Engine:
        mesh = self._mesh()
        if _devices(mesh)[0].platform == "cpu" and self.options.kv_memory_fraction is not None:
            raise ValueError(f"kv_memory_fraction = {self.options.kv_memory_fraction} sizes the KV cache on a GPU "
                             "or TPU, and JAX runs on the CPU here: set kv_cache_mb instead")
        files = open_model(self.path)
        config, options = files.config, self.options
        tokenizer = files.tokenizer
        if options.chat_template is not None:
            tokenizer.set_chat_template(_template_text(options.chat_template))
        max_len = min(options.max_model_len, config.context_length)
        self.model = attrs.evolve(self.model, context_length=max_len)
        self.tokenizer = tokenizer
        self.grammars = Grammars(tokenizer, config.vocab_size)
        shapes = ModelRunner.shapes_for(max_batch=options.max_batch, prefill_chunk=options.prefill_chunk)
        # Over a mesh each tensor is laid out as it is read, so no device holds the whole model, and
        # each device's free memory counts only its shards when the KV cache is sized.
        place = None if mesh is None else functools.partial(sharding.place_field, config=config, mesh=mesh)
        weights = load_weights(files, options.weights_dtype, shapes, place=place,
                               tensor_parallel=options.tensor_parallel,
                               read=functools.partial(self._read, files))
        if weights.timings is not None:
            log.info("weight_formats_chosen", model=self.model.id,
                     chosen={str(rows): fmt for rows, fmt in (weights.chosen or {}).items()},
                     ms={str(r): {f: round(t * 1e3, 2) for f, t in by.items()} for r, by in weights.timings.items()})
        num_blocks, kv_sizing = self._kv_blocks(config, max_len, mesh)
        runner = ModelRunner(weights.params, weights.config, num_blocks=num_blocks, block_size=options.block_size,
                             max_batch=options.max_batch, max_blocks_per_seq=blocks_for(max_len, options.block_size),
                             prefill_chunk=options.prefill_chunk, max_prefills=options.max_prefills,
                             kv_dtype=options.kv_dtype, shape_weights=weights.shape_weights, mesh=mesh)
        self._precompile(runner)
        blocks = BlockManager(BlockAllocator(num_blocks), block_size=options.block_size, prefix_cache=self.prefix_cache)
        scheduler = Scheduler(blocks, max_batch=options.max_batch, prefill_chunk=options.prefill_chunk,
                              decoding_prefill_chunk=options.decoding_prefill_chunk,
                              max_prefills=options.max_prefills, table_capacity=runner.table_capacity,
                              batching=self.batching, prewarm=self.prewarm,
                              speculative_tokens=options.speculative_tokens, speculative_rows=options.speculative_rows,
                              speculative_sampling=options.speculative_sampling, max_model_len=max_len)
        log.info("model_loaded", model=self.model.id, path=str(self.path), format=files.format,
                 architecture=files.architecture, layers=config.n_layers,
                 kv_blocks=num_blocks, **kv_sizing, kv_dtype=options.kv_dtype, block_size=options.block_size,
                 max_model_len=max_len, devices=[str(d) for d in runner.mesh.devices.flat] if runner.mesh else None)
        return Engine(runner, scheduler, self.tokenizer, max_model_len=max_len)

    def _mesh(self) -> Mesh | None:
        """The devices the options name or split over; ``None`` (JAX's default device) when they name none."""
        if self.options.tensor_parallel == 1 and self.options.devices is None:
            return None
        return sharding.make_mesh(self.options.tensor_parallel, self.options.devices)

    def _kv_blocks(self, config: LlamaConfig, max_len: int, mesh: Mesh | None) -> tuple[int, dict[str, float]]:
        """KV blocks to allocate, at least one full-length sequence's, and what sized them (for the log):
        ``kv_cache_mb`` where it is set; else on a GPU or TPU, `kv_budget` of its devices with the weights
        placed; else (the CPU, or a device that reports no memory statistics) `KV_CACHE_MB`."""
        options = self.options
        block_bytes = options.block_size * kv_bytes_per_position(config, options.kv_dtype)
        least = blocks_for(max_len, options.block_size)
        devices = _devices(mesh)
        fraction = options.kv_memory_fraction or ACCELERATOR_KV_FRACTION
        budget = (None if options.kv_cache_mb is not None or devices[0].platform == "cpu"
                  else kv_budget([d.memory_stats() for d in devices], fraction))
        if budget is None:
            mb = options.kv_cache_mb or KV_CACHE_MB
            return max(int(mb * 2**20 // block_bytes), least), {"kv_cache_mb": mb}
        if mesh is not None and sharding.heads_split(config, mesh):
            block_bytes //= mesh.size  # each device holds its KV heads' share of every block
        return max(budget // block_bytes, least), {"kv_memory_fraction": fraction,
                                                   "kv_mib_per_device": round(budget / 2**20, 1)}

    def _read(self, files: ModelFiles, dtype: str, place: weight_formats.Place | None,
              layers: int | None) -> LlamaParams:
        """`ModelFiles.load_params` under a progress bar."""
        what = "a probe of " if layers is not None else ""
        with tqdm(desc=f"loading {what}{self.path.name} as {dtype}", unit="tensor", leave=False) as bar:
            def progress(done: int, total: int) -> None:
                bar.total = total
                bar.update(done - bar.n)

            return files.load_params(progress, dtype, place, layers)

    def _precompile(self, runner: ModelRunner) -> None:
        """Compile every shape serving can use, reading and writing JAX's persistent cache."""
        if self.options.compile_cache_dir and not jax.config.jax_compilation_cache_dir:
            # JAX's own on-disk cache of compiled executables, keyed by computation and backend.
            jax.config.update("jax_compilation_cache_dir", self.options.compile_cache_dir)
        started = time.monotonic()
        with tqdm(desc="compiling", unit="shape", total=len(runner.shapes()), leave=False) as bar:
            runner.precompile(lambda done, total: bar.update(done - bar.n))
        log.info("model_compiled", model=self.model.id, shapes=len(runner.shapes()),
                 seconds=round(time.monotonic() - started, 1), cache_dir=jax.config.jax_compilation_cache_dir)

    async def stop(self) -> None:
        if self.engine is not None:
            engine, self.engine = self.engine, None
            await asyncio.to_thread(engine.stop)

    def state(self) -> BackendState:
        engine = self.engine
        if engine is None:
            return BackendState(name="jax", model=self.model.id, healthy=False)
        allocator = engine.scheduler.blocks.allocator
        return BackendState(
            name="jax", model=self.model.id, outstanding_requests=self._outstanding,
            outstanding_tokens=self._outstanding_tokens, queue_depth=engine.num_waiting,
            kv_blocks_used=allocator.num_used, kv_blocks_total=allocator.num_blocks,
            tokens_per_s=engine.tokens_per_s(), preemptions=engine.scheduler.num_preemptions,
            draft_tokens=engine.drafted_tokens, accepted_draft_tokens=engine.accepted_drafts,
        )

    async def tokenize(self, request: Request, *, add_special_tokens: bool = True,
                       add_generation_prompt: bool = True) -> list[int]:
        self._loaded()
        return self._prompt_ids(request, add_special_tokens=add_special_tokens,
                                add_generation_prompt=add_generation_prompt)

    async def detokenize(self, token_ids: collections.abc.Sequence[int]) -> str:
        self._loaded()
        assert self.tokenizer is not None
        self._check_ids(token_ids, "tokens")
        return self.tokenizer.decode(token_ids)

    def _loaded(self) -> Engine:
        if self.engine is None:
            raise ServiceUnavailableError("the model is not loaded yet", code="model_loading", retry_after=5)
        return self.engine

    def _check_ids(self, ids: collections.abc.Sequence[int], param: str) -> None:
        assert self.tokenizer is not None
        vocab = self.tokenizer.backend.get_vocab_size()
        if any(not 0 <= t < vocab for t in ids):
            raise InvalidRequestError(f"{param}: token ids must be in [0, {vocab})", param=param)

    def _prompt_ids(self, request: Request, *, add_special_tokens: bool = True,
                    add_generation_prompt: bool = True) -> list[int]:
        assert self.tokenizer is not None
        if request.prompt_token_ids is not None:
            ids = list(request.prompt_token_ids)
            self._check_ids(ids, "prompt")
            return ids
        if request.messages is not None:
            template = self.tokenizer.chat_template
            if template is None:
                raise InvalidRequestError(
                    f"model {self.model.id!r} has no chat template, so it cannot take chat messages: send a prompt "
                    "to /v1/completions, or set the jax executor's chat_template option (inline or a file)",
                    param="messages")
            messages = request.template_messages(template_takes_tools=template.takes_tools)
            tools = [tool.to_openai() for tool in request.tools] or None
            try:
                return self.tokenizer.encode_chat(messages, tools, add_generation_prompt=add_generation_prompt)
            except ChatTemplateError as error:
                raise InvalidRequestError(str(error), param="messages") from error
        return self.tokenizer.encode(request.prompt or "", add_special_tokens=add_special_tokens)

    def _check_bias(self, sampling: SamplingParams) -> None:
        """Refuse a ``logit_bias`` naming ids the model has not, or too many ids to hold back for ``min_tokens``."""
        assert self.engine is not None and self.tokenizer is not None
        vocab = self.engine.runner.config.vocab_size
        if any(token >= vocab for token, _ in sampling.logit_bias):
            raise InvalidRequestError(f"logit_bias: token ids must be below {vocab}", param="logit_bias")
        held = len(sampling.stop_token_ids) + len(self.tokenizer.eos_ids) if sampling.min_tokens else 0
        if len(sampling.logit_bias) + held > BIAS_ENTRIES:
            raise InvalidRequestError(f"logit_bias and the stop_token_ids min_tokens holds back name more than "
                                      f"{BIAS_ENTRIES} ids together", param="logit_bias")

    def generate(self, request: Request) -> AsyncIterator[TokenChunk]:
        engine = self._loaded()
        # Shed load before any work on the request (the chat template, tokenizing): a refusal is fast.
        if engine.num_waiting >= self.options.max_queue:
            raise ServiceUnavailableError(f"the request queue is full ({self.options.max_queue} waiting)",
                                          code="queue_full", retry_after=1)
        bounds = [b for b in (self.options.max_queue_wait_s, request.max_queue_wait_s) if b is not None]
        bound = min(bounds) if bounds else None
        if bound is not None and (expected := engine.expected_wait_s()) > bound:
            raise ServiceUnavailableError(
                f"the server is overloaded: a new request would wait about {expected:.0f} s to start, longer than "
                f"max_queue_wait_s ({bound:g} s)", code="overloaded", retry_after=min(expected, 60.0))
        ids = self._prompt_ids(request)
        if not ids:
            raise InvalidRequestError("the prompt is empty", param="prompt")
        self._check_bias(request.sampling)
        limit = self.model.context_length
        budget = request.sampling.max_tokens or limit - len(ids)
        if budget < 1 or len(ids) + budget > limit:
            raise ContextLengthError(f"this model's maximum context length is {limit} tokens; the prompt has "
                                     f"{len(ids)} and max_tokens asks for {budget} more")
        return self._stream(engine, attrs.evolve(request, max_queue_wait_s=bound,
                                                 sampling=attrs.evolve(request.sampling, max_tokens=budget)), ids)

    async def _stream(self, engine: Engine, request: Request, ids: list[int]) -> AsyncIterator[TokenChunk]:
        structured, grammars = request.sampling.structured, self.grammars
        assert grammars is not None
        # llguidance compiles without the GIL: a large schema does not hold up the event loop
        matcher = None if structured is None else await asyncio.to_thread(grammars.matcher, structured)
        loop = asyncio.get_running_loop()
        inbox: asyncio.Queue[TokenChunk | LaminaError] = asyncio.Queue()

        def emit(item: object) -> None:
            try:
                loop.call_soon_threadsafe(inbox.put_nowait, item)
            except RuntimeError:  # the event loop is closed: nobody is listening any more
                pass

        sampling = request.sampling
        ends = frozenset(sampling.stop_token_ids) | (frozenset() if sampling.ignore_eos else self.tokenizer.eos_ids)
        seq = Sequence(request_id=request.id, prompt_ids=ids, sampling=request.sampling, emit=emit, end_ids=ends,
                       key=request_key(request.sampling.seed), salt=request.tenant.encode(),
                       max_queue_wait_s=request.max_queue_wait_s, matcher=matcher)
        parent = self._live.get(request.fork_of) if request.fork_of is not None else None
        if parent is not None and parent.prompt_ids == ids and parent.salt == seq.salt:
            seq.fork_of = parent
        tokens = len(ids) + (request.sampling.max_tokens or 0)
        self._outstanding += 1
        self._outstanding_tokens += tokens
        engine.submit(seq)
        self._live[request.id] = seq
        finished = False
        try:
            while True:
                item = await inbox.get()
                if isinstance(item, LaminaError):
                    finished = True
                    raise item
                finished = item.finish_reason is not None
                yield item
                if finished:
                    return
        finally:
            self._live.pop(request.id, None)
            self._outstanding -= 1
            self._outstanding_tokens -= tokens
            if not finished:
                engine.abort(seq)


def _devices(mesh: Mesh | None) -> list[jax.Device]:
    """The devices the executor runs on: the mesh's, or JAX's default one."""
    return list(mesh.devices.flat) if mesh is not None else jax.devices()[:1]


def _template_text(value: str) -> str:
    """The ``chat_template`` option's template: the file it names, or the value itself."""
    path = Path(value).expanduser()
    return path.read_text() if "\n" not in value and len(value) < 4096 and path.is_file() else value


def build_jax(options: JaxOptions, context: BuildContext) -> JaxExecutor:
    """A Llama-family model (GGUF or Hugging Face directory) in JAX with continuous batching and a paged KV cache."""
    return JaxExecutor(options, context.prefix_cache, context.batching, context.prewarm)
