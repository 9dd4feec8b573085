"""A deterministic executor that streams the prompt's words back.

No model: each whitespace-separated word of the prompt (for chat, of the last message)
is one token, with id ``crc32(word) % vocab_size``. It stops after the last word with
``finish_reason="stop"`` (or cycles until ``max_tokens`` with ``ignore_eos``), honours
``stop`` strings and ``max_tokens``, and can pause between tokens to imitate a model.
Gateway tests and overhead benchmarks use it to measure everything but the model; with the
cost-model options (:mod:`lamina_echo.cost_model`) it also queues prefills, caches prompt
prefixes and slows down with its batch, for routing and autoscaling benchmarks.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import zlib
from collections.abc import AsyncIterator

import attrs

from lamina_hookspecs.errors import ContextLengthError
from lamina_hookspecs.registration import BuildContext
from lamina_hookspecs.types import BackendState, FinishReason, ModelInfo, Request, TokenChunk, Usage
from lamina_echo.cost_model import CostOptions, SimulatedEngine


@attrs.frozen(kw_only=True)
class EchoOptions(CostOptions):
    """Stack-file options of ``echo``."""

    model: str = attrs.field(default="echo", metadata={"help": "model id it answers to"})
    context_length: int = attrs.field(default=4096, validator=attrs.validators.ge(1),
                                      metadata={"help": "prompt + output tokens allowed"})
    token_delay_s: float = attrs.field(default=0.0, validator=attrs.validators.ge(0.0),
                                       metadata={"help": "pause before each token, seconds"})
    vocab_size: int = attrs.field(default=50_000, validator=attrs.validators.ge(2),
                                  metadata={"help": "token ids are crc32(word) modulo this"})


def _words(request: Request) -> list[str]:
    if request.prompt_token_ids is not None:
        return [f" <{t}>" for t in request.prompt_token_ids]
    text = request.prompt if request.prompt is not None else request.messages[-1].content  # type: ignore[index]
    return re.findall(r"\s*\S+", text)


class EchoExecutor:
    """Streams the prompt's words back, one token per word."""

    def __init__(self, options: EchoOptions) -> None:
        self.options = options
        self.model = ModelInfo(id=options.model, context_length=options.context_length)
        self._running = 0
        self._engine = SimulatedEngine(options)
        self._left: dict[object, int] = {}  # per stream: prompt tokens to prefill + tokens to generate

    async def start(self) -> None:
        """Nothing to load, unless the cost model simulates loading (``startup_s``)."""
        await asyncio.sleep(self.options.startup_s)

    async def stop(self) -> None:
        """Nothing to free: streams end when their iterators are closed."""

    def state(self) -> BackendState:
        engine = self._engine
        return BackendState(name="echo", model=self.model.id, outstanding_requests=self._running,
                            outstanding_tokens=sum(self._left.values()), queue_depth=engine.waiting,
                            kv_blocks_used=engine.cached_blocks, kv_blocks_total=self.options.cache_blocks)

    def generate(self, request: Request) -> AsyncIterator[TokenChunk]:
        words = _words(request)
        budget = request.sampling.max_tokens or self.options.context_length - len(words)
        if budget < 1 or len(words) + budget > self.options.context_length:
            raise ContextLengthError(
                f"prompt ({len(words)} tokens) plus max_tokens ({budget}) exceeds the context "
                f"length {self.options.context_length}"
            )
        return self._stream(request, words, budget)

    async def _stream(self, request: Request, words: list[str], budget: int) -> AsyncIterator[TokenChunk]:
        sampling = request.sampling
        source = itertools.cycle(words) if sampling.ignore_eos and words else iter(words)
        text, emitted = "", 0
        finish: FinishReason = "stop"
        engine, delay_s = self._engine, self.options.token_delay_s
        self._running += 1
        stream = object()  # request ids need not be unique here
        self._left[stream] = len(words) + budget
        cached, queued = 0, 0.0
        try:
            if self.options.prefill_s_per_token or self.options.cache_blocks:
                cached, queued = await engine.prefill(request.tenant, words)
            self._left[stream] = budget
            engine.decoding += 1
            try:
                for word in source:
                    if emitted == budget:
                        finish = "length"
                        break
                    if delay_s:
                        await asyncio.sleep(engine.token_delay(delay_s))
                    cut = _stop_cut(text + word, sampling.stop, len(text))
                    if cut is not None:
                        if cut > len(text):
                            yield self._chunk(request, emitted, word[: cut - len(text)])
                            emitted += 1
                        break
                    text += word
                    yield self._chunk(request, emitted, word)
                    emitted += 1
                    self._left[stream] = budget - emitted
            finally:
                engine.decoding -= 1
            yield TokenChunk(request_id=request.id, index=emitted, finish_reason=finish,
                             usage=Usage(prompt_tokens=len(words), completion_tokens=emitted, cached_tokens=cached,
                                         queue_s=queued))
        finally:
            self._running -= 1
            del self._left[stream]

    def _chunk(self, request: Request, index: int, word: str) -> TokenChunk:
        token = zlib.crc32(word.strip().encode()) % self.options.vocab_size
        return TokenChunk(request_id=request.id, index=index, token_ids=(token,), text=word)


def _stop_cut(text: str, stops: tuple[str, ...], searched: int) -> int | None:
    """Where ``text`` must end if a stop string appears in its new part, else ``None``."""
    hits = [i for s in stops if (i := text.find(s, max(0, searched - len(s) + 1))) != -1]
    return min(hits) if hits else None


def build_echo(options: EchoOptions, context: BuildContext) -> EchoExecutor:
    """Streams the prompt's words back (no model); for gateway tests and overhead benchmarks."""
    return EchoExecutor(options)
