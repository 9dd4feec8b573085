"""Prompt lookup (n-gram speculation): draft tokens for sequences from their own context.

When a sequence's last n tokens (n from ``NGRAM_MAX`` down to ``NGRAM_MIN``) occurred earlier in its
prompt or output, the tokens that followed them then are guessed to follow again (vLLM's ``ngram``
method, after "prompt lookup decoding"). The engine then decodes the last token and the guesses in one
call, each as a row at its own position over the sequence's blocks
(`ModelRunner.decode`), and keeps the guesses up to the first the model disagrees with, plus the
model's own token after them. At a small batch a decode step is bound by reading the weights, so a few
more rows cost little, and each accepted guess saves a step.

Only sequences whose sampling reads no history (no penalties, bias or grammar) are drafted, and by
default only greedy ones: ``speculative_sampling`` adds sampled ones, exactly, but sampled chat
repeats itself too seldom for their drafts to pay (benchmarks/README.md).

A sequence whose drafts the model refuses outright pauses drafting for longer each time (1, 3, 7, ...
decode steps, up to ``MAX_PAUSE``), and resumes at once after a draft it keeps a token of: text that
does not repeat itself costs few wasted rows, and a reply that starts repeating soon drafts again.

Each row samples its token as plain decoding would sample it after the same tokens: the argmax, or a
draw with the key of that output token's index (`sampling`). A draft is kept only where it equals that
token, so the output is the one plain decoding would give, and a seed gives the same tokens with
drafting on or off: keeping a draft with the probability the model gives it and otherwise drawing from
the rest, as speculative sampling does with a one-token draft distribution, is this same rule. Up to
the numerics of the step's row count: ``weights_dtype = "auto"`` may serve another row count in
another format, as it does when a plain batch grows.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

from lamina_jax.sequence import Sequence

NGRAM_MAX = 4
"""Longest suffix looked up."""
NGRAM_MIN = 2
"""Shortest suffix looked up: a single token matches too often to be worth a row."""
MAX_PAUSE = 31
"""The most decode steps a sequence waits to draft again after drafts refused outright."""


class NgramIndex:
    """Where each n-gram of a growing token list last occurred: ``after[ngram]`` is the index of the
    token that followed it. Indexed incrementally, as the list grows."""

    def __init__(self) -> None:
        self.after: dict[tuple[int, ...], int] = {}
        self.indexed = 0
        """Tokens whose preceding n-grams are in ``after``."""

    def propose(self, tokens: Seq[int], count: int) -> list[int]:
        """Up to ``count`` tokens that followed the latest earlier occurrence of the longest suffix of
        ``tokens`` (a list that only grows between calls) found; ``[]`` if none."""
        for i in range(max(self.indexed, NGRAM_MIN), len(tokens)):
            for n in range(NGRAM_MIN, min(NGRAM_MAX, i) + 1):
                self.after[tuple(tokens[i - n:i])] = i
        self.indexed = len(tokens)
        for n in range(min(NGRAM_MAX, len(tokens)), NGRAM_MIN - 1, -1):
            at = self.after.get(tuple(tokens[-n:]))
            if at is not None:
                return list(tokens[at:at + count])
        return []


class Drafter:
    """One sequence's prompt lookup: its n-gram index, and its pause after drafts refused outright."""

    def __init__(self) -> None:
        self.index = NgramIndex()
        self.refused = 0
        """Drafts in a row the model refused outright."""
        self.pause = 0
        """Calls to :meth:`propose` left that draft nothing."""

    def propose(self, tokens: Seq[int], count: int) -> list[int]:
        """Up to ``count`` drafted tokens (`NgramIndex.propose`); none while pausing."""
        if self.pause:
            self.pause -= 1
            return []
        return self.index.propose(tokens, count)

    def kept(self, count: int) -> None:
        """The model kept ``count`` tokens of the last draft."""
        self.refused = 0 if count else self.refused + 1
        self.pause = min(2 ** self.refused - 1, MAX_PAUSE)


def draftable(seq: Sequence, *, sampled: bool) -> bool:
    """Whether ``seq``'s next tokens may be drafted: greedy (or any, if ``sampled``), no penalties or bias
    (they read the tokens before each row), past ``min_tokens``, no structured output."""
    params = seq.sampling
    return ((sampled or params.temperature <= 0) and not params.adjusts_logits and seq.matcher is None
            and len(seq.output_ids) >= params.min_tokens)
