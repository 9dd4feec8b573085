"""Sampled tokens → what each request's client receives: text, stop conditions, logprobs, usage.

One :class:`_Output` per sequence holds its incremental detokenizer and stop-string filter. The
engine hands every sampled row to :meth:`OutputProcessor.accept`, which appends the token, decides
whether the sequence is finished (EOS, a stop token or string, its structured output complete,
``max_tokens``, the context window) and emits a :class:`~lamina_hookspecs.types.TokenChunk`
through the sequence's ``emit``. A finished sequence is released (its blocks freed) before its
last chunk is emitted, so a client that sees the end never finds its memory still held.
"""

from __future__ import annotations

from collections.abc import Callable

import structlog

from lamina_hookspecs.errors import InternalError
from lamina_hookspecs.types import FinishReason, TokenChunk, TopLogprob, Usage
from lamina_jax.model_runner import SampledRow
from lamina_jax.sequence import Sequence
from lamina_jax.stop_text import StopText
from lamina_jax.structured_output import advance
from lamina_jax.tokenizer import Tokenizer, IncrementalDetokenizer


log = structlog.get_logger(__name__)


class _Output:
    """Per-sequence text state: incremental detokenizer and stop-string filter."""

    def __init__(self, tokenizer: Tokenizer, seq: Sequence) -> None:
        self.detokenizer = IncrementalDetokenizer(tokenizer, seq.prompt_ids, skip_special_tokens=True)
        self.stop_text = StopText(seq.sampling.stop)


class OutputProcessor:
    """The text state of every sequence the engine holds; runs on the engine thread."""

    def __init__(self, tokenizer: Tokenizer, *, max_model_len: int, release: Callable[[Sequence], object]) -> None:
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self._release = release
        self._outputs: dict[Sequence, _Output] = {}

    def add(self, seq: Sequence) -> None:
        self._outputs[seq] = _Output(self.tokenizer, seq)

    def drop(self, seq: Sequence) -> None:
        self._outputs.pop(seq, None)

    def _end(self, seq: Sequence, last: object) -> None:
        """Release and drop the finished ``seq``, then emit ``last``."""
        self._release(seq)
        self.drop(seq)
        seq.emit(last)

    def accept(self, seq: Sequence, row: SampledRow) -> bool:
        """Append ``row``'s token to ``seq`` and emit it; True if ``seq`` is finished (released and dropped here)."""
        output = self._outputs[seq]
        sampling = seq.sampling
        token = row.token
        seq.output_ids.append(token)
        finish: FinishReason | None = None
        text, hit = "", False
        if (token in self.tokenizer.eos_ids and not sampling.ignore_eos) or token in sampling.stop_token_ids:
            finish = "stop"
        elif len(seq.output_ids) <= sampling.min_tokens:  # stop strings count only after min_tokens
            text = output.detokenizer.add(token)
        else:
            text, hit = output.stop_text.push(output.detokenizer.add(token))
            finish = "stop" if hit else None
        if finish is None and seq.matcher is not None:
            try:
                finish = "stop" if advance(seq.matcher, token) else None
            except RuntimeError as error:
                log.error("structured_output_failed", request_id=seq.request_id, error=str(error))
                self._end(seq, InternalError("the executor lost track of this request's structured output"))
                return True
        if finish is None and (len(seq.output_ids) >= sampling.max_tokens or seq.length >= self.max_model_len):
            finish = "length"
        if finish is not None and not hit:
            # held-back text is final now: a partial character, a partial stop string
            more, hit = output.stop_text.push(output.detokenizer.flush())
            text += more + ("" if hit else output.stop_text.flush())
            finish = "stop" if hit else finish
        chunk = TokenChunk(
            request_id=seq.request_id,
            index=len(seq.output_ids) - 1,
            token_ids=(token,),
            text=text,
            logprobs=(row.logprob,) if sampling.logprobs else None,
            top_logprobs=(self._top(row, sampling.top_logprobs),) if sampling.logprobs else None,
            finish_reason=finish,
            usage=Usage(prompt_tokens=len(seq.prompt_ids), completion_tokens=len(seq.output_ids),
                        cached_tokens=seq.cached_tokens, queue_s=seq.queue_s or 0.0) if finish else None,
        )
        if finish is None:
            seq.emit(chunk)
            return False
        self._end(seq, chunk)
        return True

    def finish(self, seq: Sequence, reason: FinishReason) -> None:
        """End ``seq``'s stream with ``reason`` and no new token."""
        self._end(seq, TokenChunk(request_id=seq.request_id, index=len(seq.output_ids), finish_reason=reason,
                                  usage=Usage(prompt_tokens=len(seq.prompt_ids), completion_tokens=len(seq.output_ids),
                                              queue_s=seq.queue_s or 0.0)))

    def _top(self, row: SampledRow, count: int) -> tuple[TopLogprob, ...]:
        return tuple(
            TopLogprob(token_id=int(t), text=self.tokenizer.decode([int(t)]), logprob=float(lp))
            for t, lp in zip(row.top_ids[:count], row.top_logprobs[:count], strict=True)
        )
