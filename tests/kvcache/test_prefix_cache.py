"""Prefix caching: hits are found by content, confirmed by token ids and chain position, cost no blocks, and
change no output."""

from __future__ import annotations

import dataclasses
import random

import pytest

from specdec.config import SamplingParams
from specdec.drafters.ngram import NgramDrafter
from specdec.drafters.none import NoDrafter
from specdec.kvcache import BlockTable, PagedKVCache
from specdec.tree.spec import chain
from tests.helpers import run_all, tiny_engine, tiny_model

BS = 4


def cache(num_blocks: int = 16) -> PagedKVCache:
    return PagedKVCache(1, num_blocks, BS, 1, 2, prefix_caching=True)


def filled(c: PagedKVCache, tokens: list[int]) -> BlockTable:
    table = BlockTable()
    c.append(table, len(tokens))
    c.prefix.register(table, tokens)
    return table


def test_a_shared_prefix_is_found_and_shared():
    c = cache()
    tokens = list(range(10))  # two full blocks and a partial one
    first = filled(c, tokens)
    second = BlockTable()
    hit = c.prefix.match(second, tokens + [99], limit=10)
    assert hit == 8 and second.blocks == first.blocks[:2]
    assert [c.pool.ref_count(b) for b in first.blocks] == [2, 2, 1]


def test_the_last_token_is_never_matched():
    c = cache()
    tokens = list(range(8))
    filled(c, tokens)
    assert c.prefix.match(BlockTable(), tokens, limit=7) == 4


def test_a_block_after_a_different_prefix_is_not_reused():
    c = cache()
    filled(c, [1, 1, 1, 1, 5, 5, 5, 5])
    table = BlockTable()
    assert c.prefix.match(table, [2, 2, 2, 2, 5, 5, 5, 5, 0], limit=8) == 0
    assert table.blocks == []


def test_a_hash_hit_with_other_tokens_is_rejected():
    c = cache()
    table = filled(c, [1, 2, 3, 4, 0])
    block = table.blocks[0]
    entry = c.prefix._entry_of[block]
    c.prefix._entry_of[block] = dataclasses.replace(entry, tokens=(9, 9, 9, 9))  # what a collision would look like
    assert c.prefix.match(BlockTable(), [1, 2, 3, 4, 0], limit=4) == 0


def test_freed_blocks_stay_cached_but_count_as_free_until_reused():
    c = cache(num_blocks=4)
    tokens = list(range(9))
    table = filled(c, tokens)
    c.free(table)
    assert c.num_free_blocks == 4
    revived = BlockTable()
    assert c.prefix.match(revived, tokens, limit=8) == 8
    assert c.num_free_blocks == 2
    c.free(revived)
    other = BlockTable()
    c.append(other, 16)  # takes every block: the cached ones are evicted
    assert c.prefix.num_cached_blocks == 0
    c.free(other)
    assert c.prefix.match(BlockTable(), tokens, limit=8) == 0


VOCAB = 48


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=5, vocab=VOCAB, sharpness=0.5)


def requests(seed: int):
    rng = random.Random(seed)
    system = [rng.randrange(VOCAB) for _ in range(21)]  # a shared "system prompt" of five blocks and a bit
    return [(system + [rng.randrange(VOCAB) for _ in range(rng.randint(1, 9))],
             SamplingParams(max_new_tokens=rng.randint(2, 12), ignore_eos=True)) for _ in range(12)]


@pytest.mark.parametrize("drafter,tree", [(NoDrafter, chain(0)), (lambda: NgramDrafter(n=2, k=3), chain(3))])
def test_hits_are_counted_and_change_no_output(model, drafter, tree):
    outputs = {}
    for caching in (False, True):
        engine = tiny_engine(model, drafter(), tree, block_size=BS, kv_cache_tokens=160, max_num_seqs=3,
                             enable_prefix_caching=caching)
        seqs = [engine.add_request(p, params) for p, params in requests(1)]
        run_all(engine)
        outputs[caching] = [s.output_ids for s in seqs]
        hits = sum(s.metrics.cached_prompt_tokens for s in seqs)
        if caching:
            assert hits >= 9 * 20  # all but the first wave of three reuse the system prompt's five blocks
            assert engine.runner.cache.prefix.hit_tokens == hits
        else:
            assert hits == 0
        assert engine.runner.cache.num_free_blocks == engine.runner.cache.pool.num_blocks
    assert outputs[True] == outputs[False]
