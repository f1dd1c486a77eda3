"""Prefix caching: hits are found by content, confirmed by token ids and chain position, cost no blocks, and
change no output."""

from __future__ import annotations

import builtins
import dataclasses
import random

import pytest
import torch

from specdec.config import SamplingParams
from specdec.drafters.ngram import NgramDrafter
from specdec.drafters.none import NoDrafter
from specdec.kvcache import BlockTable, PagedKVCache
from specdec.kvcache import prefix_cache
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


@pytest.fixture
def colliding_hash(monkeypatch):
    """Chain hashes that ignore the parent: every block of the same tokens collides, whatever came before it,
    which is what a real hash collision looks like to the cache. Only the parent-entry check tells them apart."""
    monkeypatch.setattr(prefix_cache, "hash", lambda key: builtins.hash(key[1]), raising=False)


P, Q, X, R = [1] * BS, [2] * BS, [5] * BS, [7] * BS


def test_a_colliding_block_after_another_parent_entry_is_not_matched(colliding_hash):
    c = cache()
    filled(c, P + X)  # X's K/V was computed after P
    filled(c, Q + [6] * BS)
    table = BlockTable()
    assert c.prefix.match(table, Q + X + [0], limit=8) == BS, "X after Q was served the K/V of X after P"
    assert len(table.blocks) == 1


def test_registering_a_colliding_block_starts_a_fresh_chain(colliding_hash):
    """Q, X, R registered after P, X: the second X collides with the first, so it must not take its entry id,
    or R (computed after Q, X) would later be served to a request for P, X, R."""
    c = cache()
    filled(c, P + X)
    filled(c, Q + X + R)
    assert c.prefix.match(BlockTable(), P + X + R + [0], limit=12) == 2 * BS


def test_truncate_forgets_the_cache_entries_of_the_blocks_it_cuts():
    c = cache()
    table = filled(c, list(range(12)))
    assert len(table.cached) == 3
    c.truncate(table, 9)
    assert len(table.cached) == 2
    c.truncate(table, 5)
    assert len(table.cached) == 1
    c.free(table)
    assert table.cached == []


def test_blocks_written_again_after_a_truncate_are_cached_again():
    """A stale `cached` list would make `register` believe the new blocks are cached already."""
    c = cache()
    table = filled(c, list(range(12)))
    c.truncate(table, 4)
    new = list(range(4)) + [40 + i for i in range(8)]
    c.append(table, 8)
    c.prefix.register(table, new)
    assert len(table.cached) == 3
    assert c.prefix.match(BlockTable(), new + [0], limit=12) == 12


def test_a_cached_block_cut_into_and_rewritten_is_no_longer_served():
    """Truncating into the middle of a cached block and appending writes new K/V over part of it; the cache
    must stop handing that block out for the old tokens."""
    c = PagedKVCache(1, 16, BS, 1, 2, prefix_caching=True)
    old = list(range(12))
    table = filled(c, old)
    c.truncate(table, 6)  # keeps block 1 half full
    slots = c.append(table, 6)
    k, v = c.layers[0]
    k.view(-1, 1, 2)[slots] = 99.0
    c.prefix.register(table, old[:6] + [50 + i for i in range(6)])
    other = BlockTable()
    hit = c.prefix.match(other, old + [0], limit=12)
    assert hit == BS, f"matched {hit} tokens of the old prefix, part of it overwritten"
    assert not torch.any(c.gather(other, 0)[0] == 99.0)


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
