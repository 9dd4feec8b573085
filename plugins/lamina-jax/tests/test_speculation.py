"""Prompt lookup: drafts from a sequence's own n-grams, and which steps draft how many (the drafted
decoding itself: `test_executor`)."""

from __future__ import annotations

from lamina_hookspecs.types import SamplingParams

from lamina_jax.block_manager import BlockAllocator, BlockManager
from lamina_jax.scheduler import Scheduler
from lamina_jax.sequence import Sequence
from lamina_jax.speculation import Drafter, NgramIndex

GREEDY = dict(temperature=0.0, ignore_eos=True)


def test_the_longest_suffix_found_proposes_what_followed_its_latest_occurrence() -> None:
    index = NgramIndex()
    tokens = [1, 2, 3, 9, 2, 3, 8, 7, 6, 1, 2, 3]
    assert index.propose(tokens, 2) == [9, 2], "[1, 2, 3] was followed by 9"
    tokens += [5]
    assert index.propose(tokens, 3) == [], "no earlier [3, 5]"
    tokens += [7, 6]
    assert index.propose(tokens, 4) == [1, 2, 3, 5], "[7, 6] was followed by 1 2 3 5, drafted up to the end"
    tokens += [1, 2, 3, 5, 7]
    assert index.propose(tokens, 2) == [6, 1], "the latest of two occurrences of [2, 3, 5, 7]"
    assert NgramIndex().propose([4, 4], 3) == [], "one token alone is no n-gram worth drafting"


def _running(scheduler: Scheduler, name: str, prompt: list[int], **sampling: object) -> Sequence:
    seq = Sequence(request_id=name, prompt_ids=prompt, emit=print,
                   sampling=SamplingParams(**{"max_tokens": 50, **GREEDY, **sampling}))
    scheduler.add(seq)
    for work in scheduler.schedule().prefills:
        scheduler.finish_prefill(work)
    seq.output_ids.append(5)  # the pattern's next token: the output goes on repeating it
    return seq


def test_sequences_draft_their_share_of_the_rows_within_their_limits() -> None:
    scheduler = Scheduler(BlockManager(BlockAllocator(100), block_size=4), max_batch=8, prefill_chunk=64,
                          speculative_tokens=3, speculative_rows=8, max_model_len=64)
    pattern = [5, 6, 7, 8, 9]
    greedy = _running(scheduler, "greedy", pattern * 3)
    assert scheduler.schedule().drafts == [[6, 7, 8]], "alone: speculative_tokens"
    assert len(greedy.blocks) * 4 >= greedy.num_computed + 4, "blocks for every drafted row"

    sampled = _running(scheduler, "sampled", pattern * 3, temperature=1.0)
    biased = _running(scheduler, "biased", pattern * 3, logit_bias=[(5, 1.0)])
    step = scheduler.schedule()
    assert step.decode == [greedy, sampled, biased]
    assert step.drafts == [[6], [], []], "a third of 8 rows each, for the greedy one alone by default"
    scheduler.speculative_sampling = True
    assert scheduler.schedule().drafts == [[6], [6], []], "the bias reads the tokens before each row"
    scheduler.speculative_sampling = False

    scheduler.remove(sampled)
    _running(scheduler, "short", pattern * 3, max_tokens=2)
    assert scheduler.schedule().drafts == [[6], [], []], "max_tokens 2, one generated: the model's token alone"
    _running(scheduler, "fourth", pattern * 3)
    _running(scheduler, "fifth", pattern * 3)
    assert scheduler.schedule().drafts == [[]] * 5, "five sequences: no share of 8 rows left"

    for seq in list(scheduler.running):
        scheduler.remove(seq)
    _running(scheduler, "near_end", pattern * 12)  # 61 tokens of a 64-position context
    assert scheduler.schedule().drafts == [[6, 7]], "up to the context's last position"


def test_drafts_refused_outright_pause_drafting_for_longer_each_time_until_one_is_kept() -> None:
    drafter = Drafter()
    tokens = [1, 2, 3, 1, 2]

    def drafting_steps(steps: int) -> list[int]:
        return [i for i in range(steps) if drafter.propose(tokens, 2)]

    assert drafting_steps(1) == [0]
    for pause in (1, 3, 7, 15, 31, 31):
        drafter.kept(0)
        assert drafting_steps(pause + 1) == [pause], f"a draft after {pause} steps without"
    drafter.kept(1)
    assert drafting_steps(2) == [0, 1], "a token kept: drafting at every step again"
