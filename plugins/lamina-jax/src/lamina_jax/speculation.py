"""Prompt lookup (n-gram speculation): draft tokens for greedy sequences from their own context.

When a sequence's last n tokens (n from ``NGRAM_MAX`` down to ``NGRAM_MIN``) occurred earlier in its
prompt or output, the tokens that followed them then are guessed to follow again (vLLM's ``ngram``
method, after "prompt lookup decoding"). The engine then decodes the last token and the guesses in one
call, each as a row at its own position over the sequence's blocks
(`ModelRunner.decode`), and keeps the guesses up to the first the model disagrees with, plus the
model's own token after them. At a small batch a decode step is bound by reading the weights, so a few
more rows cost little, and each accepted guess saves a step.

Only greedy sequences whose sampling reads no history are drafted: their token at each row is the
model's argmax there whatever came before, so the output is the one plain decoding would give, up to
the numerics of the step's row count: ``weights_dtype = "auto"`` may serve another row count in another
format, as it does when a plain batch grows.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

from lamina_jax.sequence import Sequence

NGRAM_MAX = 4
"""Longest suffix looked up."""
NGRAM_MIN = 2
"""Shortest suffix looked up: a single token matches too often to be worth a row."""


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


def draftable(seq: Sequence) -> bool:
    """Whether ``seq``'s next tokens may be drafted: greedy, no penalties or bias (they read the tokens
    before each row), past ``min_tokens``, no structured output."""
    params = seq.sampling
    return (params.temperature <= 0 and not params.adjusts_logits and seq.matcher is None
            and len(seq.output_ids) >= params.min_tokens)
