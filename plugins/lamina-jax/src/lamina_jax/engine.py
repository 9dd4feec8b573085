"""The engine: one thread that owns the model and steps it, fed and drained through queues.

Design (after JetStream's orchestrator and vLLM's engine core): the asyncio event loop
never touches JAX. ``submit`` and ``abort`` put commands on a thread-safe inbox; the engine
thread drains it between steps, so new requests join the running batch at step boundaries.
Each ``step()`` is schedule → run → update:

- schedule: the :class:`~lamina_jax.scheduler.Scheduler` picks the prefill chunks and the
  decode batch, taking KV blocks as sequences grow;
- run: the :class:`~lamina_jax.model_runner.ModelRunner` executes the jitted prefill and
  decode calls and samples on the device (XLA releases the GIL meanwhile); a sequence with drafted
  tokens (`speculation`) keeps its rows up to the first that disagrees with its draft;
- update: the :class:`~lamina_jax.output_processor.OutputProcessor` detokenizes each new
  token incrementally, checks stop conditions and hands it to its request's ``emit``
  callback, which forwards it to the event loop with ``call_soon_threadsafe``. Finished and
  aborted sequences free their blocks at once. With a batching policy, the longest time to
  first token (submission to first token) of the sequences that got theirs in the step is
  reported to it.

When there is nothing to do, the thread blocks on the inbox. When the batching policy holds
new prefills and nothing is running, it waits on the inbox for at most the hold: a new request
wakes it and the policy is asked again, and once the hold has passed the waiting requests
start. A policy must stop holding once the oldest request has waited its window, so a lone
request is delayed by at most that window, never stalled. Contextvars do not cross into this
thread, so every log line names the request id explicitly.

A sequence with a ``max_queue_wait_s`` that has not started (no prefill chunk) that long after its
submission fails with 503 ``queue_timeout`` between steps; `expected_wait_s` lets the executor
refuse one at once when the queue ahead of it already means a longer wait.

With a pre-warm policy, every ``PREWARM_S`` (waking from idle for it) the scheduler pins the
wanted prefixes; when nothing else runs, one wanted prefix that is not cached is computed as a
``warm`` sequence, which counts in no request statistics and feeds no batching policy.
"""

from __future__ import annotations

import itertools
import math
import queue
import threading
import time

import attrs
import numpy as np
import structlog

from lamina_hookspecs.errors import InternalError, ServiceUnavailableError
from lamina_hookspecs.types import SamplingParams
from lamina_jax.model_runner import ModelRunner, SampledRow
from lamina_jax.output_processor import OutputProcessor
from lamina_jax.rates import SpacedRate
from lamina_jax.scheduler import PrefillWork, Scheduler, Step
from lamina_jax.sequence import Sequence
from lamina_jax.tokenizer import Tokenizer

log = structlog.get_logger(__name__)

RATE_WINDOW_S = 2.0
"""Time constant of the generation-rate moving average."""
PREWARM_S = 1.0
"""How often the pre-warm policy's wanted prefixes are pinned (and a missing one computed when idle)."""


@attrs.define
class StepTimes:
    """Where the engine's steps spent their time: ``model_s`` inside the model runner's calls
    (padded input arrays, device work, the copy of the sampled tokens back), the rest of
    ``step_s`` in the engine's own host work (scheduling, detokenizing, stop checks, emitting)."""

    steps: int = 0
    step_s: float = 0.0
    model_s: float = 0.0

    @property
    def host_s(self) -> float:
        return self.step_s - self.model_s


class Engine:
    """Steps a model over a continuously changing batch on its own thread."""

    def __init__(self, runner: ModelRunner, scheduler: Scheduler, tokenizer: Tokenizer, *,
                 max_model_len: int) -> None:
        self.runner, self.scheduler = runner, scheduler
        self.outputs = OutputProcessor(tokenizer, max_model_len=max_model_len, release=scheduler.remove)
        self._inbox: queue.SimpleQueue[tuple[str, object]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self.generated_tokens = 0
        self.prompt_tokens = 0
        self._submitted = 0  # written by the event loop only
        self._accepted = 0  # written by the engine thread only
        self._rate = (time.monotonic(), 0.0)  # (when, tokens/s): one tuple, swapped atomically
        self._prewarm_at = 0.0  # when the pre-warm policy is next consulted
        self._warm_ids = itertools.count()
        self.prewarm_computed = 0
        """Prefixes computed ahead for the pre-warm policy."""
        self.times = StepTimes()
        """Totals over every step that ran (read from any thread; a benchmark diffs two readings)."""
        self.starts = SpacedRate()
        """Requests that got their first prefill chunk, per second."""
        self.queue_timeouts = 0
        """Requests failed for waiting longer than their ``max_queue_wait_s`` to start."""
        self.drafted_tokens = 0
        """Tokens drafted by prompt lookup (`speculation`) and decoded as extra rows."""
        self.accepted_drafts = 0
        """Drafted tokens the model agreed with: each one a decode step saved."""

    # -- called from the event loop ---------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="lamina-jax-engine", daemon=True)
        self._thread.start()

    def submit(self, seq: Sequence) -> None:
        self._submitted += 1
        self._inbox.put(("add", seq))

    def abort(self, seq: Sequence) -> None:
        self._inbox.put(("abort", seq))

    def stop(self) -> None:
        """Abort everything, free all blocks, and join the thread."""
        if self._thread is not None:
            self._inbox.put(("stop", None))
            self._thread.join()
            self._thread = None

    def tokens_per_s(self) -> float:
        """Recent generated tokens per second, decayed to now (it falls to 0 when idle)."""
        when, rate = self._rate
        return rate * math.exp(-(time.monotonic() - when) / RATE_WINDOW_S)

    def _count(self, tokens: int, started: float) -> None:
        """Fold one step's tokens into the moving average."""
        now = time.monotonic()
        when, rate = self._rate
        previous = rate * math.exp(-(started - when) / RATE_WINDOW_S)
        weight = math.exp(-(now - started) / RATE_WINDOW_S)
        self._rate = (now, previous * weight + (1 - weight) * tokens / max(now - started, 1e-6))

    @property
    def num_waiting(self) -> int:
        """Requests not yet running (queued in the scheduler or still in the inbox)."""
        return len(self.scheduler.waiting) + self._submitted - self._accepted

    def expected_wait_s(self) -> float:
        """How long a request submitted now would wait to start, going by the queue ahead of it and
        the rate the last requests started at (0 with nothing queued, or before a few have started)."""
        waiting, rate = self.num_waiting, self.starts.rate()
        return waiting / rate if waiting and rate else 0.0

    # -- the engine thread -------------------------------------------------------------

    def _run(self) -> None:
        idle_s = 0.0
        while True:
            idle = None if self.scheduler.prewarm is None else PREWARM_S
            if not self._drain(timeout=idle_s if self.scheduler.has_work() else idle):
                break
            self._expire(time.monotonic())
            self._prewarm(time.monotonic())
            idle_s = self.step()
        for seq in [*self.scheduler.running, *self.scheduler.waiting]:
            self.outputs.finish(seq, "abort")

    def _drain(self, *, timeout: float | None) -> bool:
        """Apply inbox commands, waiting up to ``timeout`` seconds for the first (``None``: for ever); False on stop."""
        block = timeout is None or timeout > 0
        while True:
            try:
                command, arg = self._inbox.get(block=block, timeout=timeout if block else None)
            except queue.Empty:
                return True
            block = False
            if command == "stop":
                return False
            assert isinstance(arg, Sequence)
            if command == "add":
                self._accepted += 1
                self.outputs.add(arg)
                self.scheduler.add(arg)
                self.prompt_tokens += len(arg.prompt_ids)
            elif command == "abort" and self.scheduler.remove(arg):
                self.outputs.drop(arg)

    def _expire(self, now: float) -> None:
        """Fail the requests that waited longer than their ``max_queue_wait_s`` to start (503 ``queue_timeout``)."""
        for seq in self.scheduler.expire(now):
            self.queue_timeouts += 1
            waited, bound = now - seq.submitted_at, seq.max_queue_wait_s
            log.info("request_queue_timeout", request_id=seq.request_id, waited_s=round(waited, 2))
            seq.emit(ServiceUnavailableError(
                f"the request waited {waited:.1f} s to start, longer than its max_queue_wait_s ({bound:g} s)",
                code="queue_timeout", retry_after=bound))
            self.outputs.drop(seq)

    def _prewarm(self, now: float) -> None:
        """Pin the pre-warm policy's prefixes; when idle, start computing one that is missing."""
        if self.scheduler.prewarm is None or now < self._prewarm_at:
            return
        self._prewarm_at = now + PREWARM_S
        idle = not self.scheduler.has_work()
        missing = self.scheduler.keep_wanted(now, idle=idle)
        if missing is None or not idle:
            return
        seq = Sequence(request_id=f"prewarm-{next(self._warm_ids)}", prompt_ids=list(missing.token_ids),
                       sampling=SamplingParams(max_tokens=1, temperature=0.0), emit=lambda _: None,
                       key=np.zeros(2, np.uint32), salt=missing.salt, warm=True)
        self.outputs.add(seq)
        self.scheduler.add(seq)
        self.prewarm_computed += 1
        log.info("prewarm_computing", request_id=seq.request_id, tokens=len(seq.prompt_ids), uses=round(missing.uses, 1))

    def step(self) -> float:
        """One schedule → run → update cycle; returns how long the engine may wait for a new
        command before the next one (0 after a step that ran)."""
        started = time.monotonic()
        step = self.scheduler.schedule(started)
        if not step.prefills and not step.decode:
            # held by the batching policy, or waiting for memory that only an abort can free
            return self.scheduler.hold_s or 0.001
        before = self.generated_tokens
        try:
            model_s = self._run_step(step)
            self._count(self.generated_tokens - before, started)
            self.times = StepTimes(self.times.steps + 1, self.times.step_s + time.monotonic() - started,
                                   self.times.model_s + model_s)
        except Exception:
            log.exception("engine_step_failed", request_ids=[s.request_id for s in self._in(step)])
            self.runner.reset_cache()
            for seq in self.scheduler.discard_all():
                seq.emit(InternalError("the executor failed while computing this request"))
                self.outputs.drop(seq)
        return 0.0

    @staticmethod
    def _in(step: Step) -> list[Sequence]:
        return [w.seq for w in step.prefills] + step.decode

    def _run_step(self, step: Step) -> float:
        """Run the step's calls and take their tokens; returns the seconds spent in the model runner."""
        model_s = self._prefill(step.prefills) if step.prefills else 0.0
        if step.decode:
            started = time.monotonic()
            rows = self.runner.decode(step.decode, step.drafts)
            model_s += time.monotonic() - started
            for seq, draft, seq_rows in zip(step.decode, step.drafts, rows, strict=True):
                self._accept_drafted(seq, draft, seq_rows)
        return model_s

    def _accept_drafted(self, seq: Sequence, draft: list[int], rows: list[SampledRow]) -> None:
        """Take ``seq``'s sampled rows while its drafted tokens match them: the row after the last input
        that matched is the model's own token (the first, without a draft)."""
        self.drafted_tokens += len(draft)
        kept = 0
        for j, row in enumerate(rows):
            seq.num_computed += 1
            finished = self._accept(seq, row)
            matched = j < len(draft) and row.token == draft[j]
            kept += matched
            if finished or not matched:
                break
        self.accepted_drafts += kept
        if draft:
            self.scheduler.drafts_kept(seq, kept)

    def _prefill(self, works: list[PrefillWork]) -> float:
        now = time.monotonic()
        for work in works:
            if work.seq.queue_s is None:
                work.seq.queue_s = now - work.seq.submitted_at
                if not work.seq.warm:
                    self.starts.add(now)
        first = []  # sequences that get their first token now (not a recomputation after preemption)
        sampled_rows = self.runner.prefill(works)
        model_s = time.monotonic() - now
        for work, sampled in zip(works, sampled_rows, strict=True):
            self.scheduler.finish_prefill(work)
            if sampled is not None and not work.seq.output_ids:
                if not work.seq.warm:
                    first.append(work.seq)
                self._accept(work.seq, sampled)
        if first:
            now = time.monotonic()
            self.scheduler.observe(max(now - seq.submitted_at for seq in first), now)
        return model_s

    def _accept(self, seq: Sequence, row: SampledRow) -> bool:
        """Hand ``row``'s token to ``seq``'s output; True if that finished it (and took it out)."""
        self.generated_tokens += not seq.warm
        return self.outputs.accept(seq, row)
