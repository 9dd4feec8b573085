"""Host-side scheduling without a model: chunking, batch limits, block accounting, preemption."""

from lamina_hookspecs.types import SamplingParams

from lamina_jax.block_manager import BlockAllocator, BlockManager
from lamina_jax.scheduler import Scheduler
from lamina_jax.sequence import Sequence
from lamina_jax.stop_text import StopText


def seq(name: str, prompt_len: int) -> Sequence:
    return Sequence(request_id=name, prompt_ids=list(range(prompt_len)), sampling=SamplingParams(), emit=print)


def test_long_prompt_is_prefilled_in_chunks_beside_decoding() -> None:
    scheduler = Scheduler(BlockManager(BlockAllocator(100), block_size=4), max_batch=8, prefill_chunk=16)
    short, long = seq("short", 3), seq("long", 43)
    scheduler.add(short)
    scheduler.add(long)
    step = scheduler.schedule()
    first, head = step.prefills
    assert first.seq is short and first.last and not step.decode
    assert head.seq is long and (head.start, len(head.tokens), head.last) == (0, 13, False), "the rest of the budget"
    for work in step.prefills:
        scheduler.finish_prefill(work)
    short.output_ids.append(7)
    starts = []
    for _ in range(2):
        step = scheduler.schedule()
        assert step.decode == [short], "the running stream decodes every step"
        [work] = step.prefills
        starts.append((work.start, len(work.tokens), work.last))
        scheduler.finish_prefill(work)
        short.num_computed += 1
        short.output_ids.append(7)
    assert starts == [(13, 16, False), (29, 14, True)]
    assert scheduler.running == [short, long]


def test_a_step_that_decodes_prefills_at_most_the_decoding_chunk() -> None:
    """Beside running streams a prompt advances by ``decoding_prefill_chunk`` tokens a step; with
    nothing decoding, by ``prefill_chunk``."""
    scheduler = Scheduler(BlockManager(BlockAllocator(100), block_size=4), max_batch=8, prefill_chunk=32,
                          decoding_prefill_chunk=16)
    first, second = seq("first", 3), seq("second", 40)
    scheduler.add(first)
    [work] = scheduler.schedule().prefills
    scheduler.finish_prefill(work)
    first.output_ids.append(7)
    scheduler.add(second)
    chunks = []
    while second not in scheduler.running:
        step = scheduler.schedule()
        [work] = step.prefills
        chunks.append((len(work.tokens), len(step.decode)))
        scheduler.finish_prefill(work)
        if first in step.decode:
            first.num_computed += 1
            first.output_ids.append(7)
        if len(chunks) == 2:
            scheduler.running.remove(first)  # it finishes: the rest of the prompt takes the whole budget
            scheduler.blocks.release(first)
    assert chunks == [(16, 1), (16, 1), (8, 0)]


def test_packing_stops_at_the_block_table_capacity() -> None:
    scheduler = Scheduler(BlockManager(BlockAllocator(100), block_size=4), max_batch=8, prefill_chunk=64, table_capacity=5)
    for name in ("a", "b", "c"):
        scheduler.add(seq(name, 8))  # two blocks each: a and b fit in five entries, c does not
    assert [w.seq.request_id for w in scheduler.schedule().prefills] == ["a", "b"]


def test_preemption_frees_the_newest_and_requeues_it_first() -> None:
    allocator = BlockAllocator(4)
    scheduler = Scheduler(BlockManager(allocator, block_size=4), max_batch=8, prefill_chunk=64)
    a, b = seq("a", 7), seq("b", 7)
    scheduler.add(a)
    scheduler.finish_prefill(scheduler.schedule().prefills[0])
    a.output_ids.append(1)
    scheduler.add(b)
    step = scheduler.schedule()
    assert step.decode == [a] and [w.seq for w in step.prefills] == [b]
    scheduler.finish_prefill(step.prefills[0])
    a.num_computed += 1
    a.output_ids.append(1)
    b.output_ids.append(1)
    assert allocator.num_free == 0
    step = scheduler.schedule()  # a needs a third block for position 8: b is preempted
    assert step.decode == [a] and scheduler.waiting[0] is b and b.blocks == [] and scheduler.num_preemptions == 1
    assert b.prefill_target == 7, "prompt plus all but the last generated token is recomputed"
    assert scheduler.remove(a) and allocator.num_free == 4


def test_stop_text_holds_back_only_what_could_start_a_stop() -> None:
    stops = StopText(["STOP"])
    assert stops.push("hello S") == ("hello ", False)
    assert stops.push("T") == ("", False)
    assert stops.push("OP and more") == ("", True)
    assert StopText(["STOP"]).push("a STAR") == ("a STAR", False)
    plain = StopText([])
    assert plain.push("abc") == ("abc", False) and plain.flush() == ""
    tail = StopText(["xyz"])
    assert tail.push("abx") == ("ab", False) and tail.flush() == "x"
