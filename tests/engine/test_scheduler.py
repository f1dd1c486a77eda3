"""The scheduler, without a model: admission under the block and token budgets, decodes first, chunked prefill,
preemption of the newest sequence by recompute, and every prefix-cache call (match on admission, register after
prefill and commit).

`execute` plays the engine's part on the cache alone: a prefill chunk appends its slots, a decode appends a
whole tree and keeps only the root (plus one new output token), as a verify step that accepted nothing would.
"""

from __future__ import annotations

import pytest
import torch

from specdec.config import EngineConfig, SamplingParams
from specdec.errors import ConfigError
from specdec.engine.scheduler import ScheduledBatch, Scheduler, prefill_target
from specdec.engine.sequence import Sequence, Status
from specdec.kvcache import PagedKVCache

BS = 4  # block size of every cache here


def make_cache(num_blocks: int, prefix_caching: bool = False) -> PagedKVCache:
    return PagedKVCache(1, num_blocks, BS, kv_heads=1, head_dim=2, prefix_caching=prefix_caching)


def make_scheduler(num_blocks: int, prefix_caching: bool = False, **config) -> Scheduler:
    config.setdefault("block_size", BS)
    config.setdefault("max_tree_nodes", 1)
    config.setdefault("max_num_batched_tokens", max(config["max_tree_nodes"], 64))
    return Scheduler(EngineConfig(**config), make_cache(num_blocks, prefix_caching))


_ids = iter(range(10**6))


def make_seq(prompt: list[int], output: list[int] | None = None) -> Sequence:
    seq = Sequence(next(_ids), list(prompt), SamplingParams(max_new_tokens=100), torch.Generator())
    seq.output_ids = list(output or [])
    return seq


def execute(sched: Scheduler, batch: ScheduledBatch, tree_nodes: int = 1, next_token: int = 7) -> None:
    """What the engine does with a batch, on the cache only."""
    for seq, n in batch.prefills:
        assert sched.cache.append(seq.table, n) is not None, "the scheduler promised room for this chunk"
        sched.prefilled(seq)
        if seq.num_computed == prefill_target(seq) and not seq.output_ids:
            seq.output_ids.append(next_token)  # the first token, from the last prompt row
    for seq in batch.decodes:
        prefix = seq.table.length
        assert sched.cache.append(seq.table, tree_nodes) is not None, "the scheduler promised room for this tree"
        sched.cache.truncate(seq.table, prefix + 1)  # the root's K/V stays, the drafts are rejected
        seq.output_ids.append(next_token)  # the bonus token
        sched.committed(seq)


def step(sched: Scheduler, tree_nodes: int = 1, next_token: int = 7) -> ScheduledBatch:
    batch = sched.schedule(tree_nodes)
    execute(sched, batch, tree_nodes, next_token)
    return batch


# --------------------------------------------------------------------------------------------- admission
def test_capacity_is_every_block_of_the_cache():
    assert make_scheduler(num_blocks=5).capacity_tokens == 5 * BS
    assert make_scheduler(num_blocks=1).capacity_tokens == BS


def test_admission_stops_when_free_blocks_run_out():
    sched = make_scheduler(num_blocks=4, max_tree_nodes=2)
    first, second = make_seq(range(8)), make_seq(range(8))
    sched.add(first)
    sched.add(second)
    # each needs 2 blocks for its prompt and a third for its first tree (2 nodes): the second's prompt alone
    # would fit the 2 blocks left, its first tree would not
    batch = sched.schedule(tree_nodes=2)
    assert batch.prefills == [(first, 8)]
    assert list(sched.waiting) == [second] and second.status is Status.WAITING
    assert sched.running == [first] and first.status is Status.RUNNING
    assert second.table.blocks == []


def test_admission_fits_the_token_budget_with_a_partial_chunk():
    sched = make_scheduler(num_blocks=64, max_num_batched_tokens=10)
    a, b, c = make_seq(range(6)), make_seq(range(6)), make_seq(range(6))
    for seq in (a, b, c):
        sched.add(seq)
    batch = sched.schedule(tree_nodes=1)
    assert batch.prefills == [(a, 6), (b, 4)]  # b gets what is left of the 10 tokens
    assert list(sched.waiting) == [c]


def test_admission_respects_max_num_seqs():
    sched = make_scheduler(num_blocks=64, max_num_seqs=2)
    seqs = [make_seq([1, 2, 3]) for _ in range(3)]
    for seq in seqs:
        sched.add(seq)
    batch = sched.schedule(tree_nodes=1)
    assert [s for s, _ in batch.prefills] == seqs[:2]
    assert list(sched.waiting) == seqs[2:]


def test_decodes_go_before_prefills_and_a_long_prompt_gets_what_is_left():
    sched = make_scheduler(num_blocks=64, max_num_batched_tokens=12, max_tree_nodes=5, prefill_chunk=64)
    short = make_seq([1, 2, 3])
    sched.add(short)
    step(sched, tree_nodes=5)  # prefill: `short` now decodes
    long = make_seq(range(40))
    sched.add(long)
    batch = sched.schedule(tree_nodes=5)
    assert batch.decodes == [short]
    assert batch.prefills == [(long, 12 - 5)]  # the decode's tree took its 5 tokens first


def test_prefill_while_decoding_is_capped_and_alone_is_not():
    """`prefill_tokens_while_decoding`: a step that decodes prefills at most that many prompt tokens, over every
    prompt it admits or continues; a step with nothing decoding prefills by the other limits."""
    sched = make_scheduler(num_blocks=64, prefill_chunk=32, prefill_tokens_while_decoding=6)
    first, second = make_seq(range(20)), make_seq(range(20))
    sched.add(first)
    batch = step(sched)
    assert batch.prefills == [(first, 20)] and not batch.decodes  # nothing decodes yet: the whole prompt
    sched.add(second)
    sched.add(third := make_seq(range(3)))
    chunks = []
    while second.num_computed < 20:
        batch = step(sched)
        assert batch.decodes[0] is first
        assert sum(n for _, n in batch.prefills) <= 6
        chunks.append([n for s, n in batch.prefills if s is second])
    assert chunks == [[6], [6], [6], [2]]
    assert third.num_computed == 3  # admitted beside the last chunk, in the 4 tokens it left
    with pytest.raises(ConfigError, match="prefill_tokens_while_decoding"):
        EngineConfig(prefill_tokens_while_decoding=-1)


def test_chunked_prefill_progresses_chunk_by_chunk_then_decodes():
    sched = make_scheduler(num_blocks=64, prefill_chunk=4)
    seq = make_seq(range(10))
    sched.add(seq)
    chunks = []
    for _ in range(3):
        batch = step(sched)
        assert not batch.decodes
        chunks.append([n for s, n in batch.prefills if s is seq])
    assert chunks == [[4], [4], [2]]
    assert seq.num_computed == 10 and seq.output_ids == [7]  # the whole prompt, then the first token
    batch = step(sched)
    assert batch.decodes == [seq] and not batch.prefills
    assert seq.num_computed == 11 == seq.num_tokens - 1  # the decode invariant: all but the last token


def test_a_part_prefilled_sequence_continues_before_new_ones_are_admitted():
    sched = make_scheduler(num_blocks=64, prefill_chunk=4, max_num_batched_tokens=6)
    first, second = make_seq(range(10)), make_seq(range(3))
    sched.add(first)
    assert step(sched).prefills == [(first, 4)]
    sched.add(second)
    batch = sched.schedule(tree_nodes=1)
    assert batch.prefills == [(first, 4), (second, 2)]  # the running prefill first, then what is left


# -------------------------------------------------------------------------------------------- preemption
def fill_two_decoders() -> tuple[Scheduler, Sequence, Sequence]:
    """Two sequences decoding in a 4-block cache: each holds one full block and one partial block."""
    sched = make_scheduler(num_blocks=4)
    old, new = make_seq([1, 2, 3, 4, 5]), make_seq([9, 8, 7, 6, 5])
    sched.add(old)
    sched.add(new)
    step(sched)  # both prefilled (2 blocks each), each with its first token
    assert sched.running == [old, new] and sched.cache.num_free_blocks == 0
    return sched, old, new


def test_when_blocks_run_out_the_newest_sequence_is_preempted_and_requeued_first():
    sched, old, new = fill_two_decoders()
    waiting = make_seq([3, 3, 3])
    sched.add(waiting)
    for _ in range(3):  # positions 5, 6, 7 fit the partial blocks
        batch = step(sched)
        assert batch.decodes == [old, new] and not batch.preempted
    batch = sched.schedule(tree_nodes=1)  # position 8 needs a fresh block each: one must go
    assert batch.preempted == [new]
    assert batch.decodes == [old]
    assert not batch.prefills  # memory is short: nothing is admitted this step
    assert new.status is Status.WAITING and new.metrics.preemptions == 1
    assert list(sched.waiting) == [new, waiting]  # back at the front, ahead of later arrivals
    assert new.table.blocks == [] and new.num_computed == 0
    assert sched.cache.num_free_blocks == 2  # its two blocks came back (one is promised to `old` now)


def test_a_preempted_sequence_is_recomputed_with_its_output_and_keeps_it():
    sched, old, new = fill_two_decoders()
    for _ in range(3):
        step(sched)
    batch = step(sched, next_token=5)
    assert batch.preempted == [new]
    output = list(new.output_ids)
    assert len(output) == 4
    sched.remove(old)  # `old` finishes: its blocks free up
    assert sched.cache.num_free_blocks == 4
    batch = step(sched)
    # all but the last token is prefilled again (the last one is the next tree's root), no token is drawn
    assert batch.prefills == [(new, 5 + 4 - 1)]
    assert new.output_ids == output and new.status is Status.RUNNING
    assert new.num_computed == new.num_tokens - 1
    assert step(sched).decodes == [new]


def test_a_sequence_that_cannot_fit_even_alone_preempts_itself():
    sched = make_scheduler(num_blocks=2)
    seq = make_seq([1, 2, 3, 4, 5, 6, 7])
    sched.add(seq)
    step(sched)  # prompt (7 tokens) fits 2 blocks
    batch = step(sched)  # position 7 fills the second block
    assert batch.decodes == [seq]
    batch = sched.schedule(tree_nodes=1)  # position 8 needs a third block
    assert batch.preempted == [seq] and batch.empty
    assert list(sched.waiting) == [seq] and sched.cache.num_free_blocks == 2


def test_remove_frees_every_block_at_once():
    sched, old, new = fill_two_decoders()
    sched.remove(new)
    sched.remove(old)
    assert sched.cache.num_free_blocks == 4 and not sched.has_work()


# ---------------------------------------------------------------------------------------------- prefix cache
def test_full_blocks_are_registered_after_each_prefill_chunk_only():
    sched = make_scheduler(num_blocks=16, prefix_caching=True, prefill_chunk=5)
    seq = make_seq(range(10))
    sched.add(seq)
    batch = sched.schedule(tree_nodes=1)
    sched.cache.append(seq.table, batch.prefills[0][1])
    assert sched.cache.prefix.num_cached_blocks == 0  # computed, but not announced yet
    sched.prefilled(seq)
    assert sched.cache.prefix.num_cached_blocks == 1  # 5 tokens: one full block
    step(sched)
    assert sched.cache.prefix.num_cached_blocks == 2  # 10 tokens: two


def test_decoded_blocks_are_registered_on_commit():
    sched = make_scheduler(num_blocks=16, prefix_caching=True)
    seq = make_seq(range(6))
    sched.add(seq)
    step(sched)
    assert sched.cache.prefix.num_cached_blocks == 1
    step(sched)  # position 6
    assert sched.cache.prefix.num_cached_blocks == 1
    step(sched)  # position 7 completes the second block
    assert sched.cache.prefix.num_cached_blocks == 2
    assert len(seq.table.cached) == 2


def test_admission_matches_the_cached_prefix_and_prefills_only_the_rest():
    sched = make_scheduler(num_blocks=16, prefix_caching=True)
    first = make_seq(list(range(10)))
    sched.add(first)
    step(sched)
    second = make_seq(list(range(8)) + [50, 51, 52])
    sched.add(second)
    batch = sched.schedule(tree_nodes=1)
    assert second.table.blocks[:2] == first.table.blocks[:2]  # shared, not copied
    assert batch.prefills[-1] == (second, 11 - 8)
    assert second.metrics.cached_prompt_tokens == 8
    assert sched.cache.prefix.hit_tokens == 8 and sched.cache.prefix.queried_tokens == 10 + 11


def test_a_fully_cached_prompt_still_computes_its_last_token():
    sched = make_scheduler(num_blocks=16, prefix_caching=True)
    first = make_seq(list(range(8)))
    sched.add(first)
    step(sched)
    again = make_seq(list(range(8)))
    sched.add(again)
    batch = sched.schedule(tree_nodes=1)
    # the last token's logits give the first output token, so at most 7 tokens may match: one block
    assert again.metrics.cached_prompt_tokens == 4
    assert batch.prefills[-1] == (again, 4)


def test_a_hit_that_is_not_admitted_gives_its_blocks_back():
    sched = make_scheduler(num_blocks=4, prefix_caching=True, max_tree_nodes=4)
    first = make_seq(list(range(8)))
    sched.add(first)
    step(sched, tree_nodes=4)
    assert sched.cache.num_free_blocks == 2
    late = make_seq(list(range(8)) + list(range(20, 30)))  # a hit of 8 tokens, but 10 more need 3 blocks
    sched.add(late)
    batch = sched.schedule(tree_nodes=4)
    assert batch.decodes == [first] and not batch.prefills
    assert list(sched.waiting) == [late]
    assert late.table.blocks == [] and late.table.length == 0
    assert [sched.cache.pool.ref_count(b) for b in first.table.blocks[:2]] == [1, 1]
    assert late.metrics.cached_prompt_tokens == 0
